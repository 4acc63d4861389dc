package throttle_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/throttle"
)

// The bucketed rule's under-admission, measured against the exact log in the
// same run: under a demand that always exceeds the limit, no window of the
// exact length holds more than the limit (never more than the log), and
// over six windows it admits at least B/(B+1) of what the log admits (it
// behaves at worst as a log one bucket longer; the model test checks that
// bound slot by slot).
func TestBucketedUnderAdmissionBound(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, true)
	for _, c := range []struct {
		rule  throttle.Rule
		every time.Duration
	}{
		{throttle.Rule{Limit: 600, Window: time.Minute, Buckets: 60}, 50 * time.Millisecond},
		{throttle.Rule{Limit: 100, Window: 10 * time.Second, Buckets: 10}, 25 * time.Millisecond},
		{throttle.Rule{Limit: 50, Window: 10 * time.Second, Buckets: 4}, 50 * time.Millisecond},
	} {
		log := c.rule
		log.Buckets = 0
		got := map[bool][]int64{}
		for _, r := range []throttle.Rule{c.rule, log} {
			lim := throttle.Limit{Scope: "sms:tenant", Subject: r.String(), Rule: r}
			start := b.clock.Now()
			for i := 0; b.clock.Now().Sub(start) < 6*r.Window; i++ {
				d, err := b.lim.Reserve(ctx, b.group, fmt.Sprintf("u%s-%d", r, i), throttle.ReserveOptions{}, lim)
				if err != nil {
					t.Fatal(err)
				}
				if d.Status == throttle.StatusAdmitted {
					got[r.Buckets > 0] = append(got[r.Buckets > 0], b.clock.Now().UnixMilli())
				}
				b.clock.Add(c.every)
			}
			b.clock.Add(2 * r.Window)
		}
		bk, lg := len(got[true]), len(got[false])
		verifySpacing(t, c.rule.String(), got[true], c.rule.Limit, c.rule.Window.Milliseconds()-1) // no [x, x+window) holds more
		floor := lg * c.rule.Buckets / (c.rule.Buckets + 1)
		t.Logf("%s over 6 windows: %d admitted, the log %d (%.1f%%; bound B/(B+1) = %.1f%%)", c.rule, bk, lg,
			100*float64(bk)/float64(lg), 100*float64(c.rule.Buckets)/float64(c.rule.Buckets+1))
		if bk > lg || bk < floor {
			t.Errorf("%s: %d admitted, want %d to %d", c.rule, bk, floor, lg)
		}
	}
}
