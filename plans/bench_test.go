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

// The preset's cost beside a daily span's: the state lookup and a window
// per day, for a Florida number and a toll-free one (every zone, every
// state's rule).
func BenchmarkTCPAClosed(b *testing.B) {
	from := time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC)
	daily := plans.QuietHours{Start: plans.ClockAt(21, 0), End: plans.ClockAt(8, 0)}
	tcpa := plans.QuietHours{Preset: plans.PresetTCPA}
	plans.USStates("+13055550100") // load the geocoder's data outside the timing
	for _, phone := range []string{"+13055550100", "+18005550100"} {
		zones, err := plans.Zones("", phone, time.UTC)
		if err != nil {
			b.Fatal(err)
		}
		for name, q := range map[string]plans.QuietHours{"daily": daily, "tcpa": tcpa} {
			b.Run(phone+"/"+name, func(b *testing.B) {
				for b.Loop() {
					if len(q.ClosedFor(from, 48*time.Hour, zones, phone)) == 0 {
						b.Fatal("no spans")
					}
				}
			})
		}
	}
}
