package throttle

import "time"

// Counter rules (calendar periods and bucketed windows) keep one Redis hash
// per key: field = the start of a period or bucket in ms, value = the
// admissions counted there. The script learns which keys are counters from
// descriptors appended to an operation's arguments (counters).

// calendarTable is how many period boundaries a check passes for a day, week
// or month rule (minute and hour periods have a fixed length in every zone
// whose offsets change by whole hours, so a few suffice). Beyond the table
// the script extrapolates with the last period's length: a booking more
// than this many periods ahead may be placed up to a DST shift (or a
// month-length difference) off its boundary.
const (
	calendarTable      = 40
	calendarTableShort = 4
	calendarMargin     = time.Minute // the table starts this far before the host clock (Redis's clock may differ a little)
)

// PeriodStart returns the start of the calendar period of p that holds t in loc.
func PeriodStart(t time.Time, p Period, loc *time.Location) time.Time {
	t = t.In(loc)
	switch p {
	case Minute:
		return t.Truncate(time.Minute)
	case Hour:
		_, off := t.Zone()
		local := t.Unix() + int64(off)
		return time.Unix(t.Unix()-((local%3600)+3600)%3600, 0).In(loc)
	case Day:
		y, m, d := t.Date()
		return startOf(time.Date(y, m, d, 0, 0, 0, 0, loc), t)
	case Week:
		y, m, d := t.Date()
		back := (int(t.Weekday()) + 6) % 7
		return startOf(time.Date(y, m, d-back, 0, 0, 0, 0, loc), t)
	case Month:
		y, m, _ := t.Date()
		return startOf(time.Date(y, m, 1, 0, 0, 0, 0, loc), t)
	}
	return t
}

// startOf guards a zone whose midnight falls in a DST gap: time.Date then
// normalises past it, which is still the period's first instant, but never
// after t itself.
func startOf(s, t time.Time) time.Time {
	if s.After(t) {
		return t
	}
	return s
}

// NextPeriod returns the start of the period after the one that holds t.
func NextPeriod(t time.Time, p Period, loc *time.Location) time.Time {
	s := PeriodStart(t, p, loc).In(loc)
	var n time.Time
	switch p {
	case Minute:
		return s.Add(time.Minute)
	case Hour:
		n = s.Add(time.Hour)
		if ns := PeriodStart(n, p, loc); ns.After(s) {
			n = ns
		}
		return n
	case Day:
		y, m, d := s.Date()
		n = time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	case Week:
		y, m, d := s.Date()
		n = time.Date(y, m, d+7, 0, 0, 0, 0, loc)
	case Month:
		y, m, _ := s.Date()
		n = time.Date(y, m+1, 1, 0, 0, 0, 0, loc)
	}
	if !n.After(t) { // a gap that swallowed a whole period: never stand still
		n = t.Add(time.Millisecond)
	}
	return n
}

// boundaries returns the period starts of a calendar rule from the period
// that holds from on: n values in ms.
func boundaries(r Rule, from time.Time) []int64 {
	loc, err := r.Location()
	if err != nil {
		loc = time.UTC // Validate ran first; never reached
	}
	n := tableLen(r.Calendar)
	out := make([]int64, 0, n)
	t := PeriodStart(from, r.Calendar, loc)
	for range n {
		out = append(out, t.UnixMilli())
		t = NextPeriod(t, r.Calendar, loc)
	}
	return out
}

// tableLen is how many period boundaries a check passes for a calendar period.
func tableLen(p Period) int {
	if p == Minute || p == Hour {
		return calendarTableShort
	}
	return calendarTable
}

// counterArgsLen is how many values counters writes for limits, so that
// an operation's arguments are allocated once, at their size.
func counterArgsLen(limits []Limit) int {
	n := 1
	for _, lim := range limits {
		switch r := lim.Rule; {
		case r.Calendar != "":
			n += 3 + tableLen(r.Calendar)
		case r.Buckets > 0:
			n += 3
		}
	}
	return n
}

// counters writes the descriptors of limits' counter rules (the
// "counters" of scripts/limiter_counter.lua): their count, then per rule
// its 1-based index, the bucket length (a bucketed rule) or the nominal
// window (a calendar rule) in ms, and the number of period boundaries that
// follow: none for a bucketed rule, which is how the script tells the two
// apart. from gives the earliest instant the operation may look at (read
// only for a calendar rule).
func counters(e *enc, limits []Limit, from func() time.Time) {
	n := 0
	for _, lim := range limits {
		if lim.Rule.Counter() {
			n++
		}
	}
	e.arg("k", n)
	for i, lim := range limits {
		r := lim.Rule
		switch {
		case r.Calendar != "":
			b := boundaries(r, from())
			e.arg("index", i+1)
			e.arg("ms", r.Window.Milliseconds())
			e.arg("nb", len(b))
			for _, x := range b {
				e.arg("start_ms", x)
			}
		case r.Buckets > 0:
			e.arg("index", i+1)
			e.arg("ms", r.BucketLen().Milliseconds())
			e.arg("nb", 0)
		}
	}
}

// BucketLen is a bucketed rule's bucket: Window/Buckets rounded up to whole ms.
func (r Rule) BucketLen() time.Duration {
	if r.Buckets <= 0 {
		return 0
	}
	ms := r.Window.Milliseconds()
	return time.Duration((ms+int64(r.Buckets)-1)/int64(r.Buckets)) * time.Millisecond
}
