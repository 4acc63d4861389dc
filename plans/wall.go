package plans

import (
	"math"
	"time"
)

// A wall time is a local date and clock reading, written as the number of
// seconds since 1970-01-01 00:00 on that local calendar: the Unix time the
// reading would have if the zone were UTC. An instant t whose zone offset
// is off reads wall(t) = t + off. Wall times avoid time.Date, whose answer
// for a reading that does not exist (in a spring-forward gap) or exists
// twice (after a fall-back) is unspecified.

const secondsPerDay = 24 * 60 * 60

// maxOffset bounds the UTC offset of any zone, with room to spare: tzdata's
// extremes are local mean times of about ±16 h.
const maxOffset = 26 * 60 * 60

// zone maps wall times of one location to instants.
type zone struct{ loc *time.Location }

func newZone(loc *time.Location) zone {
	if loc == nil {
		loc = time.UTC
	}
	return zone{loc}
}

// period is a stretch of instants [start, end) (Unix seconds) with one UTC
// offset (seconds).
type period struct{ start, end, off int64 }

// periods lists, in order, the periods of the zone that meet [lo, hi].
// The first starts at or before lo; an unbounded end is math.MaxInt64, an
// unbounded start math.MinInt64.
func (z zone) periods(lo, hi int64) []period {
	var out []period
	t := time.Unix(lo, 0).In(z.loc)
	for range 1000 { // a guard: 52 hours hold a handful of transitions
		_, off := t.Zone()
		s, e := t.ZoneBounds()
		p := period{start: math.MinInt64, end: math.MaxInt64, off: int64(off)}
		if !s.IsZero() {
			p.start = s.Unix()
		}
		if !e.IsZero() {
			p.end = e.Unix()
		}
		out = append(out, p)
		if p.end > hi || p.end <= t.Unix() {
			break
		}
		t = time.Unix(p.end, 0).In(z.loc)
	}
	return out
}

// day returns the local date of t as days since 1970-01-01.
func (z zone) day(t time.Time) int64 {
	_, off := t.In(z.loc).Zone()
	return floorDiv(t.Unix()+int64(off), secondsPerDay)
}

// firstReach returns the first instant at which the local clock reads w or
// later. For a reading that exists once, that is the instant it is read; in
// a spring-forward gap it is the jump past it; after a fall-back, the first
// of the two instants that read it.
func (z zone) firstReach(w int64) int64 {
	// Any instant reading w or later is at least w-maxOffset, and any
	// instant before w-maxOffset reads before w.
	for _, p := range z.periods(w-maxOffset, w+maxOffset) {
		// In p the clock reads t+p.off, rising: it reaches w at w-p.off,
		// or is past w from p's start on.
		if c := max(p.start, w-p.off); c < p.end {
			return c
		}
	}
	return w + maxOffset // unreachable: every instant after this reads after w
}

// lastReach returns the last instant at which the local clock reads w or
// earlier (its supremum, if it is not read). For a reading that exists
// once, that is the instant it is read; in a spring-forward gap, the jump
// past it; for a reading that occurs twice (fall-back, the first instant of
// the repeat included), the later of the two.
func (z zone) lastReach(w int64) int64 {
	// Instants past w+maxOffset read past w; before w-maxOffset, before w.
	last := w - maxOffset
	for _, p := range z.periods(w-maxOffset, w+maxOffset) {
		// In p the clock reads t+p.off, rising: w or earlier on
		// [p.start, w-p.off], cut off by p's end.
		if w-p.off >= p.start {
			last = max(last, min(p.end, w-p.off))
		}
	}
	return last
}

// span returns the instants from the first at which the local clock reads
// startWall or later to the last at which it reads endWall or earlier; ok
// is false if that is empty.
func (z zone) span(startWall, endWall int64) (s Span, ok bool) {
	start, end := z.firstReach(startWall), z.lastReach(endWall)
	if start >= end {
		return Span{}, false
	}
	return Span{Start: time.Unix(start, 0).UTC(), End: time.Unix(end, 0).UTC()}, true
}

// weekday returns the day of the week of a local day (days since
// 1970-01-01, a Thursday).
func weekday(day int64) time.Weekday {
	return time.Weekday((day%7 + 7 + 4) % 7)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}
