package worker

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// TestSlotByNeverEarly places slots whose decisions were taken anywhere
// in a round trip, including at its very end (Redis busy until just
// before it replies): the placed slot is never before the true one, and
// never after it by more than the round trip.
func TestSlotByNeverEarly(t *testing.T) {
	asked := time.Date(2026, 12, 3, 14, 35, 22, 0, time.UTC)
	for _, rtt := range []time.Duration{0, 100 * time.Microsecond, 3 * time.Millisecond, 900 * time.Millisecond} {
		for _, frac := range []float64{0, 0.25, 0.5, 0.99, 1} {
			decided := asked.Add(time.Duration(frac * float64(rtt)))
			// A slot ahead of the decision, and one already 40 ms past
			// when it was taken (handed back again after a lost reply).
			for _, ahead := range []time.Duration{2*time.Second + 175*time.Millisecond, -40 * time.Millisecond} {
				truth := decided.Add(ahead)
				d := throttle.Decision{Status: throttle.StatusAdmitted, Now: decided, At: truth, Wait: max(ahead, 0)}
				got := slotBy(asked.Add(rtt), d)
				if got.Before(truth) || got.Sub(truth) > rtt {
					t.Errorf("rtt %v, decided at %.2f of it, slot %v from the decision: placed at %v, true slot %v", rtt, frac, ahead, got, truth)
				}
			}
		}
	}
}
