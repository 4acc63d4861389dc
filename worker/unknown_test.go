package worker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// A run that crashed mid-send leaves its admission without a done record:
// the re-run's outcome is unknown, and at-least-once sends again. Where the
// provider's status report for the notification is already here, the
// provider had the message: the re-run does not send, records it done and
// gives back the slot it was given. Without a report it sends again. Both
// are counted.
func TestRerunSettledByTheProvidersReport(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=5/1m")
	b.cfg.PayloadPlaintext = "accept"
	// The first admission of silent's re-run comes back to a starved
	// process (as on a loaded CI machine): past half the send slack, the
	// run gives the slot back and asks again. Its resend counts once.
	silent := tasks.NewSMS("acme", "+14155550131", "no report")
	var starved atomic.Bool
	r := b.startOpts(t, b.cfg, app.WorkerOptions{OnDecision: func(n tasks.Notification, d throttle.Decision) {
		if n.ID == silent.ID && d.Attempt > 1 && starved.CompareAndSwap(false, true) {
			time.Sleep(b.cfg.SendSlack) // the starvation itself: nothing to wait for
		}
	}})
	ctx := context.Background()
	lim := r.w.Limiter()
	var limits []throttle.Limit
	crashed := func(n tasks.Notification) {
		t.Helper()
		limits = limits[:0]
		for _, e := range r.w.Policy().Match("acme", tasks.SMS, "").Rates {
			limits = append(limits, e.Limit(n.Normalized().To, "", ""))
		}
		// The run that crashed: admitted, then nothing recorded.
		if d, err := lim.Reserve(ctx, "acme", n.ID, throttle.ReserveOptions{Nonce: "crashed-run"}, limits...); err != nil || d.Status != throttle.StatusAdmitted {
			t.Fatalf("the crashed run's admission: %+v, %v", d, err)
		}
	}
	run := func(n tasks.Notification) {
		t.Helper()
		task, err := tasks.NewTask(n, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.w.Handler().ProcessTask(ctx, task); err != nil {
			t.Fatalf("re-run: %v", err)
		}
	}

	reported := tasks.NewSMS("acme", "+14155550130", "reported")
	crashed(reported)
	if _, _, err := delivery.NewStore(b.rdb, lim).Update(ctx, "acme", reported.ID, delivery.Record{Status: delivery.Sent, MessageSID: "SM0123456789abcdef0123456789abcdef"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	run(reported)
	if got := b.sms.Deliveries(); len(got) != 0 {
		t.Fatalf("the provider reported the message, and the re-run sent it again: %+v", got)
	}
	if u, err := lim.Usage(ctx, "acme", 0, limits...); err != nil || u[0].Used != 1 {
		t.Fatalf("window %+v (%v): want the crashed run's one entry, the re-run's slot given back", u, err)
	}
	// Recorded done: a further run answers so.
	if d, err := lim.Reserve(ctx, "acme", reported.ID, throttle.ReserveOptions{Nonce: "later"}, limits...); err != nil || d.Status != throttle.StatusDone {
		t.Fatalf("a run after the settled one: %+v, %v; want done", d, err)
	}

	crashed(silent)
	run(silent)
	// At least the starved admission: a loaded machine may starve another
	// (a cold CI build beside this saw 2), and each is given back alike.
	if v := metric(t, r.reg, "sluice_late_wakes_total", map[string]string{"channel": "sms"}); v < 1 {
		t.Errorf("sluice_late_wakes_total = %v, want at least 1 (the starved first admission given back)", v)
	}
	if got := b.sms.Deliveries(); len(got) != 1 || got[0].ID != silent.ID {
		t.Fatalf("without a report the re-run must send (at-least-once): %+v", got)
	}
	for outcome, want := range map[string]float64{"settled": 1, "resent": 1} {
		if v := metric(t, r.reg, "sluice_unknown_outcomes_total", map[string]string{"channel": "sms", "outcome": outcome}); v != want {
			t.Errorf("sluice_unknown_outcomes_total{outcome=%s} = %v, want %v", outcome, v, want)
		}
	}
}
