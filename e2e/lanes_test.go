package e2e

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
)

// enqueueMany enqueues ns with 8 producers at once (as a busy application
// would); ns keep their relative order per producer only.
func (e *env) enqueueMany(ns []tasks.Notification) {
	e.t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for p := 0; p < 8; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := p; i < len(ns); i += 8 {
				if _, err := tasks.Enqueue(context.Background(), e.client, e.keys, ns[i]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		e.t.Fatal(err)
	}
}

// A bulk flood of tenant A and a standard flood of tenant B are queued
// before the worker starts; then OTPs of A, B and C, and standard
// notifications of C, arrive every 200 ms. Judged at the provider: every
// OTP and every one of C's notifications reaches it while B's flood is
// still draining (nothing that may not wait queued behind it), and no
// receipt breaks a rule. (The benchmark runs the same shape at 100,000 +
// 100,000 and reports latencies: scripts/bench.sh --only lanes.)
func TestNothingUrgentQueuesBehindAFlood(t *testing.T) {
	t.Parallel()
	const flood = 6000
	e := newEnv(t, "sms.otp:exempt, sms.otp:recipient=20/1h, sms.marketing:bulk, sms.marketing:recipient=1/1h, sms:recipient=5/1m")
	b, c := "tenant-b", "tenant-c"
	layout := tasks.DefaultLayout
	for layout.Shard(c, nil) == layout.Shard(b, nil) {
		c += "x" // the shape under test: C shares no shard with B
	}
	var ns []tasks.Notification
	for i := 0; i < flood; i++ {
		m := tasks.NewSMS("tenant-a", fmt.Sprintf("+1416%07d", i%500), "sale")
		m.Category = "marketing"
		ns = append(ns, m, tasks.NewSMS(b, fmt.Sprintf("+1417%07d", i), "receipt"))
	}
	e.enqueueMany(ns)
	kind := map[string]string{}
	for _, n := range ns {
		kind[n.ID] = n.Tenant + "/" + n.CategoryOrDefault()
	}
	e.worker("w0", map[string]string{"SLUICE_CONCURRENCY": "16"})

	// The worker has begun on the floods: now the urgent traffic.
	e.sms.WaitCount(t, 200, time.Minute)
	enqueued := map[string]time.Time{}
	for i := 0; i < 15; i++ {
		for _, tenant := range []string{"tenant-a", b, c} {
			otp := tasks.NewSMS(tenant, fmt.Sprintf("+1418%07d", i), "code")
			otp.Category = "otp"
			kind[otp.ID], enqueued[otp.ID] = "otp", time.Now()
			e.enqueue(otp)
		}
		std := tasks.NewSMS(c, fmt.Sprintf("+1419%07d", i), "order shipped")
		kind[std.ID], enqueued[std.ID] = "c-standard", time.Now()
		e.enqueue(std)
		time.Sleep(200 * time.Millisecond) // the arrival pace under test
	}
	ds := e.sms.WaitFor(t, 3*time.Minute, "every OTP and C's notifications, and B's whole flood", func(ds []fakes.Delivery) bool {
		got := map[string]int{}
		for _, d := range ds {
			got[kind[d.ID]]++
		}
		return got["otp"] == 45 && got["c-standard"] == 15 && got[b+"/default"] == flood
	})
	var lastB time.Time
	lat := map[string][]time.Duration{}
	for _, d := range ds {
		switch k := kind[d.ID]; k {
		case b + "/default":
			if d.At.After(lastB) {
				lastB = d.At
			}
		case "otp", "c-standard":
			lat[k] = append(lat[k], d.At.Sub(enqueued[d.ID]))
		}
	}
	// Judged: what was enqueued while the flood still had at least a
	// second to go (what arrives after the flood drained cannot have
	// queued behind it); enough of it that the judgement means something.
	judged := 0
	for _, d := range ds {
		k := kind[d.ID]
		if (k != "otp" && k != "c-standard") || enqueued[d.ID].After(lastB.Add(-time.Second)) {
			continue
		}
		judged++
		if !d.At.Before(lastB) {
			t.Errorf("%s %s reached the provider at %v, after tenant B's whole flood (its last receipt %v): it queued behind it",
				k, d.ID, d.At.Format("15:04:05.000"), lastB.Format("15:04:05.000"))
		}
	}
	if judged < 20 {
		t.Errorf("only %d urgent notifications were enqueued a second or more before B's flood drained: too few to judge", judged)
	}
	for k, ls := range lat {
		sort.Slice(ls, func(i, j int) bool { return ls[i] < ls[j] })
		t.Logf("%s: %d sent, enqueue-to-provider p50 %v, max %v; tenant B's flood drained %v after its first receipt",
			k, len(ls), ls[len(ls)/2].Round(time.Millisecond), ls[len(ls)-1].Round(time.Millisecond), lastB.Sub(ds[0].At).Round(time.Millisecond))
	}
	if r := audit(ds, 5, time.Minute, byRecipient); r.violations != 0 || r.duplicates != 0 {
		t.Fatalf("%d violations (%s), %d repeats", r.violations, r.worst, r.duplicates)
	}
}

// Tasks left by earlier releases — in the single queue of the releases
// before lanes, and in a lane's shard by the releases before the waiting
// rooms: pending, scheduled, and in retry after a failed attempt of the
// old worker — are all delivered exactly once by the new workers, beside
// notifications enqueued into the rooms meanwhile.
func TestUpgradeFromTheSingleQueue(t *testing.T) {
	t.Parallel()
	for _, queue := range []string{tasks.DefaultLayout.Legacy(), tasks.DefaultLayout.Route("acme", tasks.LaneStandard, nil)} {
		t.Run(queue, func(t *testing.T) {
			t.Parallel()
			upgradeFrom(t, queue)
		})
	}
}

// plainTask is n as producers before the waiting rooms enqueued it:
// straight into its queue's pending list (no group).
func plainTask(t *testing.T, keys *tasks.Keyring, n tasks.Notification, queue string, opts ...asynq.Option) (*asynq.Task, []asynq.Option) {
	t.Helper()
	task, err := tasks.NewTask(n, keys)
	if err != nil {
		t.Fatal(err)
	}
	return asynq.NewTaskWithHeaders(task.Type(), task.Payload(), task.Headers()), append([]asynq.Option{asynq.Queue(queue), asynq.TaskID(n.ID),
		asynq.MaxRetry(tasks.DefaultMaxRetry + 1), asynq.Timeout(tasks.DefaultTimeout), asynq.Retention(0)}, opts...)
}

func upgradeFrom(t *testing.T, legacy string) {
	e := newEnv(t, "sms:recipient=5/1m")
	ids := map[string]string{}
	enqueue := func(body string, opts ...asynq.Option) string {
		n := tasks.NewSMS("acme", fmt.Sprintf("+1415555%04d", len(ids)), body)
		task, all := plainTask(t, e.keys, n, legacy, opts...)
		if _, err := e.client.EnqueueContext(context.Background(), task, all...); err != nil {
			t.Fatal(err)
		}
		ids[n.ID] = n.To
		return n.ID
	}
	// The old deployment: its worker (a plain Asynq server on the single
	// queue) fails each of these once, which leaves them in retry.
	failing := map[string]bool{}
	for i := 0; i < 5; i++ {
		failing[enqueue("retry")] = true
	}
	old := asynq.NewServerFromRedisClient(e.rdb, asynq.Config{Queues: map[string]int{legacy: 1}, Concurrency: 4,
		LogLevel: asynq.FatalLevel, RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return 3 * time.Second }})
	var mu sync.Mutex
	failed := map[string]bool{}
	allFailed := make(chan struct{})
	mux := asynq.NewServeMux()
	mux.HandleFunc(tasks.TypeSMS, func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		mu.Lock()
		defer mu.Unlock()
		if !failed[id] {
			failed[id] = true
			if len(failed) == len(failing) {
				close(allFailed)
			}
		}
		return fmt.Errorf("the old worker's provider is down")
	})
	if err := old.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(old.Shutdown) // if the test ends early (a second Shutdown does nothing)
	select {
	case <-allFailed:
	case <-time.After(30 * time.Second):
		t.Fatal("the old worker did not fail its tasks")
	}
	old.Shutdown()
	for i := 0; i < 10; i++ {
		enqueue("pending")
	}
	for i := 0; i < 5; i++ {
		enqueue("scheduled", asynq.ProcessIn(3*time.Second))
	}
	qi, err := e.insp.GetQueueInfo(legacy)
	if err != nil || qi.Pending != 10 || qi.Scheduled != 5 || qi.Retry != 5 {
		t.Fatalf("the single queue holds %+v (%v), want 10 pending, 5 scheduled, 5 retry", qi, err)
	}

	for i := 0; i < 5; i++ { // and new producers meanwhile, into acme's room
		n := tasks.NewSMS("acme", fmt.Sprintf("+1415555%04d", len(ids)), "new")
		if _, err := tasks.Enqueue(context.Background(), e.client, e.keys, n); err != nil {
			t.Fatal(err)
		}
		ids[n.ID] = n.To
	}
	e.worker("new", nil)
	ds := e.waitAllDelivered(ids, time.Minute)
	e.waitDrained(30 * time.Second)
	r := audit(e.sms.Deliveries(), 5, time.Minute, byRecipient)
	t.Logf("upgrade: %d tasks left in %q, %d receipts, %d repeats", len(ids), legacy, r.receipts, r.duplicates)
	if r.receipts != len(ids) || r.duplicates != 0 || len(ds) != len(ids) {
		t.Fatalf("%d receipts (%d repeats) for %d tasks: want each exactly once", r.receipts, r.duplicates, len(ids))
	}
	if qi, err := e.insp.GetQueueInfo(legacy); err != nil || qi.Size != 0 {
		t.Fatalf("the single queue still holds %+v (%v)", qi, err)
	}
}

// Within one tenant and lane, notifications to one recipient reach the
// provider in the order they were enqueued whenever their rules allow: the
// shard is a FIFO and the limiter hands slots out in the order it is asked.
// Tolerance: the worker checks SLUICE_CONCURRENCY tasks at once, so two
// tasks dequeued within one check's round trip of each other may reach the
// limiter in either order — here half the runs had 1–2 such receipts of 48
// — so at most 4 of the 48 may come after a later message. Repeated over
// several recipients and two rule shapes.
func TestSendOrderWithinTenantAndLane(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=1/300ms, sms.marketing:bulk, sms.marketing:recipient=2/1s")
	order := map[string]int{}
	var ns []tasks.Notification
	for i := 0; i < 12; i++ {
		for r := 0; r < 4; r++ {
			n := tasks.NewSMS("acme", fmt.Sprintf("+1415555%04d", r), fmt.Sprint(i))
			if r >= 2 {
				n.Category = "marketing"
			}
			order[n.ID] = i
			ns = append(ns, n)
		}
	}
	for _, n := range ns { // one producer: enqueue order is this order
		e.enqueue(n)
	}
	e.worker("w0", nil)
	ids := map[string]string{}
	for _, n := range ns {
		ids[n.ID] = n.To
	}
	ds := e.waitAllDelivered(ids, 2*time.Minute)
	last := map[string]int{}
	var swaps []string
	for _, d := range ds {
		if prev, ok := last[d.To]; ok && order[d.ID] < prev {
			swaps = append(swaps, fmt.Sprintf("%s: message %d reached the provider after message %d", d.To, order[d.ID], prev))
		}
		last[d.To] = max(last[d.To], order[d.ID])
	}
	t.Logf("%d of %d receipts after a later message to the same recipient %v", len(swaps), len(ds), swaps)
	if len(swaps) > 4 {
		t.Errorf("%d receipts out of order (tolerance 4): %v", len(swaps), swaps)
	}
}
