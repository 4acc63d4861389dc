package worker_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/testkit/sluicetest"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
)

// A tenant's plan changes while two workers send under load: both apply it
// within 2 s, every window after that holds the new limit, and no window
// ever holds more than the old one.
func TestPlanChangeUnderLoad(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms:tenant=20/2s,sms:recipient=100/1m")
	// The receipts are audited against the limits exactly; a send may reach
	// the fake up to the send slack after its slot (SEND_SLACK's contract).
	// The full suite on 2 loaded cores stretched one past the default 100 ms
	// (21 receipts in 2 s); 300 ms, as the other audits under load use.
	b.cfg.SendSlack = 300 * time.Millisecond
	var mu sync.Mutex
	applied := map[int]time.Time{}
	for i := 0; i < 2; i++ {
		b.startOpts(t, b.cfg, app.WorkerOptions{OnPlanChange: func(v int64) {
			mu.Lock()
			if _, ok := applied[i]; !ok && v >= 1 {
				applied[i] = time.Now()
			}
			mu.Unlock()
		}})
	}
	defaults, _ := plans.Parse(b.cfg.Rules)
	st := plans.NewStore(b.rdb, defaults)
	// 15 notifications a second for 8 s, to many recipients of one tenant.
	stop := time.After(8 * time.Second)
	changeAt := time.After(3 * time.Second)
	tick := time.NewTicker(time.Second / 15)
	defer tick.Stop()
	var changed time.Time
	n := 0
loop:
	for {
		select {
		case <-tick.C: // a steady arrival rate is the scenario
			b.enqueue(t, tasks.NewSMS("acme", fmt.Sprintf("+1415555%04d", n%500), "load"))
			n++
		case <-changeAt:
			changed = time.Now()
			if _, err := st.Set(context.Background(), "acme", "sms:tenant=5/2s", "test"); err != nil {
				t.Fatal(err)
			}
		case <-stop:
			break loop
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(applied) != 2 {
		t.Fatalf("%d of 2 workers applied the plan", len(applied))
	}
	var last time.Time
	for _, at := range applied {
		if at.After(last) {
			last = at
		}
	}
	if lag := last.Sub(changed); lag > 2*time.Second {
		t.Fatalf("the change applied %v after it was made; want ≤ 2 s", lag)
	}
	// The backlog keeps going after the arrivals stop: wait for enough
	// receipts under the new plan to judge it (a loaded machine sends
	// fewer in the 5 s the arrivals last).
	cut := last.Add(100 * time.Millisecond)
	b.sms.WaitFor(t, 30*time.Second, "5 receipts after the change", func(ds []fakes.Delivery) bool {
		k := 0
		for _, d := range ds {
			if d.At.After(cut) {
				k++
			}
		}
		return k >= 5
	})
	var all, after []time.Time
	for _, d := range b.sms.Deliveries() {
		all = append(all, d.At)
		// A send admitted just before the change may arrive just after it.
		if d.At.After(cut) {
			after = append(after, d.At)
		}
	}
	var worst string // the busiest window's gaps: bunched receipts (an entry lost) or latency past the slack
	maxIn := func(times []time.Time, window time.Duration) int {
		sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
		best := 0
		for i := range times {
			j := i
			for j < len(times) && times[j].Sub(times[i]) <= window {
				j++
			}
			if j-i > best {
				best, worst = j-i, gaps(times[i:j])
			}
		}
		return best
	}
	t.Logf("%d enqueued; plan applied %v after the change; %d receipts, %d after it; busiest 2 s: %d overall, %d after the change",
		n, last.Sub(changed).Round(time.Millisecond), len(all), len(after), maxIn(all, 2*time.Second), maxIn(after, 2*time.Second))
	if got := maxIn(all, 2*time.Second); got > 20 {
		t.Fatalf("%d receipts within 2 s: over the old limit of 20 (gaps %s)", got, worst)
	}
	if got := maxIn(after, 2*time.Second); got > 5 {
		t.Fatalf("%d receipts within 2 s after the change: over the new limit of 5 (gaps %s)", got, worst)
	}
	if len(after) < 5 {
		t.Fatalf("only %d receipts after the change: the test saw too little", len(after))
	}
}

// gaps lists the times between consecutive receipts.
func gaps(times []time.Time) string {
	var b strings.Builder
	for i := 1; i < len(times); i++ {
		if i > 1 {
			b.WriteString(", ")
		}
		b.WriteString(times[i].Sub(times[i-1]).Round(time.Millisecond).String())
	}
	return b.String()
}
