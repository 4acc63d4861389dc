package plans_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nyaruka/phonenumbers"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

var tcpa = plans.QuietHours{Preset: plans.PresetTCPA}

// zonesOf is what the worker passes: the number's zones (no payload tz).
func zonesOf(t testing.TB, phone string) []*time.Location {
	t.Helper()
	zones, err := plans.Zones("", phone, nil)
	if err != nil {
		t.Fatalf("Zones(%q): %v", phone, err)
	}
	return zones
}

// local is a reading of the clock in a zone, away from any DST gap or
// repeat (time.Date is only trusted there).
func local(t testing.TB, zone, reading string) time.Time {
	t.Helper()
	v, err := time.ParseInLocation("2006-01-02 15:04", reading, loc(t, zone))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The cases: Florida 20:30 is quiet, California 20:30 is not, Texas
// Sunday 11:00 is quiet, and an unknown state takes the strictest rule —
// in winter and in summer time, so the offset cannot hide an error.
func TestTCPAIssueCases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, phone, zone, reading string
		quiet                      bool
	}{
		{"Florida 20:30 EDT", "+13055550100", "America/New_York", "2026-07-15 20:30", true},
		{"Florida 20:30 EST", "+13055550100", "America/New_York", "2026-01-14 20:30", true},
		{"Florida 19:59 EDT", "+13055550100", "America/New_York", "2026-07-15 19:59", false},
		{"Florida 08:00 EST", "+13055550100", "America/New_York", "2026-01-14 08:00", false},
		{"Florida 07:59 EST", "+13055550100", "America/New_York", "2026-01-14 07:59", true},
		{"California 20:30 PDT", "+14155550100", "America/Los_Angeles", "2026-07-15 20:30", false},
		{"California 20:30 PST", "+14155550100", "America/Los_Angeles", "2026-01-14 20:30", false},
		{"California 21:00 PDT", "+14155550100", "America/Los_Angeles", "2026-07-15 21:00", true},
		{"California 07:59 PST", "+14155550100", "America/Los_Angeles", "2026-01-14 07:59", true},
		{"Texas Sunday 11:00 CDT", "+15125550100", "America/Chicago", "2026-07-19 11:00", true},
		{"Texas Sunday 11:00 CST", "+15125550100", "America/Chicago", "2026-01-18 11:00", true},
		{"Texas Sunday 11:59 CST", "+15125550100", "America/Chicago", "2026-01-18 11:59", true},
		{"Texas Sunday 12:00 CST", "+15125550100", "America/Chicago", "2026-01-18 12:00", false},
		{"Texas Saturday 11:00", "+15125550100", "America/Chicago", "2026-07-18 11:00", false},
		{"Texas Saturday 08:30", "+15125550100", "America/Chicago", "2026-07-18 08:30", true},
		{"Texas Monday 20:30", "+15125550100", "America/Chicago", "2026-07-20 20:30", false},
		{"El Paso Sunday 11:30 MDT", "+19155550100", "America/Denver", "2026-07-19 11:30", true},
		{"El Paso Sunday 12:30 MDT", "+19155550100", "America/Denver", "2026-07-19 12:30", false},
		// Toll-free: no state, every NANP zone. 17:00 UTC on a Sunday in
		// January is 12:00 in New York but 11:00 in Chicago: quiet under
		// Texas's Sunday rule.
		{"toll-free Sunday", "+18005550100", "UTC", "2026-01-18 17:00", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			at := local(t, tc.zone, tc.reading)
			if got := tcpa.QuietFor(at, zonesOf(t, tc.phone), tc.phone); got != tc.quiet {
				t.Fatalf("QuietFor(%s %s, %s) = %v, want %v", tc.reading, tc.zone, tc.phone, got, tc.quiet)
			}
		})
	}
}

// Unknown state, one zone: the strictest of every rule — 09:00–20:00
// Monday to Saturday (Connecticut's morning, Florida's evening), 12:00–20:00
// on Sunday (Texas's) — where a known federal-only state keeps 08:00–21:00.
func TestTCPAUnknownStateTakesTheStrictest(t *testing.T) {
	t.Parallel()
	chicago := []*time.Location{loc(t, "America/Chicago")}
	for _, tc := range []struct {
		reading          string
		unknown, federal bool // quiet for an unknown state; for Illinois (federal only)
	}{
		{"2026-07-15 08:30", true, false}, // Wednesday
		{"2026-07-15 09:00", false, false},
		{"2026-07-15 19:59", false, false},
		{"2026-07-15 20:00", true, false},
		{"2026-07-15 20:59", true, false},
		{"2026-07-15 21:00", true, true},
		{"2026-07-19 11:59", true, false}, // Sunday
		{"2026-07-19 12:00", false, false},
		{"2026-07-19 20:30", true, false},
		{"2026-07-18 09:30", false, false}, // Saturday
	} {
		at := local(t, "America/Chicago", tc.reading)
		for _, phone := range []string{"", "+14165550100" /* Toronto: not a US state */, "+15555550100" /* not a number */} {
			if got := tcpa.QuietFor(at, chicago, phone); got != tc.unknown {
				t.Errorf("unknown state %q at %s: quiet %v, want %v", phone, tc.reading, got, tc.unknown)
			}
		}
		if got := tcpa.Quiet(at, chicago); got != tc.unknown {
			t.Errorf("Quiet (no phone) at %s: %v, want %v", tc.reading, got, tc.unknown)
		}
		if got := tcpa.QuietFor(at, chicago, "+13125550100"); got != tc.federal {
			t.Errorf("Illinois at %s: quiet %v, want %v", tc.reading, got, tc.federal)
		}
	}
}

// Every state with a rule of its own, at the edges of its window, in winter
// and summer time; and one federal-only state beside each.
func TestTCPAPerState(t *testing.T) {
	t.Parallel()
	type edge struct {
		weekday    time.Weekday
		open, shut string // the window's first and first-closed minute
	}
	wk := func(open, shut string) []edge {
		return []edge{{time.Wednesday, open, shut}, {time.Saturday, open, shut}, {time.Sunday, open, shut}}
	}
	for _, tc := range []struct {
		state, phone, zone string
		edges              []edge
	}{
		{"FL", "+13055550100", "America/New_York", wk("08:00", "20:00")},
		{"OK", "+14055550100", "America/Chicago", wk("08:00", "20:00")},
		{"MD", "+14105550100", "America/New_York", wk("08:00", "20:00")},
		{"MS", "+16015550100", "America/Chicago", wk("08:00", "20:00")},
		{"NJ", "+12015550100", "America/New_York", wk("08:00", "20:00")},
		{"CT", "+12035550100", "America/New_York", wk("09:00", "20:00")},
		{"TX", "+12145550100", "America/Chicago", []edge{
			{time.Wednesday, "09:00", "21:00"}, {time.Saturday, "09:00", "21:00"}, {time.Sunday, "12:00", "21:00"}}},
		{"NY", "+12125550100", "America/New_York", wk("08:00", "21:00")},
		{"CA", "+14155550100", "America/Los_Angeles", wk("08:00", "21:00")},
		{"PR", "+17875550100", "America/Puerto_Rico", wk("08:00", "21:00")},
		{"DC", "+12025550100", "America/New_York", wk("08:00", "21:00")},
	} {
		t.Run(tc.state, func(t *testing.T) {
			t.Parallel()
			if got := plans.USStates(tc.phone); !slices.Equal(got, []string{tc.state}) {
				t.Fatalf("USStates(%s) = %v, want [%s]", tc.phone, got, tc.state)
			}
			zones := zonesOf(t, tc.phone)
			for _, week := range []string{"2026-01-12", "2026-07-13"} { // Mondays, winter and summer time
				monday, _ := time.Parse("2006-01-02", week)
				for _, e := range tc.edges {
					day := monday.AddDate(0, 0, (int(e.weekday)+6)%7).Format("2006-01-02")
					open := local(t, tc.zone, day+" "+e.open)
					shut := local(t, tc.zone, day+" "+e.shut)
					for _, c := range []struct {
						t     time.Time
						quiet bool
					}{
						{open.Add(-time.Minute), true}, {open, false}, {shut.Add(-time.Minute), false}, {shut, true},
					} {
						if got := tcpa.QuietFor(c.t, zones, tc.phone); got != c.quiet {
							t.Errorf("%s %s %s: quiet %v, want %v", tc.state, c.t.In(loc(t, tc.zone)).Format("Mon 2006-01-02 15:04 MST"), tc.phone, got, c.quiet)
						}
					}
				}
			}
		})
	}
}

// Spans over the weekends the clock jumps, worked out by hand from the
// offsets.
func TestTCPAClosedAcrossDST(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, phone, from string
		horizon           time.Duration
		want              []string
	}{
		{
			// New York springs forward on Sunday 2026-03-08 at 02:00 EST.
			name: "Miami spring forward", phone: "+13055550100", from: "2026-03-07T17:00:00Z", horizon: 48 * time.Hour,
			want: []string{
				"2026-03-08T01:00:00Z", "2026-03-08T12:00:00Z", // Sat 20:00 EST – Sun 08:00 EDT: 11 h
				"2026-03-09T00:00:00Z", "2026-03-09T12:00:00Z", // Sun 20:00 EDT – Mon 08:00 EDT
			},
		},
		{
			// Chicago falls back on Sunday 2026-11-01 at 02:00 CDT.
			name: "Dallas fall back on a Sunday", phone: "+12145550100", from: "2026-10-31T12:00:00Z", horizon: 48 * time.Hour,
			want: []string{
				"2026-10-31T12:00:00Z", "2026-10-31T14:00:00Z", // from the horizon's start, Sat 07:00 CDT – 09:00
				"2026-11-01T02:00:00Z", "2026-11-01T18:00:00Z", // Sat 21:00 CDT – Sun 12:00 CST: 16 h
				"2026-11-02T03:00:00Z", "2026-11-02T12:00:00Z", // Sun 21:00 CST – clipped at the horizon
			},
		},
		{
			// Pensacola's 850 spans Eastern and Central: 20:00 EST to 08:00 CST.
			name: "Florida panhandle in two zones", phone: "+18505550100", from: "2026-01-14T12:00:00Z", horizon: 24 * time.Hour,
			want: []string{
				"2026-01-14T12:00:00Z", "2026-01-14T14:00:00Z", // from the horizon's start, Wed 06:00 CST – 08:00 CST
				"2026-01-15T01:00:00Z", "2026-01-15T12:00:00Z", // Wed 20:00 EST – Thu 08:00 CST (09:00 EST)
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tcpa.ClosedFor(at(t, tc.from), tc.horizon, zonesOf(t, tc.phone), tc.phone)
			if want := spans(t, tc.want...); !equalSpans(got, want) {
				t.Fatalf("ClosedFor = %v, want %v", got, want)
			}
		})
	}
}

// Texas's rule holds from 1 September 2025: the Sunday before, 11:00 is
// open (the federal window); the night into that Monday already ends at
// 09:00.
func TestTCPATexasFromSeptember2025(t *testing.T) {
	t.Parallel()
	phone := "+15125550100"
	zones := zonesOf(t, phone)
	for _, c := range []struct {
		reading string
		quiet   bool
	}{
		{"2025-08-31 11:00", false}, // Sunday, before the law
		{"2025-08-31 08:30", false},
		{"2025-09-01 08:30", true}, // Monday, Labor Day, the first day
		{"2025-09-06 08:30", true},
		{"2025-09-07 11:00", true}, // the first Sunday under it
		{"2025-09-07 12:00", false},
	} {
		if got := tcpa.QuietFor(local(t, "America/Chicago", c.reading), zones, phone); got != c.quiet {
			t.Errorf("Austin %s: quiet %v, want %v", c.reading, got, c.quiet)
		}
	}
}

// USStates: a state from the geocoder's name or "City, ST", the area
// code's state beside it, territories, and nil where unknown.
func TestUSStates(t *testing.T) {
	t.Parallel()
	for phone, want := range map[string][]string{
		"+13055550100":      {"FL"},
		"+1 (415) 555-0100": {"CA"}, // "San Francisco, CA"
		"+12065550100":      {"WA"}, // "Washington State"
		"+12025550100":      {"DC"},
		"+12016310100":      {"NY", "NJ"}, // geocoded "New York, NY", a New Jersey area code
		"+17875550100":      {"PR"},
		"+16715550100":      {"GU"},
		"+18005550100":      nil, // toll-free
		"+14165550100":      nil, // Toronto
		"+447911123456":     nil,
		"4155550100":        nil, // not international form
		"":                  nil,
		"+1":                nil,
		"not a number":      nil,
	} {
		if got := plans.USStates(phone); !slices.Equal(got, want) {
			t.Errorf("USStates(%q) = %v, want %v", phone, got, want)
		}
	}
	// An ambiguous number takes both states' rules: 20:30 is quiet under
	// New Jersey's though New York allows it.
	phone := "+12016310100"
	if !tcpa.QuietFor(local(t, "America/New_York", "2026-07-15 20:30"), zonesOf(t, phone), phone) {
		t.Error("an ambiguous NY/NJ number is open at 20:30")
	}
}

// The area-code table against phonenumbers' data: every area code whose
// numbers the geocoder puts in a state with a rule of its own is in the
// table, under that state — so a new overlay code, or a changed data set,
// fails here rather than silently falling to the federal window.
func TestStrictAreaCodesMatchTheGeocoder(t *testing.T) {
	t.Parallel()
	strict := map[string]bool{"FL": true, "OK": true, "MD": true, "MS": true, "NJ": true, "CT": true, "TX": true}
	seen := map[string]map[string]int{}
	for npa := 200; npa <= 999; npa++ {
		for nxx := 201; nxx <= 999; nxx += 23 {
			phone := fmt.Sprintf("+1%d%d0100", npa, nxx)
			n, err := phonenumbers.Parse(phone, "")
			if err != nil || phonenumbers.GetRegionCodeForNumber(n) != "US" {
				continue
			}
			for _, st := range plans.USStates(phone) {
				if strict[st] {
					if seen[st] == nil {
						seen[st] = map[string]int{}
					}
					seen[st][fmt.Sprint(npa)]++
				}
			}
		}
	}
	want := map[string][]string{}
	for npa, st := range plans.StrictAreaCodes {
		want[st] = append(want[st], npa)
	}
	for st := range strict {
		var got []string
		for npa := range seen[st] {
			got = append(got, npa)
		}
		slices.Sort(got)
		slices.Sort(want[st])
		if !slices.Equal(got, want[st]) {
			t.Errorf("%s: the geocoder's area codes are %v, the table's %v (update strictAreaCodes in tcpa.go)", st, got, want[st])
		}
	}
}

// What parses prints back; a preset is a name in any case; email cannot
// have one.
func TestParsePresets(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"tcpa", " TCPA ", "Tcpa"} {
		q, err := plans.ParseQuietHours(in)
		if err != nil || q != tcpa || q.String() != "tcpa" {
			t.Errorf("ParseQuietHours(%q) = %#v, %v", in, q, err)
		}
	}
	for in, mention := range map[string]string{"tcpb": "not a preset", "t": "not a preset", "tcpa-8": "not a preset", "x21:00-08:00": "not a preset"} {
		if _, err := plans.ParseQuietHours(in); !errors.Is(err, plans.ErrBadQuietHours) || !strings.Contains(err.Error(), mention) {
			t.Errorf("ParseQuietHours(%q): %v, want %q", in, err, mention)
		}
	}
	for _, q := range []plans.QuietHours{{Preset: "nope"}, {Preset: plans.PresetTCPA, Start: 1}, {Preset: plans.PresetTCPA, End: 60}} {
		if err := q.Validate(); !errors.Is(err, plans.ErrBadQuietHours) {
			t.Errorf("Validate(%#v) = %v", q, err)
		}
		if got := q.ClosedFor(at(t, "2026-01-01T00:00:00Z"), 24*time.Hour, []*time.Location{time.UTC}, ""); got != nil {
			t.Errorf("invalid %#v: Closed = %v", q, got)
		}
	}
	var viaText plans.QuietHours
	if text, err := tcpa.MarshalText(); err != nil || string(text) != "tcpa" || viaText.UnmarshalText(text) != nil || viaText != tcpa {
		t.Errorf("text round trip: %q %v → %#v", text, err, viaText)
	}

	p := mustParse(t, "sms.marketing:quiet=tcpa, acme/sms:quiet=21-8")
	if got := p.String(); got != "sms.marketing:quiet=tcpa,acme/sms:quiet=21:00-08:00" {
		t.Errorf("String = %q", got)
	}
	if m := p.Match("acme", tasks.SMS, "marketing"); m.Quiet == nil || *m.Quiet != tcpa {
		t.Errorf("acme marketing: %+v", m.Quiet)
	}
	if m := p.Match("acme", tasks.SMS, ""); m.Quiet == nil || m.Quiet.Preset != "" {
		t.Errorf("acme default: %+v", m.Quiet)
	}
	if _, err := plans.Parse("email.news:quiet=tcpa"); !errors.Is(err, plans.ErrBadRules) || !strings.Contains(err.Error(), "for sms") {
		t.Errorf("email preset: %v", err)
	}
}

// For random numbers, instants and horizons, QuietFor agrees with
// membership in ClosedFor's spans, which are sorted, apart and inside the
// horizon; and a preset is never more open than the federal window read
// in the same zones.
func TestTCPAClosedAgreesWithQuiet(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0x7c9a))
	phones := []string{"+13055550100", "+18505550100", "+12145550100", "+19155550100", "+12035550100", "+14155550100",
		"+12016310100", "+17875550100", "+19075550100", "+18005550100", "+14165550100", ""}
	federal := quiet(t, "21:00-08:00")
	lo, hi := at(t, "2024-01-01T00:00:00Z").Unix(), at(t, "2031-01-01T00:00:00Z").Unix()
	for range 40 {
		phone := phones[rng.IntN(len(phones))]
		zones := []*time.Location{loc(t, "America/Chicago")}
		if phone != "" {
			zones = zonesOf(t, phone)
		}
		from := time.Unix(lo+rng.Int64N(hi-lo), 0)
		horizon := time.Duration(1+rng.IntN(72)) * time.Hour
		got := tcpa.ClosedFor(from, horizon, zones, phone)
		for i, s := range got {
			if !s.Start.Before(s.End) || s.Start.Before(from) || s.End.After(from.Add(horizon)) || i > 0 && !got[i-1].End.Before(s.Start) {
				t.Fatalf("seed %d %s from %v: bad spans %v", seed, phone, from, got)
			}
		}
		for m := time.Duration(0); m < horizon; m += 7 * time.Minute {
			t0 := from.Add(m)
			in := slices.ContainsFunc(got, func(s plans.Span) bool { return s.Contains(t0) })
			if q := tcpa.QuietFor(t0, zones, phone); q != in {
				t.Fatalf("seed %d %s at %v: QuietFor %v, in ClosedFor %v", seed, phone, t0, q, in)
			}
			if federal.Quiet(t0, zones) && !in {
				t.Fatalf("seed %d %s at %v: open under the preset, quiet under the federal window", seed, phone, t0)
			}
		}
	}
}

func FuzzUSStates(f *testing.F) {
	for _, s := range []string{"+13055550100", "+12016310100", "+18005550100", "+1", "+", "+1 (850) 555-0100", "+447911123456",
		"+1 800 FLOWERS", "+٣٣١٢٣٤٥٦٧٨٩", "+1 907 555 0100 ext. 12", "\xff"} {
		f.Add(s)
	}
	codes := map[string]bool{"PR": true, "GU": true, "VI": true, "AS": true, "MP": true, "DC": true}
	for _, c := range strings.Fields("AL AK AZ AR CA CO CT DE FL GA HI ID IL IN IA KS KY LA ME MD MA MI MN MS MO MT NE NV NH NJ NM NY NC ND OH OK OR PA RI SC SD TN TX UT VT VA WA WV WI WY") {
		codes[c] = true
	}
	chicago := time.FixedZone("CST", -6*3600)
	f.Fuzz(func(t *testing.T, phone string) {
		states := plans.USStates(phone)
		if len(states) > 2 {
			t.Fatalf("USStates(%q) = %v", phone, states)
		}
		for _, st := range states {
			if !codes[st] {
				t.Fatalf("USStates(%q) = %v: %q is no US state or territory", phone, states, st)
			}
		}
		from := time.Date(2026, 1, 14, 12, 0, 0, 0, time.UTC)
		if len(tcpa.ClosedFor(from, 48*time.Hour, []*time.Location{chicago}, phone)) == 0 {
			t.Fatalf("no quiet spans for %q", phone)
		}
	})
}

// The planner — what the worker and the quota report check with — reads
// the recipient's state from the SMS's number: at 20:30 local a Florida
// number is closed (20:00 there), a California one is not (federal 21:00).
func TestPlannerReadsTheStateFromTheNumber(t *testing.T) {
	t.Parallel()
	p, err := plans.Parse("sms.marketing:quiet=tcpa")
	if err != nil {
		t.Fatal(err)
	}
	pr := plans.Planner{DefaultZone: time.UTC}
	closed := func(n tasks.Notification, at time.Time) bool {
		t.Helper()
		for _, iv := range pr.Check(p, n, "", at).Closed {
			if !at.Before(iv.Start) && at.Before(iv.End) {
				return true
			}
		}
		return false
	}
	sms := func(to string) tasks.Notification {
		n := tasks.NewSMS("acme", to, "sale")
		n.Category = "marketing"
		return n
	}
	if at := local(t, "America/New_York", "2026-01-15 20:30"); !closed(sms("+13055550100"), at) {
		t.Error("Florida at 20:30 is not closed")
	}
	if at := local(t, "America/Los_Angeles", "2026-01-15 20:30"); closed(sms("+14155550100"), at) {
		t.Error("California at 20:30 is closed: the planner took the strictest state, not the number's")
	}
}
