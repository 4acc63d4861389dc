package worker_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// A producer without the rules routes by convention; a category the rules
// make exempt (or a tenant they pin) is found in the wrong queue and moved,
// before any check, under its own id, and sent once.
func TestMisroutedTasksAreMoved(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms.alerts:exempt, sms:recipient=5/1m")
	ctx := context.Background()
	if _, err := plans.NewStore(b.rdb, plans.Policy{}).Set(ctx, "pinned", "shard=6", "test"); err != nil {
		t.Fatal(err)
	}
	alert := tasks.NewSMS("acme", "+14155550300", "fraud?")
	alert.Category = "alerts" // not a conventional priority category: enqueued to standard
	plain := tasks.NewSMS("pinned", "+14155550301", "hello")
	b.enqueue(t, alert)
	b.enqueue(t, plain)
	layout := b.cfg.Layout()
	if ti, err := b.insp.GetTaskInfo(layout.Route("acme", tasks.LaneStandard, nil), alert.ID); err != nil || ti == nil {
		t.Fatalf("the alert is not where a producer without the rules puts it: %v", err)
	}
	r := b.start(t, b.cfg)
	ds := b.sms.WaitCount(t, 2, 20*time.Second)
	b.waitIdle(t, 10*time.Second)
	if got := metric(t, r.reg, "sluice_moved_total", nil); got != 2 {
		t.Fatalf("sluice_moved_total = %v, want 2", got)
	}
	if n := len(b.sms.Deliveries()); n != 2 || ds[0].ID == ds[1].ID {
		t.Fatalf("%d deliveries %v, want each notification once", n, ds)
	}
}

// DEQUEUERS Asynq servers take the standard and bulk lanes' tasks side by
// side: with 3 of them, CONCURRENCY 5 and MAX_WAITERS 7, the worker lists
// four servers (the priority lane's 4 + 7 slots, and 12 slots shared 4, 4,
// 4), and 60 SMS to 60 recipients reach the provider once each.
func TestDequeuersShareTheSlots(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=5/1m")
	b.cfg.Concurrency, b.cfg.MaxWaiters, b.cfg.Dequeuers = 5, 7, 3
	var ids []string
	for i := range 60 {
		n := tasks.NewSMS("acme", fmt.Sprintf("+14155550%03d", 500+i), "hello")
		ids = append(ids, n.ID)
		b.enqueue(t, n)
	}
	b.start(t, b.cfg)
	b.serving(t)
	ss, err := b.insp.Servers()
	if err != nil {
		t.Fatal(err)
	}
	var slots []int
	for _, s := range ss {
		slots = append(slots, s.Concurrency)
	}
	slices.Sort(slots)
	if want := []int{4, 4, 4, b.cfg.PriorityConcurrency + 7}; !slices.Equal(slots, want) {
		t.Fatalf("servers' slots %v, want %v", slots, want)
	}
	b.sms.WaitCount(t, len(ids), 30*time.Second)
	b.waitIdle(t, 10*time.Second)
	deliveredOnce(t, b.sms.Deliveries(), ids)
	if n := len(b.sms.Deliveries()); n != len(ids) {
		t.Fatalf("%d deliveries, want %d", n, len(ids))
	}
}

// The priority lane has its own dequeuer and slots: with the one standard
// slot taken by slow sends (2 s each), an OTP enqueued when the first one
// lands reaches the provider before the third standard one (sharing the
// slot, it would wait for the second and arrive with the third).
func TestPriorityLaneHasItsOwnSlots(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms.otp:exempt, sms:recipient=5/1m")
	b.sms.SetLatency(2 * time.Second)
	cfg := b.cfg
	cfg.Concurrency, cfg.PriorityConcurrency, cfg.MaxWaiters, cfg.MaxInlineWait = 1, 1, 0, 0
	cfg = withEnv(cfg, "SLUICE_SMS_TIMEOUT", "10s")
	var std []string
	for i := 0; i < 4; i++ {
		n := tasks.NewSMS("acme", "+1415555040"+string(rune('0'+i)), "standard")
		std = append(std, n.ID)
		b.enqueue(t, n)
	}
	b.start(t, cfg)
	b.sms.WaitCount(t, 1, 20*time.Second) // the second standard send now holds the slot
	otp := tasks.NewSMS("acme", "+14155550499", "code 1234")
	otp.Category = "otp"
	b.enqueue(t, otp)
	ds := b.sms.WaitCount(t, 5, 30*time.Second) // in the order they reached the provider
	var otpAt time.Time
	var standard []time.Time
	for _, d := range ds {
		if d.ID == otp.ID {
			otpAt = d.At
		} else {
			standard = append(standard, d.At)
		}
	}
	if !otpAt.Before(standard[2]) {
		t.Fatalf("the OTP reached the provider at %v, after the third standard send (%v): it waited for a standard slot",
			otpAt.Format("15:04:05.000"), standard[2].Format("15:04:05.000"))
	}
	_ = std
}

// The queue gate is on against a real redis-server: the worker reports it,
// and an idle worker answers most of Asynq's polls itself.
func TestQueueGateIsOn(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=5/1m")
	r := b.start(t, b.cfg)
	type polls struct{ Answered, Sent float64 }
	sluicetest.EventuallyValueEvery(t, 15*time.Second, 100*time.Millisecond, "the idle worker's gate to answer more than 100 polls", func() (polls, bool) {
		p := polls{metric(t, r.reg, "sluice_queue_polls_total", map[string]string{"result": "answered"}),
			metric(t, r.reg, "sluice_queue_polls_total", map[string]string{"result": "sent"})}
		return p, p.Answered > 100
	})
	n := tasks.NewSMS("acme", "+14155550500", "still delivered")
	b.enqueue(t, n)
	b.sms.WaitCount(t, 1, 10*time.Second)
}
