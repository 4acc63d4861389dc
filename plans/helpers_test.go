package plans_test

import (
	"testing"
	"time"
	_ "time/tzdata" // the tests' zone rules do not depend on the machine's zoneinfo

	"github.com/sluicehq/sluice/plans"
)

func loc(t testing.TB, name string) *time.Location {
	t.Helper()
	l, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("LoadLocation(%q): %v", name, err)
	}
	return l
}

// at parses an RFC 3339 instant.
func at(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatalf("time.Parse(%q): %v", s, err)
	}
	return v
}

func quiet(t testing.TB, s string) plans.QuietHours {
	t.Helper()
	q, err := plans.ParseQuietHours(s)
	if err != nil {
		t.Fatalf("ParseQuietHours(%q): %v", s, err)
	}
	return q
}

// spans builds the expected spans from pairs of RFC 3339 instants.
func spans(t testing.TB, pairs ...string) []plans.Span {
	t.Helper()
	if len(pairs)%2 != 0 {
		t.Fatalf("spans: odd number of instants %v", pairs)
	}
	var out []plans.Span
	for i := 0; i < len(pairs); i += 2 {
		out = append(out, plans.Span{Start: at(t, pairs[i]), End: at(t, pairs[i+1])})
	}
	return out
}

func equalSpans(a, b []plans.Span) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Start.Equal(b[i].Start) || !a[i].End.Equal(b[i].End) {
			return false
		}
	}
	return true
}
