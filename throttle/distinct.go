package throttle

// distinctArgsLen is how many values distinct writes for limits.
func distinctArgsLen(limits []Limit) int {
	n := 1
	for _, lim := range limits {
		if lim.Rule.Distinct {
			n += 2
		}
	}
	return n
}

// distinct writes the descriptors of limits' distinct-count rules (the
// "distinct" of scripts/limiter_distinct.lua): their count, then per rule
// its 1-based index and the keyed hash of the subject it counts ("" when
// the limit names none: a read). subject keys a subject (Limiter.Subject).
func distinct(e *enc, limits []Limit, subject func(string) string) {
	n := 0
	for _, lim := range limits {
		if lim.Rule.Distinct {
			n++
		}
	}
	e.arg("k", n)
	for i, lim := range limits {
		if !lim.Rule.Distinct {
			continue
		}
		e.arg("index", i+1)
		s := ""
		if lim.Distinct != "" {
			s = subject(lim.Distinct)
		}
		e.arg("subject", s)
	}
}
