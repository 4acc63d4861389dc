package throttle

import (
	"testing"
	"time"
)

// counterArgsLen must give exactly what counterArgs appends: the operations
// size their arguments by it, and a short count costs every check a second
// allocation of them (a bucketed check grew its arguments twice, about 1 KB).
func TestCounterArgsLen(t *testing.T) {
	from := time.Date(2026, 3, 8, 1, 0, 0, 0, time.UTC)
	rules := []Rule{
		{Limit: 5, Window: time.Minute},
		{Limit: 1000, Window: time.Second, Buckets: 60},
		PerCalendar(10, Minute, "UTC"),
		PerCalendar(10, Hour, "Europe/London"),
		PerCalendar(2000, Day, "America/Los_Angeles"),
		PerCalendar(50, Week, "America/New_York"),
		PerCalendar(900, Month, "UTC"),
	}
	// Every subset of the rules, in order: none, one, several, all.
	for mask := 0; mask < 1<<len(rules); mask++ {
		var limits []Limit
		for i, r := range rules {
			if mask&(1<<i) != 0 {
				limits = append(limits, Limit{Scope: "sms:sender", Subject: "s", Rule: r})
			}
		}
		got := len(counterArgs(nil, limits, func() time.Time { return from }))
		if want := counterArgsLen(limits); got != want {
			t.Fatalf("limits %v: counterArgs appended %d values, counterArgsLen says %d", limits, got, want)
		}
	}
}
