package plans_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/plans"
)

// Zones with the awkward cases: DST either way, 30-minute and 2-hour
// shifts, transitions at midnight, half- and quarter-hour offsets, the
// date line, Ramadan suspensions of DST, and a day that did not happen
// (Apia skipped 2011-12-30).
var propertyZones = []string{
	"America/New_York", "Europe/London", "Asia/Kolkata", "America/Adak", "America/Anchorage",
	"Australia/Lord_Howe", "America/Santiago", "America/Havana", "Pacific/Chatham", "Australia/Sydney",
	"Asia/Tehran", "Antarctica/Troll", "Africa/Casablanca", "UTC", "Pacific/Apia", "Pacific/Kiritimati",
	"America/St_Johns", "America/Sao_Paulo", "Asia/Kathmandu", "Europe/Dublin",
}

var interestingClocks = []plans.Clock{0, 1, 30, 59, 60, 90, 119, 120, 135, 150, 180, 1380, 1410, 1439}

// For random quiet hours, zones, start and horizon, Quiet at every minute
// agrees with membership in Closed; Closed's spans are sorted, apart and
// inside the horizon, and their edges are exact. And against the plain
// reading of the clock: an instant whose local clock reads inside the
// window in some zone is always quiet, and a quiet instant whose clock
// reads outside it in every zone lies within a few hours of a fall-back.
func TestClosedAgreesWithQuiet(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var locs []*time.Location
	for _, name := range propertyZones {
		locs = append(locs, loc(t, name))
	}
	lo, hi := at(t, "2005-01-01T00:00:00Z").Unix(), at(t, "2031-01-01T00:00:00Z").Unix()
	iterations := 80
	if testing.Short() {
		iterations = 20
	}
	for i := range iterations {
		// Quiet hours.
		var q plans.QuietHours
		for q.Start == q.End {
			q = plans.QuietHours{Start: randomClock(rng), End: randomClock(rng)}
		}
		// One to four zones.
		zones := make([]*time.Location, 1+rng.IntN(4))
		for j := range zones {
			zones[j] = locs[rng.IntN(len(locs))]
		}
		// A start anywhere, or shortly before a transition of the first
		// zone, or during Apia's lost day; to the second or the nanosecond.
		from := time.Unix(lo+rng.Int64N(hi-lo), 0)
		switch rng.IntN(4) {
		case 0, 1:
			if _, end := from.In(zones[0]).ZoneBounds(); !end.IsZero() {
				from = end.Add(-time.Duration(rng.Int64N(int64(36 * time.Hour))))
			}
		case 2:
			zones[0] = loc(t, "Pacific/Apia")
			from = at(t, "2011-12-28T00:00:00Z").Add(time.Duration(rng.Int64N(int64(72 * time.Hour))))
		}
		if rng.IntN(2) == 0 {
			from = from.Add(time.Duration(rng.Int64N(int64(time.Minute))))
		}
		horizon := time.Duration(1 + rng.Int64N(int64(72*time.Hour)))
		if rng.IntN(3) == 0 {
			horizon = horizon.Truncate(time.Minute) + time.Minute
		}
		desc := fmt.Sprintf("seed %d, case %d: %v in %v from %v for %v", seed, i, q, zones, from.UTC().Format(time.RFC3339Nano), horizon)
		checkClosed(t, desc, q, from, horizon, zones)
		if t.Failed() {
			return
		}
	}
}

func randomClock(rng *rand.Rand) plans.Clock {
	if rng.IntN(2) == 0 {
		return interestingClocks[rng.IntN(len(interestingClocks))]
	}
	return plans.Clock(rng.IntN(plans.MinutesPerDay))
}

func checkClosed(t *testing.T, desc string, q plans.QuietHours, from time.Time, horizon time.Duration, zones []*time.Location) {
	t.Helper()
	to := from.Add(horizon)
	closed := q.Closed(from, horizon, zones)
	for j, s := range closed {
		switch {
		case !s.Start.Before(s.End):
			t.Errorf("%s: empty span %v", desc, s)
		case s.Start.Before(from) || s.End.After(to):
			t.Errorf("%s: span %v outside the horizon", desc, s)
		case j > 0 && !closed[j-1].End.Before(s.Start):
			t.Errorf("%s: spans %v and %v overlap, touch or are out of order", desc, closed[j-1], s)
		}
		// Exact edges.
		if !q.Quiet(s.Start, zones) || !q.Quiet(s.End.Add(-1), zones) {
			t.Errorf("%s: span %v: not quiet at its start or its last nanosecond", desc, s)
		}
		if s.Start.After(from) && q.Quiet(s.Start.Add(-1), zones) {
			t.Errorf("%s: span %v: quiet just before it starts", desc, s)
		}
		if s.End.Before(to) && q.Quiet(s.End, zones) {
			t.Errorf("%s: span %v: quiet when it has ended", desc, s)
		}
	}
	for k := 0; ; k++ {
		tm := from.Add(time.Duration(k) * time.Minute)
		if !tm.Before(to) {
			break
		}
		got := q.Quiet(tm, zones)
		in := false
		for _, s := range closed {
			in = in || s.Contains(tm)
		}
		if got != in {
			t.Errorf("%s: at %v Quiet = %v but in Closed = %v (Closed = %v)", desc, tm.UTC(), got, in, closed)
		}
		plain := readsQuiet(q, tm, zones)
		if plain && !got {
			t.Errorf("%s: at %v the clock reads inside the window in some zone, but it is not quiet", desc, tm.UTC())
		}
		if got && !plain && !nearFallBack(tm, zones) {
			t.Errorf("%s: at %v quiet, though every clock reads outside the window and none fell back nearby", desc, tm.UTC())
		}
		if t.Failed() {
			return
		}
	}
}

// readsQuiet reports whether the local clock in some zone reads inside q.
func readsQuiet(q plans.QuietHours, tm time.Time, zones []*time.Location) bool {
	for _, z := range zones {
		h, m, _ := tm.In(z).Clock()
		c := plans.ClockAt(h, m)
		if q.Start < q.End && q.Start <= c && c < q.End || q.Start > q.End && (c >= q.Start || c < q.End) {
			return true
		}
	}
	return false
}

// nearFallBack reports whether some zone's offset drops within 3 h of tm.
func nearFallBack(tm time.Time, zones []*time.Location) bool {
	for _, z := range zones {
		_, before := tm.Add(-3 * time.Hour).In(z).Zone()
		_, after := tm.Add(3 * time.Hour).In(z).Zone()
		if before > after {
			return true
		}
	}
	return false
}
