package worker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// A slow provider and few request slots: ten sends taken at once, two at a
// time at the provider, 1 s each. Each is checked only once a request slot
// is free (slotFirst, once the worker has seen the provider is slow), so
// none is admitted and then left waiting for one:
// no late wake (none given back and checked again), every send delivered
// once. Checked first, sends 3–10 would wait 1–4 s for a slot, past half
// the 1 s send slack, and be given back. Latency budget: a send admitted
// with its slot in hand goes within 500 ms (half the slack) unless the
// process stalls that long.
func TestSlowProviderSendsCheckedOnce(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms:recipient=5/1m")
	b.sms.SetLatency(time.Second)
	cfg := b.cfg
	cfg.Concurrency, cfg.SendSlack = 2, time.Second
	cfg = withEnv(cfg, "SLUICE_SMS_TIMEOUT", "10s")
	r := b.start(t, cfg)
	// Two sends first: the worker learns its provider is slow (its recent
	// request time) from them; the ten after are taken at once.
	var ids []string
	for i := range 2 {
		n := tasks.NewSMS("acme", fmt.Sprintf("+141555507%02d", i), "warm-up")
		ids = append(ids, n.ID)
		b.enqueue(t, n)
	}
	b.sms.WaitCount(t, 2, 30*time.Second)
	b.waitIdle(t, 10*time.Second) // their request times recorded
	for i := range 10 {
		n := tasks.NewSMS("acme", fmt.Sprintf("+141555506%02d", i), "hello")
		ids = append(ids, n.ID)
		b.enqueue(t, n)
	}
	b.sms.WaitCount(t, len(ids), 60*time.Second)
	b.waitIdle(t, 10*time.Second)
	deliveredOnce(t, b.sms.Deliveries(), ids)
	if n := len(b.sms.Deliveries()); n != len(ids) {
		t.Fatalf("%d deliveries, want %d", n, len(ids))
	}
	if late := metric(t, r.reg, "sluice_late_wakes_total", map[string]string{"channel": "sms"}); late != 0 {
		t.Fatalf("%v late wakes: sends were admitted and then waited for a request slot", late)
	}
}
