package throttle_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

func mustLoad(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// Calendar days are the zone's: 23 hours on the spring change, 25 on the
// autumn one, in New York and London.
func TestCalendarDaysAcrossDST(t *testing.T) {
	cases := []struct {
		zone       string
		at         string // an instant of the day, UTC
		start, end string // the day's bounds, UTC
		hours      int
	}{
		{"America/New_York", "2026-03-08T12:00:00Z", "2026-03-08T05:00:00Z", "2026-03-09T04:00:00Z", 23},
		{"America/New_York", "2026-11-01T12:00:00Z", "2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z", 25},
		{"America/New_York", "2026-07-04T03:59:59Z", "2026-07-03T04:00:00Z", "2026-07-04T04:00:00Z", 24},
		{"Europe/London", "2026-03-29T12:00:00Z", "2026-03-29T00:00:00Z", "2026-03-29T23:00:00Z", 23},
		{"Europe/London", "2026-10-25T12:00:00Z", "2026-10-24T23:00:00Z", "2026-10-26T00:00:00Z", 25},
		{"Europe/London", "2026-10-24T23:00:00Z", "2026-10-24T23:00:00Z", "2026-10-26T00:00:00Z", 25},
	}
	for _, c := range cases {
		loc := mustLoad(t, c.zone)
		s := throttle.PeriodStart(utc(c.at), throttle.Day, loc)
		e := throttle.NextPeriod(utc(c.at), throttle.Day, loc)
		if !s.Equal(utc(c.start)) || !e.Equal(utc(c.end)) || e.Sub(s) != time.Duration(c.hours)*time.Hour {
			t.Errorf("%s %s: day %s–%s (%v), want %s–%s (%d h)", c.zone, c.at, s.UTC(), e.UTC(), e.Sub(s), c.start, c.end, c.hours)
		}
	}
	// New York's repeated hour 01:00–02:00 on 2026-11-01 is two periods of one hour.
	ny := mustLoad(t, "America/New_York")
	first := utc("2026-11-01T05:30:00Z")  // 01:30 EDT
	second := utc("2026-11-01T06:30:00Z") // 01:30 EST
	if a, b := throttle.PeriodStart(first, throttle.Hour, ny), throttle.PeriodStart(second, throttle.Hour, ny); !a.Equal(utc("2026-11-01T05:00:00Z")) || !b.Equal(utc("2026-11-01T06:00:00Z")) {
		t.Errorf("repeated hour: %s and %s", a.UTC(), b.UTC())
	}
	// Weeks start on Monday, months on the 1st, local time.
	if w := throttle.PeriodStart(utc("2026-03-12T12:00:00Z"), throttle.Week, ny); !w.Equal(utc("2026-03-09T04:00:00Z")) {
		t.Errorf("week from %s", w.UTC())
	}
	if m := throttle.NextPeriod(utc("2026-10-15T12:00:00Z"), throttle.Month, mustLoad(t, "Europe/London")); !m.Equal(utc("2026-11-01T00:00:00Z")) {
		t.Errorf("next month %s", m.UTC())
	}
}

// A full calendar day books the first slot after the zone's midnight — on a
// 23-hour day in New York and a 25-hour one in London — and Usage reads the
// period's counter.
func TestCalendarRuleBooksNextDay(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	cases := []struct {
		zone, now, next string
	}{
		{"America/New_York", "2026-03-08T20:00:00Z", "2026-03-09T04:00:00Z"},
		{"Europe/London", "2026-10-25T20:00:00Z", "2026-10-26T00:00:00Z"},
		{"America/Los_Angeles", "2026-06-01T06:59:00Z", "2026-06-01T07:00:00Z"},
	}
	for i, c := range cases {
		b.clock.Set(utc(c.now))
		lim := throttle.Limit{Scope: "sms:sender", Subject: fmt.Sprint("+1415555010", i), Rule: throttle.PerCalendar(2, throttle.Day, c.zone)}
		o := throttle.ReserveOptions{Book: true}
		for j := range 2 {
			d, err := b.lim.Reserve(ctx, b.group, fmt.Sprintf("d%d-%d", i, j), o, lim)
			if err != nil || d.Status != throttle.StatusAdmitted {
				t.Fatalf("%s: send %d: %v %v", c.zone, j, d.Status, err)
			}
		}
		d, err := b.lim.Reserve(ctx, b.group, fmt.Sprintf("d%d-2", i), o, lim)
		if err != nil || d.Status != throttle.StatusBooked || !d.At.Equal(utc(c.next)) || d.DeniedBy != 0 {
			t.Fatalf("%s: third send: %v at %s (by %d), %v; want booked at %s", c.zone, d.Status, d.At.UTC(), d.DeniedBy, err, c.next)
		}
		us, err := b.lim.Usage(ctx, b.group, 0, lim)
		if err != nil {
			t.Fatal(err)
		}
		if u := us[0]; u.Used != 2 || u.Booked != 1 || u.Remaining != 0 || !u.NextFree.Equal(utc(c.next)) {
			t.Fatalf("%s: usage %+v", c.zone, u)
		}
		// Released, the booking gives its count back to the next day.
		if n, err := b.lim.Release(ctx, b.group, fmt.Sprintf("d%d-2", i), 1, lim); err != nil || n != 1 {
			t.Fatalf("release: %d, %v", n, err)
		}
		if us, _ := b.lim.Usage(ctx, b.group, 0, lim); us[0].Booked != 0 {
			t.Fatalf("%s: after release %+v", c.zone, us[0])
		}
		// Past midnight the day's counter starts afresh.
		b.clock.Set(utc(c.next))
		if d, err := b.lim.Reserve(ctx, b.group, fmt.Sprintf("d%d-3", i), o, lim); err != nil || d.Status != throttle.StatusAdmitted {
			t.Fatalf("%s: after midnight: %v, %v", c.zone, d.Status, err)
		}
	}
}

// Counter rules keep counts, not members: Allow refuses them, and a
// counter key holds a hash of at most one field per period or bucket.
func TestCounterRuleShapes(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	cal := throttle.Limit{Scope: "sms:sender", Rule: throttle.PerCalendar(500, throttle.Hour, "Europe/London")}
	if _, err := b.lim.Allow(ctx, b.group, "m1", cal); !errors.Is(err, throttle.ErrInvalidRule) {
		t.Fatalf("Allow with a calendar rule: %v", err)
	}
	bk := throttle.Limit{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 1000, Window: time.Minute, Buckets: 10}}
	for i := range 300 {
		if _, err := b.lim.Reserve(ctx, b.group, fmt.Sprint("m", i), throttle.ReserveOptions{}, cal, bk); err != nil {
			t.Fatal(err)
		}
		b.clock.Add(time.Second)
	}
	// At most the buckets a span can touch (11), the 3 gone ones a trim
	// waits for (limiter_counter.lua's TRIM_LAG 4, less the one it drops at once),
	// the total and the oldest start.
	if k := b.key(t, bk); b.client.Type(ctx, k).Val() != "hash" || b.client.HLen(ctx, k).Val() > 17 {
		t.Fatalf("bucketed key %s: %s of %d fields", k, b.client.Type(ctx, k).Val(), b.client.HLen(ctx, k).Val())
	}
	if k := b.key(t, cal); b.client.HLen(ctx, k).Val() > 3 { // the hour's count, the total, the oldest start
		t.Fatalf("calendar key holds %d fields", b.client.HLen(ctx, k).Val())
	}
}

func TestParseCounterRules(t *testing.T) {
	good := map[string]throttle.Rule{
		"2000/1d@America/Los_Angeles": throttle.PerCalendar(2000, throttle.Day, "America/Los_Angeles"),
		"5/1w":                        throttle.PerCalendar(5, throttle.Week, ""),
		"5/mo@UTC":                    throttle.PerCalendar(5, throttle.Month, ""),
		"10000/1h~60":                 {Limit: 10000, Window: time.Hour, Buckets: 60},
		"10/1s~":                      {Limit: 10, Window: time.Second, Buckets: throttle.DefaultBuckets},
	}
	for s, want := range good {
		r, err := throttle.ParseRule(s)
		if err != nil || r != want {
			t.Errorf("ParseRule(%q) = %+v, %v; want %+v", s, r, err, want)
		}
	}
	for _, s := range []string{"1/2d@UTC", "1/1d@Nowhere/Else", "1/1d@Local", "1/1s~1", "1/1m~x", "1/1d@UTC~5", "1/3ms~5"} {
		if _, err := throttle.ParseRule(s); !errors.Is(err, throttle.ErrInvalidRule) {
			t.Errorf("ParseRule(%q): %v, want ErrInvalidRule", s, err)
		}
	}
}

// A full calendar or bucketed drop rule drops; the dashboard's series reads a
// counter key's counts.
func TestCounterDropAndSeries(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.clock.Set(utc("2026-03-08T20:00:00Z"))
	for _, rule := range []throttle.Rule{throttle.PerCalendar(3, throttle.Day, "America/New_York"), {Limit: 3, Window: time.Hour, Buckets: 6}} {
		lim := throttle.Limit{Scope: "sms:tenant", Rule: rule, Drop: true}
		for i := range 4 {
			d, err := b.lim.Reserve(ctx, b.group, fmt.Sprintf("%s-%d", rule, i), throttle.ReserveOptions{Book: true}, lim)
			want := throttle.StatusAdmitted
			if i == 3 {
				want = throttle.StatusDropped
			}
			if err != nil || d.Status != want {
				t.Fatalf("%s send %d: %v, %v; want %v", rule, i, d.Status, err, want)
			}
			b.clock.Add(time.Minute)
		}
		s, err := b.lim.Series(ctx, b.group, lim, time.Hour, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		total := 3
		if rule.Calendar != "" {
			total = 0 // a period's count sits at its start: midnight, before this hour
		}
		if s.Total() != total || s.Used != 3 || s.InWindow[len(s.InWindow)-1] != 3 {
			t.Fatalf("%s: series total %d used %d counts %v in %v", rule, s.Total(), s.Used, s.Counts, s.InWindow)
		}
	}
}
