package plans_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/plans"
)

// What the worker pays per message: the zones of a number and two days of
// spans, for one zone and for the 42 of a toll-free number.
func BenchmarkZonesAndClosed(b *testing.B) {
	q := plans.QuietHours{Start: plans.ClockAt(21, 0), End: plans.ClockAt(8, 0)}
	from := time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC)
	for _, phone := range []string{"+12125550100", "+18005550100"} {
		b.Run(phone, func(b *testing.B) {
			for b.Loop() {
				zones, err := plans.Zones("", phone, time.UTC)
				if err != nil {
					b.Fatal(err)
				}
				if len(q.Closed(from, 48*time.Hour, zones)) == 0 {
					b.Fatal("no spans")
				}
			}
		})
	}
}
