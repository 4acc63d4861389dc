package plans_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/plans"
)

// Closed in one zone, across DST transitions, half-hour offsets and
// midnight. Expected instants are worked out by hand from the zone's
// offsets, never by time.Date (whose answer in a gap or repeat is
// unspecified: for 02:30 on 2026-03-08 in New York it gives 01:30 EST,
// which would end the first case's span before it starts).
func TestClosedOneZone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		zone    string
		quiet   string
		from    string
		horizon time.Duration
		want    []string // pairs of RFC 3339 instants
	}{
		// New York, spring forward on 2026-03-08: 02:00 EST (07:00Z) → 03:00 EDT.
		{
			name: "NY spring: end in the gap ends at the jump", zone: "America/New_York", quiet: "01:30-02:30",
			from: "2026-03-07T00:00:00Z", horizon: 72 * time.Hour,
			want: []string{
				"2026-03-07T06:30:00Z", "2026-03-07T07:30:00Z", // Sat 01:30–02:30 EST
				"2026-03-08T06:30:00Z", "2026-03-08T07:00:00Z", // Sun 01:30 EST – the jump to 03:00 EDT: 30 min
				"2026-03-09T05:30:00Z", "2026-03-09T06:30:00Z", // Mon 01:30–02:30 EDT
			},
		},
		{
			name: "NY spring: start in the gap starts at the jump", zone: "America/New_York", quiet: "02:15-06:00",
			from: "2026-03-07T00:00:00Z", horizon: 72 * time.Hour,
			want: []string{
				"2026-03-07T07:15:00Z", "2026-03-07T11:00:00Z", // Sat 02:15–06:00 EST
				"2026-03-08T07:00:00Z", "2026-03-08T10:00:00Z", // Sun 03:00 EDT (the jump) – 06:00 EDT
				"2026-03-09T06:15:00Z", "2026-03-09T10:00:00Z", // Mon 02:15–06:00 EDT
			},
		},
		{
			name: "NY spring: a window wholly in the gap does not occur", zone: "America/New_York", quiet: "02:00-03:00",
			from: "2026-03-07T00:00:00Z", horizon: 72 * time.Hour,
			want: []string{
				"2026-03-07T07:00:00Z", "2026-03-07T08:00:00Z",
				"2026-03-09T06:00:00Z", "2026-03-09T07:00:00Z",
			},
		},
		{
			name: "NY spring: overnight window is an hour short", zone: "America/New_York", quiet: "21:00-08:00",
			from: "2026-03-07T17:00:00Z", horizon: 48 * time.Hour,
			want: []string{
				"2026-03-08T02:00:00Z", "2026-03-08T12:00:00Z", // Sat 21:00 EST – Sun 08:00 EDT: 10 h
				"2026-03-09T01:00:00Z", "2026-03-09T12:00:00Z", // Sun 21:00 EDT – Mon 08:00 EDT: 11 h
			},
		},
		// New York, fall back on 2026-11-01: 02:00 EDT (06:00Z) → 01:00 EST.
		{
			name: "NY fall: start repeated → first, end after the repeat", zone: "America/New_York", quiet: "01:30-02:30",
			from: "2026-10-31T00:00:00Z", horizon: 72 * time.Hour,
			want: []string{
				"2026-10-31T05:30:00Z", "2026-10-31T06:30:00Z", // Sat 01:30–02:30 EDT
				"2026-11-01T05:30:00Z", "2026-11-01T07:30:00Z", // Sun first 01:30 (EDT) – 02:30 EST: 2 h
				"2026-11-02T06:30:00Z", "2026-11-02T07:30:00Z", // Mon 01:30–02:30 EST
			},
		},
		{
			name: "NY fall: end repeated → its last occurrence", zone: "America/New_York", quiet: "00:30-01:30",
			from: "2026-11-01T00:00:00Z", horizon: 24 * time.Hour,
			want: []string{
				"2026-11-01T04:30:00Z", "2026-11-01T06:30:00Z", // 00:30 EDT – second 01:30 (EST): 2 h
			},
		},
		{
			name: "NY fall: window inside the repeated hour", zone: "America/New_York", quiet: "01:15-01:45",
			from: "2026-11-01T00:00:00Z", horizon: 24 * time.Hour,
			want: []string{
				"2026-11-01T05:15:00Z", "2026-11-01T06:45:00Z", // first 01:15 (EDT) – second 01:45 (EST)
			},
		},
		{
			name: "NY fall: end at the repeated instant 01:00", zone: "America/New_York", quiet: "23:00-01:00",
			from: "2026-10-31T12:00:00Z", horizon: 24 * time.Hour,
			want: []string{
				"2026-11-01T03:00:00Z", "2026-11-01T06:00:00Z", // Sat 23:00 EDT – 01:00 EST (the second 01:00)
			},
		},
		{
			name: "NY fall: start in the gap-free part after the repeat", zone: "America/New_York", quiet: "02:15-06:00",
			from: "2026-11-01T00:00:00Z", horizon: 24 * time.Hour,
			want: []string{"2026-11-01T07:15:00Z", "2026-11-01T11:00:00Z"},
		},
		{
			name: "NY fall: overnight window is an hour longer", zone: "America/New_York", quiet: "21:00-08:00",
			from: "2026-10-31T12:00:00Z", horizon: 48 * time.Hour,
			want: []string{
				// Fri 21:00 – Sat 08:00 EDT ends exactly at from: nothing left.
				"2026-11-01T01:00:00Z", "2026-11-01T13:00:00Z", // Sat 21:00 EDT – Sun 08:00 EST: 12 h
				"2026-11-02T02:00:00Z", "2026-11-02T12:00:00Z", // Sun 21:00 EST – clipped at the horizon
			},
		},
		// London: 2026-03-29 01:00 GMT → 02:00 BST (01:00Z); 2026-10-25 02:00 BST → 01:00 GMT (01:00Z).
		{
			name: "London spring: overnight window", zone: "Europe/London", quiet: "23:00-07:00",
			from: "2026-03-28T12:00:00Z", horizon: 48 * time.Hour,
			want: []string{
				"2026-03-28T23:00:00Z", "2026-03-29T06:00:00Z", // Sat 23:00 GMT – Sun 07:00 BST: 7 h
				"2026-03-29T22:00:00Z", "2026-03-30T06:00:00Z", // Sun 23:00 BST – Mon 07:00 BST
			},
		},
		{
			name: "London spring: end in the gap", zone: "Europe/London", quiet: "00:30-01:30",
			from: "2026-03-29T00:00:00Z", horizon: 24 * time.Hour,
			want: []string{
				"2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z", // 00:30 GMT – the jump to 02:00 BST
				"2026-03-29T23:30:00Z", "2026-03-30T00:00:00Z", // Mon 00:30 BST, clipped at the horizon
			},
		},
		{
			name: "London spring: start in the gap", zone: "Europe/London", quiet: "01:30-07:00",
			from: "2026-03-29T00:00:00Z", horizon: 24 * time.Hour,
			want: []string{"2026-03-29T01:00:00Z", "2026-03-29T06:00:00Z"},
		},
		{
			name: "London fall: overnight window", zone: "Europe/London", quiet: "23:00-07:00",
			from: "2026-10-24T12:00:00Z", horizon: 48 * time.Hour,
			want: []string{
				"2026-10-24T22:00:00Z", "2026-10-25T07:00:00Z", // Sat 23:00 BST – Sun 07:00 GMT: 9 h
				"2026-10-25T23:00:00Z", "2026-10-26T07:00:00Z",
			},
		},
		{
			name: "London fall: crossing midnight, end repeated", zone: "Europe/London", quiet: "22:00-01:30",
			from: "2026-10-24T12:00:00Z", horizon: 24 * time.Hour,
			want: []string{"2026-10-24T21:00:00Z", "2026-10-25T01:30:00Z"}, // 22:00 BST – second 01:30 (GMT)
		},
		{
			name: "London fall: start repeated", zone: "Europe/London", quiet: "01:00-01:30",
			from: "2026-10-25T00:00:00Z", horizon: 24 * time.Hour,
			want: []string{"2026-10-25T00:00:00Z", "2026-10-25T01:30:00Z"}, // first 01:00 (BST) – second 01:30
		},
		// Kolkata, +05:30 all year.
		{
			name: "Kolkata overnight", zone: "Asia/Kolkata", quiet: "21:00-08:00",
			from: "2026-01-15T00:00:00Z", horizon: 48 * time.Hour,
			want: []string{
				"2026-01-15T00:00:00Z", "2026-01-15T02:30:00Z", // clipped at from: 05:30 IST
				"2026-01-15T15:30:00Z", "2026-01-16T02:30:00Z",
				"2026-01-16T15:30:00Z", "2026-01-17T00:00:00Z", // clipped at the horizon
			},
		},
		{
			name: "Kolkata midday", zone: "Asia/Kolkata", quiet: "12:00-13:00",
			from: "2026-01-15T00:00:00Z", horizon: 48 * time.Hour,
			want: []string{
				"2026-01-15T06:30:00Z", "2026-01-15T07:30:00Z",
				"2026-01-16T06:30:00Z", "2026-01-16T07:30:00Z",
			},
		},
		// Not crossing midnight, on an ordinary week in New York (EDT, −4).
		{
			name: "NY midday", zone: "America/New_York", quiet: "12:00-13:00",
			from: "2026-06-10T16:30:00Z", horizon: 48 * time.Hour,
			want: []string{
				"2026-06-10T16:30:00Z", "2026-06-10T17:00:00Z", // from is inside: 12:30 EDT
				"2026-06-11T16:00:00Z", "2026-06-11T17:00:00Z",
				"2026-06-12T16:00:00Z", "2026-06-12T16:30:00Z", // clipped at the horizon
			},
		},
		{
			name: "end 24:00 is midnight", zone: "UTC", quiet: "22:00-24:00",
			from: "2026-06-10T00:00:00Z", horizon: 48 * time.Hour,
			want: []string{
				"2026-06-10T22:00:00Z", "2026-06-11T00:00:00Z",
				"2026-06-11T22:00:00Z", "2026-06-12T00:00:00Z",
			},
		},
		{
			name: "a minute short of all day merges nothing", zone: "UTC", quiet: "00:00-23:59",
			from: "2026-06-10T00:00:00Z", horizon: 48 * time.Hour,
			want: []string{
				"2026-06-10T00:00:00Z", "2026-06-10T23:59:00Z",
				"2026-06-11T00:00:00Z", "2026-06-11T23:59:00Z",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			want := spans(t, tc.want...)
			zones := []*time.Location{loc(t, tc.zone)}
			got := quiet(t, tc.quiet).Closed(at(t, tc.from), tc.horizon, zones)
			if !equalSpans(got, want) {
				t.Fatalf("Closed(%s, %s, %v) in %s\n got %v\nwant %v", tc.quiet, tc.from, tc.horizon, tc.zone, got, want)
			}
			for _, s := range got {
				if s.Start.Location() != time.UTC || s.End.Location() != time.UTC {
					t.Errorf("span %v is not in UTC", s)
				}
			}
		})
	}
}

// Quiet at single instants around the same transitions, second-exact.
func TestQuietAt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		zone, quiet, at string
		want            bool
		why             string
	}{
		{"America/New_York", "01:30-02:30", "2026-03-08T06:29:59Z", false, "01:29:59 EST"},
		{"America/New_York", "01:30-02:30", "2026-03-08T06:30:00Z", true, "01:30 EST"},
		{"America/New_York", "01:30-02:30", "2026-03-08T06:59:59Z", true, "01:59:59 EST, just before the jump"},
		{"America/New_York", "01:30-02:30", "2026-03-08T07:00:00Z", false, "03:00 EDT: 02:30 was jumped over"},
		{"America/New_York", "02:15-06:00", "2026-03-08T06:59:59Z", false, "01:59:59 EST, before the jump"},
		{"America/New_York", "02:15-06:00", "2026-03-08T07:00:00Z", true, "03:00 EDT: 02:15 was jumped over"},
		{"America/New_York", "02:15-06:00", "2026-03-08T09:59:59Z", true, "05:59:59 EDT"},
		{"America/New_York", "02:15-06:00", "2026-03-08T10:00:00Z", false, "06:00 EDT"},
		{"America/New_York", "02:00-03:00", "2026-03-08T06:59:59Z", false, "01:59:59 EST"},
		{"America/New_York", "02:00-03:00", "2026-03-08T07:00:00Z", false, "03:00 EDT: the whole window was jumped over"},
		{"America/New_York", "01:30-02:30", "2026-11-01T05:29:59Z", false, "01:29:59 EDT"},
		{"America/New_York", "01:30-02:30", "2026-11-01T05:30:00Z", true, "first 01:30 (EDT)"},
		{"America/New_York", "01:30-02:30", "2026-11-01T06:00:00Z", true, "01:00 EST: read before the window, but 02:30 has not come"},
		{"America/New_York", "01:30-02:30", "2026-11-01T06:15:00Z", true, "01:15 EST: likewise"},
		{"America/New_York", "01:30-02:30", "2026-11-01T07:29:59Z", true, "02:29:59 EST"},
		{"America/New_York", "01:30-02:30", "2026-11-01T07:30:00Z", false, "02:30 EST"},
		{"America/New_York", "00:30-01:30", "2026-11-01T05:45:00Z", true, "01:45 EDT: past 01:30, but 01:30 comes again"},
		{"America/New_York", "00:30-01:30", "2026-11-01T06:29:59Z", true, "01:29:59 EST"},
		{"America/New_York", "00:30-01:30", "2026-11-01T06:30:00Z", false, "second 01:30 (EST)"},
		{"America/New_York", "23:00-01:00", "2026-11-01T05:00:00Z", true, "first 01:00 (EDT): the second is to come"},
		{"America/New_York", "23:00-01:00", "2026-11-01T05:59:59Z", true, "01:59:59 EDT"},
		{"America/New_York", "23:00-01:00", "2026-11-01T06:00:00Z", false, "second 01:00 (EST)"},
		{"America/New_York", "21:00-08:00", "2026-11-01T12:59:59Z", true, "07:59:59 EST"},
		{"America/New_York", "21:00-08:00", "2026-11-01T13:00:00Z", false, "08:00 EST"},
		{"America/New_York", "21:00-08:00", "2026-11-01T00:59:59Z", false, "Sat 20:59:59 EDT"},
		{"America/New_York", "21:00-08:00", "2026-11-01T01:00:00Z", true, "Sat 21:00 EDT"},
		{"Europe/London", "00:30-01:30", "2026-03-29T00:59:59Z", true, "00:59:59 GMT"},
		{"Europe/London", "00:30-01:30", "2026-03-29T01:00:00Z", false, "02:00 BST"},
		{"Europe/London", "01:00-01:30", "2026-10-25T01:15:00Z", true, "01:15 GMT, second time round"},
		{"Europe/London", "01:00-01:30", "2026-10-25T00:45:00Z", true, "01:45 BST"},
		{"Europe/London", "01:00-01:30", "2026-10-25T01:30:00Z", false, "second 01:30 (GMT)"},
		{"Asia/Kolkata", "21:00-08:00", "2026-01-15T15:29:59Z", false, "20:59:59 IST"},
		{"Asia/Kolkata", "21:00-08:00", "2026-01-15T15:30:00Z", true, "21:00 IST"},
		{"Asia/Kolkata", "21:00-08:00", "2026-01-16T02:29:59Z", true, "07:59:59 IST"},
		{"Asia/Kolkata", "21:00-08:00", "2026-01-16T02:30:00Z", false, "08:00 IST"},
		{"Asia/Kolkata", "12:00-13:00", "2026-01-16T06:30:00Z", true, "12:00 IST"},
		{"Asia/Kolkata", "12:00-13:00", "2026-01-16T07:30:00Z", false, "13:00 IST"},
	} {
		q := quiet(t, tc.quiet)
		tm := at(t, tc.at)
		zones := []*time.Location{loc(t, tc.zone)}
		if got := q.Quiet(tm, zones); got != tc.want {
			t.Errorf("%s in %s at %s (%s): Quiet = %v, want %v", tc.quiet, tc.zone, tc.at, tc.why, got, tc.want)
		}
		// Closed agrees, over a horizon that starts at the instant.
		closed := q.Closed(tm, time.Second, zones)
		if got := len(closed) == 1 && closed[0].Start.Equal(tm); got != tc.want {
			t.Errorf("%s in %s at %s (%s): Closed over the next second = %v, want quiet %v", tc.quiet, tc.zone, tc.at, tc.why, closed, tc.want)
		}
	}
}

func TestClosedDegenerate(t *testing.T) {
	t.Parallel()
	from := at(t, "2026-06-10T00:00:00Z")
	utc := []*time.Location{time.UTC}
	night := quiet(t, "21:00-08:00")
	for _, tc := range []struct {
		name    string
		q       plans.QuietHours
		horizon time.Duration
		zones   []*time.Location
	}{
		{"zero QuietHours", plans.QuietHours{}, 48 * time.Hour, utc},
		{"out-of-range QuietHours", plans.QuietHours{Start: 21 * 60, End: 2000}, 48 * time.Hour, utc},
		{"zero horizon", night, 0, utc},
		{"negative horizon", night, -time.Hour, utc},
		{"no zones", night, 48 * time.Hour, nil},
	} {
		if got := tc.q.Closed(from, tc.horizon, tc.zones); got != nil {
			t.Errorf("%s: Closed = %v, want nil", tc.name, got)
		}
		if tc.horizon > 0 && tc.q.Quiet(from.Add(time.Hour), tc.zones) {
			t.Errorf("%s: Quiet at 01:00 UTC, want not", tc.name)
		}
	}
	// A nil zone stands for UTC.
	want := spans(t, "2026-06-10T00:00:00Z", "2026-06-10T08:00:00Z")
	if got := night.Closed(from, 12*time.Hour, []*time.Location{nil}); !equalSpans(got, want) {
		t.Errorf("nil zone: Closed = %v, want %v", got, want)
	}
	if !night.Quiet(from, []*time.Location{nil}) {
		t.Errorf("nil zone: not quiet at 00:00 UTC")
	}
}

// Sub-second and monotonic parts of from are kept where from clips a span,
// and the result is in UTC without a monotonic reading.
func TestClosedFromPrecision(t *testing.T) {
	t.Parallel()
	from := time.Now()
	if from.Round(0) == from {
		t.Fatal("time.Now has no monotonic reading here; the test needs one")
	}
	q := plans.QuietHours{Start: 0, End: 1439}
	got := q.Closed(from, time.Hour, []*time.Location{from.Location()})
	if len(got) == 0 {
		// The last minute of a local day is open; move on a minute.
		from = from.Add(2 * time.Minute)
		got = q.Closed(from, time.Hour, []*time.Location{from.Location()})
	}
	if len(got) == 0 || !got[0].Start.Equal(from) {
		t.Fatalf("Closed(%v) = %v, want a span from %v", from, got, from)
	}
	if got[0].Start != got[0].Start.Round(0) || got[0].Start.Location() != time.UTC {
		t.Errorf("span start %#v keeps a monotonic reading or is not UTC", got[0].Start)
	}
	if got[0].Start.Nanosecond() != from.Nanosecond() {
		t.Errorf("span start %v lost from's nanoseconds %d", got[0].Start, from.Nanosecond())
	}
}

// Spans of different zones that touch are merged.
func TestClosedMergesTouching(t *testing.T) {
	t.Parallel()
	plus1 := time.FixedZone("+01", 3600)
	q := quiet(t, "00:00-01:00")
	// UTC: [00:00Z, 01:00Z); +01: [23:00Z, 00:00Z) the day before — touching.
	got := q.Closed(at(t, "2026-06-10T12:00:00Z"), 24*time.Hour, []*time.Location{time.UTC, plus1})
	want := spans(t, "2026-06-10T23:00:00Z", "2026-06-11T01:00:00Z")
	if !equalSpans(got, want) {
		t.Fatalf("Closed = %v, want %v", got, want)
	}
	// The same zone twice changes nothing.
	got = q.Closed(at(t, "2026-06-10T12:00:00Z"), 24*time.Hour, []*time.Location{time.UTC, time.UTC})
	want = spans(t, "2026-06-11T00:00:00Z", "2026-06-11T01:00:00Z")
	if !equalSpans(got, want) {
		t.Fatalf("Closed = %v, want %v", got, want)
	}
}
