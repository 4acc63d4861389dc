package plans_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nyaruka/phonenumbers"

	"github.com/sluicehq/sluice/plans"
)

func names(zones []*time.Location) []string {
	var out []string
	for _, z := range zones {
		out = append(out, z.String())
	}
	return out
}

// nanp is every zone phonenumbers v1.8.1 gives for a +1 number it knows
// only by its country code (toll-free 800, 888, …).
var nanp = []string{
	"America/Adak", "America/Anchorage", "America/Anguilla", "America/Antigua", "America/Barbados",
	"America/Boise", "America/Cayman", "America/Chicago", "America/Denver", "America/Dominica",
	"America/Edmonton", "America/Fort_Nelson", "America/Grand_Turk", "America/Grenada", "America/Halifax",
	"America/Jamaica", "America/Juneau", "America/Los_Angeles", "America/Lower_Princes", "America/Montserrat",
	"America/Nassau", "America/New_York", "America/North_Dakota/Center", "America/Phoenix", "America/Port_of_Spain",
	"America/Puerto_Rico", "America/Regina", "America/Santo_Domingo", "America/St_Johns", "America/St_Kitts",
	"America/St_Lucia", "America/St_Thomas", "America/St_Vincent", "America/Toronto", "America/Tortola",
	"America/Vancouver", "America/Winnipeg", "Atlantic/Bermuda", "Pacific/Guam", "Pacific/Honolulu",
	"Pacific/Pago_Pago", "Pacific/Saipan",
}

func TestZones(t *testing.T) {
	t.Parallel()
	fallback := time.FixedZone("tenant", 2*3600)
	for _, tc := range []struct {
		name, tz, phone string
		want            []string // zone names; "tenant" is the fallback
	}{
		{"tz wins", "Europe/Berlin", "+12125550100", []string{"Europe/Berlin"}},
		{"tz trimmed", "  Asia/Kolkata ", "", []string{"Asia/Kolkata"}},
		{"tz UTC", "UTC", "", []string{"UTC"}},
		{"New York number", "", "+12125550100", []string{"America/New_York"}},
		{"formatted number", " ", "+1 (212) 555-0100", []string{"America/New_York"}},
		{"London number", "", "+442079460958", []string{"Europe/London"}},
		{"Indian mobile", "", "+919876543210", []string{"Asia/Calcutta"}},
		{"Alaska: two zones", "", "+19075550100", []string{"America/Adak", "America/Anchorage"}},
		{"Russian toll-free: three zones", "", "+78001000000", []string{"Asia/Almaty", "Asia/Aqtobe", "Europe/Moscow"}},
		{"US toll-free: every NANP zone", "", "+18005550100", nanp},
		{"international freephone: Etc/Unknown", "", "+80012345678", []string{"tenant"}},
		{"Inmarsat: Etc/Unknown", "", "+870773111632", []string{"tenant"}},
		{"no country code", "", "2125550100", []string{"tenant"}},
		{"unknown country code", "", "+99912345", []string{"tenant"}},
		{"not a number", "", "call me maybe", []string{"tenant"}},
		{"plus alone", "", "+", []string{"tenant"}},
		{"no number", "", "", []string{"tenant"}},
		{"email address", "", "ana@example.com", []string{"tenant"}},
	} {
		got, err := plans.Zones(tc.tz, tc.phone, fallback)
		if err != nil {
			t.Errorf("%s: Zones(%q, %q): %v", tc.name, tc.tz, tc.phone, err)
			continue
		}
		if !slices.Equal(names(got), tc.want) {
			t.Errorf("%s: Zones(%q, %q) = %v, want %v", tc.name, tc.tz, tc.phone, names(got), tc.want)
		}
		if slices.Equal(tc.want, []string{"tenant"}) && (len(got) != 1 || got[0] != fallback) {
			t.Errorf("%s: Zones(%q, %q) = %v, want the fallback itself", tc.name, tc.tz, tc.phone, got)
		}
	}
}

func TestZonesErrors(t *testing.T) {
	t.Parallel()
	fallback := time.UTC
	for _, tc := range []struct {
		tz, phone string
		fallback  *time.Location
		want      error
		mention   string
	}{
		{"Mars/Olympus_Mons", "+12125550100", fallback, plans.ErrBadZone, `"Mars/Olympus_Mons"`},
		{"America/New York", "", fallback, plans.ErrBadZone, `"America/New York"`},
		{"Local", "", fallback, plans.ErrBadZone, `"Local"`},
		{"../../etc/passwd", "", fallback, plans.ErrBadZone, `"../../etc/passwd"`},
		{"/usr/share/zoneinfo/UTC", "", fallback, plans.ErrBadZone, "zoneinfo"},
		{strings.Repeat("America/", 100), "", fallback, plans.ErrBadZone, "800 bytes"},
		{"", "", nil, plans.ErrNoZone, "no fallback"},
		{"", "+80012345678", nil, plans.ErrNoZone, "no fallback"},
	} {
		got, err := plans.Zones(tc.tz, tc.phone, tc.fallback)
		if !errors.Is(err, tc.want) || !strings.Contains(fmtErr(err), tc.mention) {
			t.Errorf("Zones(%q, %q) = %v, %v; want an error wrapping %v mentioning %q", tc.tz, tc.phone, names(got), err, tc.want, tc.mention)
		}
		if got != nil {
			t.Errorf("Zones(%q, %q) returned zones %v with an error", tc.tz, tc.phone, names(got))
		}
	}
	// A nil fallback is fine when it is not needed.
	if got, err := plans.Zones("", "+12125550100", nil); err != nil || !slices.Equal(names(got), []string{"America/New_York"}) {
		t.Errorf("Zones with nil fallback and a known number = %v, %v", names(got), err)
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Every zone name phonenumbers gives for any region's example numbers loads
// here, so Zones never quietly drops a zone and falls back instead.
func TestZonesEveryRegion(t *testing.T) {
	t.Parallel()
	fallback := time.FixedZone("fallback", 0)
	checked := 0
	for region := range phonenumbers.GetSupportedRegions() {
		for _, typ := range []phonenumbers.PhoneNumberType{phonenumbers.FIXED_LINE, phonenumbers.MOBILE, phonenumbers.TOLL_FREE} {
			ex := phonenumbers.GetExampleNumberForType(region, typ)
			if ex == nil {
				continue
			}
			e164 := phonenumbers.Format(ex, phonenumbers.E164)
			want, err := phonenumbers.GetTimezonesForNumber(ex)
			if err != nil || slices.Contains(want, phonenumbers.UNKNOWN_TIMEZONE) {
				continue
			}
			got, err := plans.Zones("", e164, fallback)
			if err != nil {
				t.Fatalf("Zones(%s): %v", e164, err)
			}
			if !slices.Equal(names(got), dedupe(want)) {
				t.Errorf("%s %v: Zones = %v, phonenumbers gives %v", region, e164, names(got), want)
			}
			checked++
		}
	}
	if checked < 400 {
		t.Fatalf("checked only %d example numbers", checked)
	}
}

func dedupe(s []string) []string {
	var out []string
	for _, v := range s {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// Several candidate zones: quiet if quiet in any.
func TestClosedSeveralZones(t *testing.T) {
	t.Parallel()
	q := quiet(t, "21:00-08:00")

	// +1 907 (Alaska): Adak (HST −10) and Anchorage (AKST −9) in January.
	alaska, err := plans.Zones("", "+19075550100", time.UTC)
	if err != nil || !slices.Equal(names(alaska), []string{"America/Adak", "America/Anchorage"}) {
		t.Fatalf("Zones(+19075550100) = %v, %v", names(alaska), err)
	}
	from := at(t, "2026-01-15T18:00:00Z")
	got := q.Closed(from, 24*time.Hour, alaska)
	// Anchorage 21:00–08:00 is 06:00Z–17:00Z, Adak 07:00Z–18:00Z: the union.
	want := spans(t, "2026-01-16T06:00:00Z", "2026-01-16T18:00:00Z")
	if !equalSpans(got, want) {
		t.Errorf("Alaska: Closed = %v, want %v", got, want)
	}
	for _, tc := range []struct {
		at   string
		want bool
	}{
		{"2026-01-16T05:59:59Z", false}, // Anchorage 20:59:59, Adak 19:59:59
		{"2026-01-16T06:00:00Z", true},  // Anchorage 21:00 only
		{"2026-01-16T17:30:00Z", true},  // Adak 07:30 only; Anchorage 08:30 is open
		{"2026-01-16T18:00:00Z", false}, // Adak 08:00
	} {
		if got := q.Quiet(at(t, tc.at), alaska); got != tc.want {
			t.Errorf("Alaska at %s: Quiet = %v, want %v", tc.at, got, tc.want)
		}
		// Each zone alone is quiet at fewer instants than the union.
		var any bool
		for _, z := range alaska {
			any = any || q.Quiet(at(t, tc.at), []*time.Location{z})
		}
		if any != tc.want {
			t.Errorf("Alaska at %s: quiet in some zone = %v, union = %v", tc.at, any, tc.want)
		}
	}

	// A US toll-free number: 42 zones from Pago Pago (−11) to Guam (+10)
	// leave 22:00Z (Guam's 08:00) to 00:30Z (St John's 21:00, −03:30) open in winter.
	tollFree, err := plans.Zones("", "+18005550100", time.UTC)
	if err != nil || len(tollFree) != len(nanp) {
		t.Fatalf("Zones(+18005550100) = %v, %v", names(tollFree), err)
	}
	got = q.Closed(at(t, "2026-01-15T12:00:00Z"), 48*time.Hour, tollFree)
	want = spans(t,
		"2026-01-15T12:00:00Z", "2026-01-15T22:00:00Z",
		"2026-01-16T00:30:00Z", "2026-01-16T22:00:00Z",
		"2026-01-17T00:30:00Z", "2026-01-17T12:00:00Z",
	)
	if !equalSpans(got, want) {
		t.Errorf("toll-free in winter: Closed = %v, want %v", got, want)
	}
	// In July St John's is −02:30 (NDT): 23:30Z–22:00Z closed, 1.5 h open.
	got = q.Closed(at(t, "2026-07-15T12:00:00Z"), 24*time.Hour, tollFree)
	want = spans(t,
		"2026-07-15T12:00:00Z", "2026-07-15T22:00:00Z",
		"2026-07-15T23:30:00Z", "2026-07-16T12:00:00Z",
	)
	if !equalSpans(got, want) {
		t.Errorf("toll-free in summer: Closed = %v, want %v", got, want)
	}
}

func FuzzZones(f *testing.F) {
	for _, s := range [][2]string{{"", "+19075550100"}, {"America/New_York", ""}, {"", "+800 1234 5678"},
		{"", "+1 800 FLOWERS"}, {"Local", ""}, {"", "++1"}, {"", "+٣٣١٢٣٤٥٦٧٨٩"}, {"../x", ""}, {"", "+1 907 555 0100 ext. 12"}} {
		f.Add(s[0], s[1])
	}
	fallback := time.FixedZone("fallback", 0)
	f.Fuzz(func(t *testing.T, tz, phone string) {
		zones, err := plans.Zones(tz, phone, fallback)
		if err != nil {
			if !errors.Is(err, plans.ErrBadZone) || strings.TrimSpace(tz) == "" {
				t.Fatalf("Zones(%q, %q): unexpected error %v", tz, phone, err)
			}
			return
		}
		if len(zones) == 0 || slices.Contains(zones, nil) {
			t.Fatalf("Zones(%q, %q) = %v", tz, phone, zones)
		}
	})
}
