package throttle

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/scripts"
)

// MaxSeriesSteps bounds the steps of one Series read.
const MaxSeriesSteps = 1440

// Series is how one limit's window filled over a span of time, read at one
// instant of the Redis clock. The entries counted are the window's own:
// admissions (each a send) and, after Now, booked slots; members are ids,
// nothing personal.
type Series struct {
	Limit Limit
	// Now is the time it was read at: Redis TIME, the clock every decision uses.
	Now time.Time
	// Step is the length of each step; the span read is len(Counts) steps.
	Step time.Duration
	// Counts are the admissions of each step, oldest first: step i covers
	// (end−Step, end], where end = Now − (len−1−i)·Step, so the last one
	// ends at Now.
	Counts []int
	// InWindow is, at the end of each step, how many of the admissions
	// inside the window now (scored in [Now−window, Now], the boundary as
	// Allow counts it) had been made; -1 for a step that ends before the
	// window begins. Its last value is Used.
	InWindow []int
	// Used is the number of admissions inside the window now (Usage.Used).
	Used int
	// Booked is the number of slots booked after Now (Usage.Booked).
	Booked int
}

// Total is the number of admissions over the whole span.
func (s Series) Total() int {
	n := 0
	for _, c := range s.Counts {
		n += c
	}
	return n
}

// Peak is the most admissions of one step.
func (s Series) Peak() int {
	p := 0
	for _, c := range s.Counts {
		p = max(p, c)
	}
	return p
}

// Series reads how lim's window of group filled over span before now, in
// steps of step (whole milliseconds; span is rounded up to whole steps, at
// most MaxSeriesSteps): one script call, on the clock of the Redis server that
// holds the window (Options.Now replaces it, for tests and tools). It writes
// nothing.
func (l *Limiter) Series(ctx context.Context, group string, lim Limit, span, step time.Duration) (Series, error) {
	step = step.Truncate(time.Millisecond)
	if step <= 0 || span < step {
		return Series{}, fmt.Errorf("%w: series step %v must be at least 1ms and span %v at least one step", ErrInvalidRule, step, span)
	}
	n := int((span + step - 1) / step)
	if n > MaxSeriesSteps {
		return Series{}, fmt.Errorf("%w: series of %d steps; at most %d", ErrInvalidRule, n, MaxSeriesSteps)
	}
	key, err := l.Key(group, lim)
	if err != nil {
		return Series{}, err
	}
	if lim.Rule.Counter() {
		return l.counterSeries(ctx, group, key, lim, step, n)
	}
	reply, err := scripts.Series.Run(ctx, l.client, []string{key}, l.nowArg(), lim.Rule.Window.Milliseconds(), step.Milliseconds(), n).Int64Slice()
	if err != nil {
		return Series{}, fmt.Errorf("throttle: series: %w", err)
	}
	if len(reply) != 2+2*n {
		return Series{}, fmt.Errorf("throttle: series: unexpected reply of %d values, want %d", len(reply), 2+2*n)
	}
	s := Series{Limit: lim, Now: time.UnixMilli(reply[0]), Step: step, Booked: int(reply[1]),
		Counts: make([]int, n), InWindow: make([]int, n)}
	for i := range n {
		s.Counts[i] = int(reply[2+i])
		s.InWindow[i] = int(reply[2+n+i])
	}
	s.Used = max(0, s.InWindow[n-1])
	return s, nil
}

// counterSeries is Series for a calendar or bucketed rule: its hash keeps
// counts per period or bucket, so each count is placed in the step that holds
// its period's or bucket's start (a coarser picture than a log's), and
// Used and Booked are Usage's.
func (l *Limiter) counterSeries(ctx context.Context, group, key string, lim Limit, step time.Duration, n int) (Series, error) {
	us, err := l.Usage(ctx, group, 0, lim)
	if err != nil {
		return Series{}, err
	}
	fields, err := l.client.HGetAll(ctx, key).Result()
	if err != nil {
		return Series{}, fmt.Errorf("throttle: series: %w", err)
	}
	now := us[0].Now
	s := Series{Limit: lim, Now: now, Step: step, Counts: make([]int, n), InWindow: make([]int, n), Used: us[0].Used, Booked: us[0].Booked}
	first := now.Add(-time.Duration(n) * step) // exclusive start of step 0
	winStart := now.Add(-lim.Rule.Window)
	if lim.Rule.Calendar != "" {
		loc, err := lim.Rule.Location()
		if err != nil {
			return Series{}, err
		}
		winStart = PeriodStart(now, lim.Rule.Calendar, loc)
	}
	type count struct {
		at time.Time
		n  int
	}
	var cs []count
	for f, v := range fields {
		if f == "t" || f == "o" { // the total and the oldest start
			continue
		}
		ms, err1 := strconv.ParseInt(f, 10, 64)
		c, err2 := strconv.Atoi(v)
		if err1 != nil || err2 != nil {
			return Series{}, fmt.Errorf("throttle: series: %w: field %q = %q", ErrBadRecord, f, v)
		}
		cs = append(cs, count{time.UnixMilli(ms), c})
		if at := time.UnixMilli(ms); at.After(first) && !at.After(now) {
			s.Counts[min(int((at.Sub(first)-time.Millisecond)/step), n-1)] += c
		}
	}
	for i := range n {
		end := now.Add(-time.Duration(n-1-i) * step)
		if end.Before(winStart) {
			s.InWindow[i] = -1
			continue
		}
		in := 0
		for _, c := range cs {
			if !c.at.After(end) && !c.at.Add(lim.Rule.BucketLen()).Before(winStart) { // a bucket straddling the start counts
				in += c.n
			}
		}
		s.InWindow[i] = min(in, s.Used)
	}
	s.InWindow[n-1] = s.Used
	return s, nil
}
