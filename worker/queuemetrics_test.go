package worker_test

import (
	"context"
	"math"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/app"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/tasks"
)

// gauges returns a gauge family's values keyed by the listed labels' values
// joined with "/".
func gauges(t *testing.T, reg *prometheus.Registry, name string, labels ...string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := ""
			for i, l := range labels {
				for _, lp := range m.GetLabel() {
					if lp.GetName() == l {
						if i > 0 {
							key += "/"
						}
						key += lp.GetValue()
					}
				}
			}
			out[key] = m.GetGauge().GetValue()
		}
	}
	return out
}

// The queue gauges say what Asynq's own Inspector says about every queue the
// worker serves, and the latency is the age of the oldest pending task.
func TestQueueMetricsMatchAsynq(t *testing.T) {
	b := setup(t, "sms:recipient=10/1m,sms.otp:exempt")
	reg := prometheus.NewRegistry()
	w, err := app.NewWorker(b.cfg, app.WorkerOptions{Registry: reg, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		b.enqueue(t, tasks.NewSMS("acme", "+14155550100", "standard "+strconv.Itoa(i)))
	}
	otp := tasks.NewSMS("acme", "+14155550101", "123456")
	otp.Category = "otp"
	b.enqueue(t, otp)
	b.enqueue(t, tasks.NewSMS("acme", "+14155550102", "later"), asynq.ProcessIn(time.Hour))

	layout := b.cfg.Layout()
	prio := layout.Route("acme", tasks.LanePriority, nil)
	// The oldest waiting priority task was enqueued 90 s ago (it waits in
	// acme's waiting room: no worker runs here).
	room := tasks.RoomOf(prio)
	if err := b.rdb.ZAddXX(context.Background(), room.Group("acme"), redis.Z{Score: float64(time.Now().Add(-90 * time.Second).Unix()), Member: otp.ID}).Err(); err != nil {
		t.Fatal(err)
	}

	// KEDA's view (GET /queue-depth): the work waiting for a worker, not
	// the task scheduled for later.
	rec := httptest.NewRecorder()
	w.HTTPHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/queue-depth", nil))
	if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"waiting":4,"priority":1}` {
		t.Errorf("/queue-depth: %d %s, want 4 waiting of which 1 priority", rec.Code, rec.Body)
	}

	tasksBy := gauges(t, reg, "sluice_queue_tasks", "queue", "state")
	latency := gauges(t, reg, "sluice_queue_latency_seconds", "queue")
	lanes := gauges(t, reg, "sluice_queue_latency_seconds", "lane")
	if len(latency) != len(layout.Queues()) {
		t.Fatalf("latency of %d queues, want every one the worker serves (%d)", len(latency), len(layout.Queues()))
	}
	known, err := b.insp.Queues()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, q := range layout.Queues() {
		want := &asynq.QueueInfo{}
		if slices.Contains(known, q) {
			if want, err = b.insp.GetQueueInfo(q); err != nil {
				t.Fatal(err)
			}
		}
		for state, n := range map[string]int{"pending": want.Pending, "active": want.Active, "scheduled": want.Scheduled, "retry": want.Retry, "archived": want.Archived,
			"waiting": want.Aggregating} {
			got, ok := tasksBy[q+"/"+state]
			if !ok || got != float64(n) {
				t.Errorf("%s %s: got %v (reported %v), Asynq's Inspector says %d", q, state, got, ok, n)
			}
			total += got
		}
		if d := math.Abs(latency[q] - want.Latency.Seconds()); want.Aggregating == 0 && d > 2 {
			t.Errorf("%s latency %.1fs, Asynq's Inspector says %s", q, latency[q], want.Latency)
		}
	}
	if total != 5 {
		t.Errorf("%v tasks over all queues, want the 5 enqueued", total)
	}
	if got := latency[prio]; got < 89 || got > 95 {
		t.Errorf("priority latency %.1fs, want about 90s", got)
	}
	if _, ok := lanes["priority"]; !ok {
		t.Errorf("no lane label priority: %v", lanes)
	}

	// Redis gone: the queue gauges are left out, the rest of /metrics is served.
	b.redis.Stop()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "sluice_queue_tasks") || strings.HasPrefix(mf.GetName(), "sluice_queue_latency") {
			t.Errorf("without Redis /metrics still has %s", mf.GetName())
		}
		found = found || mf.GetName() == "sluice_limiter_errors_total"
	}
	if !found {
		t.Error("without Redis /metrics lost sluice_limiter_errors_total")
	}
}
