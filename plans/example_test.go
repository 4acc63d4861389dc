package plans_test

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/plans"
)

// Quiet hours over the night New York springs forward: the night of
// 2026-03-07 is an hour short, and the spans are instants the limiter can
// keep sends out of.
func ExampleQuietHours_Closed() {
	q, err := plans.ParseQuietHours("21:00-08:00")
	if err != nil {
		fmt.Println(err)
		return
	}
	zones, err := plans.Zones("", "+1 212 555 0100", time.UTC)
	if err != nil {
		fmt.Println(err)
		return
	}
	ny := zones[0]
	from := time.Date(2026, 3, 7, 12, 0, 0, 0, ny)
	for _, s := range q.Closed(from, 48*time.Hour, zones) {
		fmt.Printf("%s to %s (%v)\n", s.Start.In(ny).Format("Mon 15:04 MST"), s.End.In(ny).Format("Mon 15:04 MST"), s.End.Sub(s.Start))
	}
	fmt.Println(q, "quiet at 07:30 on Sunday:", q.Quiet(time.Date(2026, 3, 8, 7, 30, 0, 0, ny), zones))
	// Output:
	// Sat 21:00 EST to Sun 08:00 EDT (10h0m0s)
	// Sun 21:00 EDT to Mon 08:00 EDT (11h0m0s)
	// 21:00-08:00 quiet at 07:30 on Sunday: true
}

// A number in Alaska may be in either of two zones; quiet hours hold in both.
func ExampleZones() {
	zones, err := plans.Zones("", "+19075550100", time.UTC)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(zones)
	q := plans.QuietHours{Start: plans.ClockAt(21, 0), End: plans.ClockAt(8, 0)}
	for _, s := range q.Closed(time.Date(2026, 1, 15, 18, 0, 0, 0, time.UTC), 24*time.Hour, zones) {
		fmt.Println(s)
	}
	// Output:
	// [America/Adak America/Anchorage]
	// 2026-01-16T06:00:00Z–2026-01-16T18:00:00Z
}
