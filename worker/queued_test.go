package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// What leaves the queue leaves its tenant's count of queued work, and
// what waits stays in it: 60 SMS to distinct numbers of two tenants are
// sent by a worker at concurrency 10 (their removals coalesce in the
// background), 6 more to numbers already sent to are booked an hour ahead
// by the recipient rule. Once the worker has stopped, each tenant's count
// holds exactly its booked ones: no removal lost, none taken from what
// still waits.
func TestQueuedCountFollowsWhatLeft(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=1/1h")
	cfg := withEnv(b.cfg, "SLUICE_CONCURRENCY", "10")
	cfg.Concurrency = 10
	q := tasks.NewQueueQuota(b.rdb, tasks.Caps{Notifications: 1000, TTL: time.Hour})
	ctx := context.Background()
	enqueue := func(n tasks.Notification) {
		if _, err := q.Enqueue(ctx, b.client, b.keys(t), n); err != nil {
			t.Fatal(err)
		}
	}
	tenants := []string{"acme", "globex"}
	for i := range 60 {
		enqueue(tasks.NewSMS(tenants[i%2], fmt.Sprintf("+1415555%04d", 2000+i), "sent"))
	}
	w, err := app.NewWorker(cfg, app.WorkerOptions{Registry: prometheus.NewRegistry(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	b.sms.WaitCount(t, 60, 60*time.Second)
	for i := range 6 {
		enqueue(tasks.NewSMS(tenants[i%2], fmt.Sprintf("+1415555%04d", 2000+i), "booked"))
	}
	// Asynq has no signal for a task rescheduled: poll.
	sluicetest.EventuallyValue(t, 30*time.Second, "the 6 repeats booked (scheduled or retry)", func() (*asynq.QueueInfo, bool) {
		s := b.queueStats(t)
		return s, s.Scheduled+s.Retry >= 6
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := len(b.sms.Deliveries()); n != 60 {
		t.Fatalf("%d receipts, want 60", n)
	}
	for _, tenant := range tenants {
		u, err := q.Usage(ctx, tenant)
		if err != nil || u.Notifications != 3 {
			t.Fatalf("%s's queued count %+v (%v), want its 3 booked", tenant, u, err)
		}
	}
}
