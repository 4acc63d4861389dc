package sluicetest

import (
	"slices"
	"time"
)

// EarliestFit is the first instant at or after from at which a sliding
// log holding slots takes one more send under limit per span, as the
// limiter decides it (scripts/limiter_log.lua): no span of span (the
// rule's window plus the send slack) that contains the instant holds limit
// slots. A run of limit slots within span blocks [its last − span, its
// first + span]; the instant moves past each block that holds it, to the
// block's end + 1 ms. Slots count in whole milliseconds, as Redis keeps
// them. Brute force, for the handful of slots an audit reads.
func EarliestFit(slots []time.Time, limit int, span time.Duration, from time.Time) time.Time {
	ms := make([]int64, len(slots))
	for i, s := range slots {
		ms[i] = s.UnixMilli()
	}
	slices.Sort(ms)
	w, t := span.Milliseconds(), from.UnixMilli()
	for moved := true; moved; {
		moved = false
		for i := 0; i+limit-1 < len(ms); i++ {
			first, last := ms[i], ms[i+limit-1]
			if last-first <= w && t >= last-w && t <= first+w {
				t, moved = first+w+1, true
			}
		}
	}
	if t == from.UnixMilli() {
		return from
	}
	return time.UnixMilli(t)
}
