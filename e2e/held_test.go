package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// Issue 53 item 2, with the real binaries: kill -9 of a worker holding, in
// process, digest carriers waiting for their window and an OTP admitted for
// its slot. A second worker takes each over within HELD_DEAD_AFTER (1 s) and
// a sweep of the kill and sends it at its slot, kept: within 2 s of its slot
// (or of the kill, if later). One recipient's digests go in order (the
// first digest before the one its full first spilled into), every item in
// exactly one message, nothing lost, and the window holds on every receipt.
// Before: the lease sweep, 17-30 s after the kill, and a killed worker's
// carrier after the recipient's later digest. On one node and on a
// Cluster of 3 masters (the holders' keys in one slot, each send's record
// in its tenant's, each queue's keys in the queue's).
func TestHeldWorkSurvivesWorkerKill(t *testing.T) {
	t.Parallel()
	for _, topology := range []string{"node", "cluster"} {
		t.Run(topology, func(t *testing.T) {
			t.Parallel()
			heldKill(t, topology)
		})
	}
}

func heldKill(t *testing.T, topology string) {
	const window = 5 * time.Second
	e := newEnv(t, "sms:recipient=1/5s,sms.otp:exempt,sms.otp:recipient=1/5s,sms.alerts:digest=max:3+window:5s")
	var rdb redis.UniversalClient = e.rdb
	if topology == "cluster" {
		_, rdb = e.onCluster(0)
	}
	e.vars["SLUICE_MAX_INLINE_WAIT"] = "6s" // the carriers wait their 5 s window in process
	w0 := e.worker("w0", nil)
	const otpTo, alerts = "+14155550611", 5
	digestTo := []string{"+14155550610", "+14155550612"}
	for _, to := range digestTo {
		for i := 0; i < alerts; i++ {
			n := tasks.NewSMS("acme", to, fmt.Sprintf("alert-%d.", i))
			n.Category = "alerts"
			e.enqueue(n)
		}
	}
	for i := 0; i < 2; i++ {
		n := tasks.NewSMS("acme", otpTo, fmt.Sprintf("code %d", 100000+i))
		n.Category = "otp"
		e.enqueue(n)
	}
	// w0 holds each recipient's first digest's carrier (its window) and the
	// second OTP (its slot, 5 s after the first's); the first OTP has gone.
	e.sms.WaitCount(t, 1, 30*time.Second)
	held := func() int64 {
		var n int64
		for _, h := range rdb.ZRange(t.Context(), "sluice:{held}:holders", 0, -1).Val() {
			n += rdb.HLen(t.Context(), "sluice:{held}:h:"+h).Val()
		}
		return n
	}
	sluicetest.Eventually(t, 10*time.Second, "w0 holding the carriers and the OTP", func() bool { return held() >= 3 })
	addr := freeAddr(t)
	w1 := e.worker("w1", map[string]string{"SLUICE_HTTP_ADDR": addr})
	waitStatus(t, addr, 200, 30*time.Second)
	w0.kill()
	killed := time.Now()
	t.Cleanup(func() {
		if t.Failed() {
			for _, w := range []*proc{w0, w1} {
				for _, l := range strings.Split(w.logText(), "\n") {
					if strings.Contains(l, "held") || strings.Contains(l, "requeued") || strings.Contains(l, "digest") || strings.Contains(l, "took") {
						t.Log(w.name, l)
					}
				}
			}
		}
	})
	// 2 OTPs, and each recipient's alerts in two digests (max 3): 6 receipts.
	ds := e.sms.WaitCount(t, 6, 30*time.Second)
	e.waitDrained(30 * time.Second)
	ds = e.sms.Deliveries()
	if r := audit(ds, 1, window, byRecipient); r.violations > 0 || r.duplicates > 0 {
		t.Errorf("window over or a repeat: %d violations, %d repeats (%s)", r.violations, r.duplicates, r.worst)
	}
	// Recovery: when w1 put each back (its log), after the kill.
	var requeued []time.Duration
	for _, line := range strings.Split(w1.logText(), "\n") {
		if !strings.Contains(line, `msg="requeued a task its worker held`) {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "time="); ok {
				if at, err := time.Parse(time.RFC3339Nano, v); err == nil {
					requeued = append(requeued, at.Sub(killed))
				}
			}
		}
	}
	slices.Sort(requeued)
	t.Logf("w1 requeued %d held tasks %v after the kill", len(requeued), requeued)
	if len(requeued) < 3 {
		t.Errorf("w1 requeued %d held tasks, want the carriers and the OTP at least", len(requeued))
	}
	item := regexp.MustCompile(`alert-(\d+)\.`)
	owner := map[string]int{}          // recipient and item → messages carrying it
	digests := map[string][][]string{} // recipient → its digests' items, in receipt order
	for _, d := range ds {
		if d.At.After(killed) {
			late := d.At.Sub(maxTime(d.Slot, killed))
			t.Logf("%s %s at %s: %v after its slot (%v after its slot or the kill)", d.To, d.ID, d.At.Format("15:04:05.000"),
				d.At.Sub(d.Slot).Round(time.Millisecond), late.Round(time.Millisecond))
			if d.Slot.IsZero() || late > 2*time.Second {
				t.Errorf("%s received %v after its slot or the kill (slot %v); want within 2 s", d.ID, late, d.Slot)
			}
		}
		if d.To == otpTo {
			continue
		}
		found := item.FindAllStringSubmatch(d.Body, -1)
		var its []string
		for _, f := range found {
			its = append(its, f[1])
			owner[d.To+" "+f[1]]++
		}
		digests[d.To] = append(digests[d.To], its)
	}
	for _, to := range digestTo {
		for i := 0; i < alerts; i++ {
			if n := owner[fmt.Sprintf("%s %d", to, i)]; n != 1 {
				t.Errorf("%s: alert-%d in %d messages, want 1", to, i, n)
			}
		}
		// In order: every item of a digest before every item of the next.
		ds := digests[to]
		for i := 1; i < len(ds); i++ {
			if slices.Max(ds[i-1]) > slices.Min(ds[i]) {
				t.Errorf("%s: digests out of order: %v then %v", to, ds[i-1], ds[i])
			}
		}
		t.Logf("%s: digests in receipt order: %v", to, ds)
	}
}
