package fairq_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/fairq"
	"github.com/sluicehq/sluice/internal/pollgate"
	"github.com/sluicehq/sluice/scripts"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

var layout = tasks.Layout{Base: "fairtest", Shards: 4}

// run is an Asynq server on every queue of layout, through a dispatcher,
// recording the tenant of every task it runs, in order.
type run struct {
	d    *fairq.Dispatcher
	mu   sync.Mutex
	seq  []string // "tenant/id" in the order run
	ran  chan struct{}
	stop func()
}

func serve(t *testing.T, rdb *redis.Client, o fairq.Options) *run {
	t.Helper()
	o.Queues, o.Layout = layout.Queues(), layout
	if o.Recheck == 0 {
		o.Recheck = 10 * time.Millisecond
	}
	r := &run{d: fairq.New(rdb, o), ran: make(chan struct{}, 1<<16)}
	c, err := pollgate.Clone(rdb, r.d.Hook())
	if err != nil {
		t.Fatal(err)
	}
	queues := map[string]int{}
	for _, q := range layout.Queues() {
		queues[q] = 1
	}
	srv := asynq.NewServerFromRedisClient(c, asynq.Config{Concurrency: 1, Queues: queues, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 5 * time.Millisecond})
	if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		n, err := tasks.Decode(task.Payload())
		if err != nil {
			return err
		}
		r.mu.Lock()
		r.seq = append(r.seq, n.Tenant+"/"+id)
		r.mu.Unlock()
		r.ran <- struct{}{}
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	r.stop = func() { once.Do(func() { srv.Shutdown(); c.Close() }) }
	t.Cleanup(r.stop)
	return r
}

// wait blocks until n tasks ran in all.
func (r *run) wait(t *testing.T, n int) []string {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		r.mu.Lock()
		got := len(r.seq)
		r.mu.Unlock()
		if got >= n {
			break
		}
		select {
		case <-r.ran:
		case <-timeout:
			t.Fatalf("%d tasks ran in 60 s, want %d", got, n)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seq...)
}

// fill enqueues n notifications of tenant into its room of lane, in
// batches, and returns their ids in order.
func fill(t *testing.T, p *tasks.Producer, tenant string, lane tasks.Lane, n int) []string {
	t.Helper()
	var ids []string
	for n > 0 {
		var items []tasks.Item
		for range min(n, 500) {
			nt := tasks.NewSMS(tenant, "+14155550100", "x")
			nt.ID = tasks.NewID()
			ids = append(ids, nt.ID)
			items = append(items, tasks.Item{N: nt, Opts: []asynq.Option{asynq.Queue(layout.Route(tenant, lane, nil))}})
		}
		res, err := p.EnqueueMany(context.Background(), items)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
		n -= len(items)
	}
	return ids
}

func tenantOf(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			return s[:i]
		}
	}
	return s
}

// tenantsOn returns k tenant names that layout routes to shard of lane.
func tenantsOn(shard, k int, prefix string) []string {
	var out []string
	for i := 0; len(out) < k; i++ {
		name := fmt.Sprintf("%s%d", prefix, i)
		if layout.Shard(name, nil) == shard {
			out = append(out, name)
		}
	}
	return out
}

// Two tenants of one shard, one with 500 waiting and one with 5: the small
// one is served alternately with the big one, not after it, and each
// tenant's notifications run in their enqueue order, each once.
func TestEachTenantWaitsOnlyForItsOwnBacklog(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	p := tasks.NewProducer(rdb, nil)
	two := tenantsOn(0, 2, "t")
	big := fill(t, p, two[0], tasks.LaneStandard, 500)
	small := fill(t, p, two[1], tasks.LaneStandard, 5)
	r := serve(t, rdb, fairq.Options{})
	seq := r.wait(t, 505)
	last := 0
	for i, s := range seq {
		if tenantOf(s) == two[1] {
			last = i
		}
	}
	if last > 2*len(small)+1 {
		t.Fatalf("the small tenant's last notification ran %d-th, want within the first %d (served in turn with the big one)", last+1, 2*len(small)+2)
	}
	checkOrderAndOnce(t, seq, map[string][]string{two[0]: big, two[1]: small})
}

func checkOrderAndOnce(t *testing.T, seq []string, want map[string][]string) {
	t.Helper()
	got := map[string][]string{}
	seen := map[string]bool{}
	for _, s := range seq {
		if seen[s] {
			t.Fatalf("%s ran twice", s)
		}
		seen[s] = true
		tenant := tenantOf(s)
		got[tenant] = append(got[tenant], s[len(tenant)+1:])
	}
	for tenant, ids := range want {
		if len(got[tenant]) != len(ids) {
			t.Fatalf("%s: %d ran, want %d", tenant, len(got[tenant]), len(ids))
		}
		for i := range ids {
			if got[tenant][i] != ids[i] {
				t.Fatalf("%s: the %d-th to run is %s, want %s (enqueue order)", tenant, i+1, got[tenant][i], ids[i])
			}
		}
	}
}

// A tenant that enqueues one notification while another's flood is being
// dispatched waits for at most the dispatch window (Target) and what is in
// flight, not for the flood.
func TestANewcomerJumpsTheFlood(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	p := tasks.NewProducer(rdb, nil)
	two := tenantsOn(1, 2, "f")
	fill(t, p, two[0], tasks.LaneStandard, 3000)
	r := serve(t, rdb, fairq.Options{Target: 16, Low: 8})
	before := len(r.wait(t, 200))
	one := fill(t, p, two[1], tasks.LaneStandard, 1)
	seq := r.wait(t, before+100)
	for i, s := range seq[before:] {
		if s == two[1]+"/"+one[0] {
			if i > 16+2 {
				t.Fatalf("the newcomer ran after %d of the flood's notifications, want at most the window (16) and those in flight", i)
			}
			return
		}
	}
	t.Fatalf("the newcomer did not run among the next 100")
}

// Weights: while both wait, a tenant of weight 3 gets 3 dispatches for
// each of a tenant of weight 1; alone, a tenant gets every dispatch.
func TestWeightsAndWorkConserving(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	p := tasks.NewProducer(rdb, nil)
	two := tenantsOn(2, 2, "w")
	fill(t, p, two[0], tasks.LaneStandard, 400)
	fill(t, p, two[1], tasks.LaneStandard, 400)
	r := serve(t, rdb, fairq.Options{Weights: func() map[string]int { return map[string]int{two[0]: 3} }})
	seq := r.wait(t, 400)
	heavy := 0
	for _, s := range seq[:400] {
		if tenantOf(s) == two[0] {
			heavy++
		}
	}
	if heavy < 297 || heavy > 303 {
		t.Fatalf("of the first 400, the weight-3 tenant got %d, want 300 (3:1)", heavy)
	}
	seq = r.wait(t, 800) // the rest: the heavy one's 100, then the light one's alone
	if tenantOf(seq[799]) != two[1] {
		t.Fatalf("the last to run is %s's", tenantOf(seq[799]))
	}
}

// Across shards: three tenants on one shard and one alone on another each
// get a quarter of the lane, not one half for the lone tenant and a sixth
// for the others (shards drawn by the tenants waiting in each).
func TestSharesAcrossShards(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	p := tasks.NewProducer(rdb, nil)
	crowd, alone := tenantsOn(0, 3, "c"), tenantsOn(3, 1, "a")
	for _, tn := range append(crowd, alone...) {
		fill(t, p, tn, tasks.LaneStandard, 1500)
	}
	r := serve(t, rdb, fairq.Options{})
	seq := r.wait(t, 2000)
	count := map[string]int{}
	for _, s := range seq[:2000] {
		count[tenantOf(s)]++
	}
	var xs []float64
	for _, tn := range append(crowd, alone...) {
		share := float64(count[tn]) / 2000
		if math.Abs(share-0.25) > 0.25*0.2 {
			t.Errorf("%s got %.3f of the lane, want 0.25 ±20%% (counts %v)", tn, share, count)
		}
		xs = append(xs, float64(count[tn]))
	}
	if j := jain(xs); j < 0.95 {
		t.Errorf("Jain's index %.3f, want ≥ 0.95", j)
	}
	if r.d.Stats().Redirects == 0 {
		t.Error("no dequeue was redirected: the shards were not steered")
	}
}

func jain(xs []float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	return s * s / (float64(len(xs)) * s2)
}

// Tasks enqueued the way earlier releases did — straight into a shard's
// pending list, into the legacy queue, or scheduled — are served, each
// once, beside the rooms.
func TestTasksOutsideTheRoomsAreServed(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	_, rdb := redistest.New(t)
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(rdb)
	want := map[string]bool{}
	plain := func(queue string, opts ...asynq.Option) {
		n := tasks.NewSMS("old", "+14155550100", "x")
		n.ID = tasks.NewID()
		// NewTask puts it in a room; a plain Asynq task of earlier
		// releases did not: enqueue the bare task.
		task, err := tasks.NewTask(n, nil, asynq.Queue(queue))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.EnqueueContext(ctx, asynq.NewTask(task.Type(), task.Payload()), append(opts, asynq.Queue(queue), asynq.TaskID(n.ID))...); err != nil {
			t.Fatal(err)
		}
		want["old/"+n.ID] = true
	}
	for i := range 10 {
		plain(layout.Queue(tasks.LaneStandard, i%4))
		plain(layout.Legacy())
		plain(layout.Queue(tasks.LaneBulk, i%4), asynq.ProcessIn(200*time.Millisecond))
	}
	p := tasks.NewProducer(rdb, nil)
	for _, id := range fill(t, p, "new", tasks.LaneStandard, 10) {
		want["new/"+id] = true
	}
	r := serve(t, rdb, fairq.Options{})
	seq := r.wait(t, len(want))
	for _, s := range seq {
		if !want[s] {
			t.Fatalf("%s ran unexpectedly (or twice)", s)
		}
		delete(want, s)
	}
}

// A notification whose task hash is gone (deleted by hand) while its id is
// still in its tenant's group is dropped by the refill, not pushed to the
// pending list as an id without a task; the ones around it are served.
func TestARoomEntryWithoutItsTaskIsDropped(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	ctx := context.Background()
	ids := fill(t, tasks.NewProducer(rdb, nil), "acme", tasks.LaneStandard, 3)
	room := tasks.RoomOf(layout.Route("acme", tasks.LaneStandard, nil))
	if err := rdb.Del(ctx, room.Task(ids[1])).Err(); err != nil {
		t.Fatal(err)
	}
	r := serve(t, rdb, fairq.Options{})
	seq := r.wait(t, 2)
	if want := []string{"acme/" + ids[0], "acme/" + ids[2]}; !slices.Equal(seq, want) {
		t.Fatalf("ran %v, want %v", seq, want)
	}
	r.stop()
	active := "asynq:{" + room.Queue + "}:active"
	for _, list := range []string{room.Pending, active} {
		if got := rdb.LRange(ctx, list, 0, -1).Val(); slices.Contains(got, ids[1]) {
			t.Fatalf("%s holds the id whose task was deleted: %v", list, got)
		}
	}
	if n := rdb.Exists(ctx, room.Task(ids[1])).Val(); n != 0 {
		t.Fatalf("the deleted task's hash was written again (%d)", n)
	}
	if n := rdb.ZCard(ctx, room.Group("acme")).Val(); n != 0 {
		t.Fatalf("%d ids left in acme's group", n)
	}
}

// With writes reported (Notified), a shard found empty is not asked again
// — an idle worker costs Redis nothing more — until a write to it is
// reported.
func TestIdleCostsNothing(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	var d *fairq.Dispatcher
	r := serve(t, rdb, fairq.Options{Notified: func() bool { return true }})
	d = r.d
	queues := len(layout.Queues())
	sluicetest.Eventually(t, 10*time.Second, "every queue to be known empty", func() bool { return d.Stats().Known == queues })
	before := d.Stats().Refills
	if before > uint64(queues) {
		t.Fatalf("%d refills while idle, want at most one per queue (%d) to learn each is empty", before, queues)
	}
	time.Sleep(200 * time.Millisecond) // idle: the server polls every 5 ms meanwhile, and nothing may be refilled
	if after := d.Stats().Refills; after != before {
		t.Fatalf("%d refills while idle after learning every queue empty", after-before)
	}
	p := tasks.NewProducer(rdb, nil)
	id := fill(t, p, "late", tasks.LaneBulk, 1)
	d.OnWrite([]string{tasks.RoomOf(layout.Route("late", tasks.LaneBulk, nil)).Group("late")})
	if seq := r.wait(t, 1); seq[0] != "late/"+id[0] {
		t.Fatalf("ran %v", seq)
	}
}

// A write reported while the refill that found its shard empty is on its
// way back (the report comes on the subscription's connection, the reply on
// the pipeline's: either can be first) is not lost: the shard is asked
// again and the task runs. Reports are trusted and never rechecked here, as
// in a worker whose subscription is up, so a lost wake-up would be for good.
func TestAWriteReportedDuringAnEmptyRefillIsNotLost(t *testing.T) {
	t.Parallel()
	srv, rdb := redistest.New(t)
	p := tasks.NewProducer(srv.Client(t), nil) // its pipelines do not pass the hook below
	const tenant = "late"
	room := tasks.RoomOf(layout.Route(tenant, tasks.LaneStandard, nil))
	var d atomic.Pointer[fairq.Dispatcher]
	var fired atomic.Bool
	enqueued := make(chan error, 1)
	rdb.AddHook(afterPipeline(func(cmds []redis.Cmder) {
		// The first refill of the tenant's shard that moved nothing: the
		// producer's write and its report land before the reply is read.
		if len(cmds) != 2 || fmt.Sprint(cmds[0].Args()[3]) != room.Pending {
			return
		}
		// Its reply {moved, pending, tenants, weight}: nothing waits.
		if r, err := cmds[0].(*redis.Cmd).Slice(); err != nil || r[0] != int64(0) || r[2] != int64(0) || fired.Swap(true) {
			return
		}
		n := tasks.NewSMS(tenant, "+14155550100", "x")
		_, err := p.EnqueueMany(context.Background(), []tasks.Item{{N: n, Opts: []asynq.Option{asynq.Queue(room.Queue)}}})
		d.Load().OnWrite([]string{room.Group(tenant)})
		enqueued <- err
	}))
	r := serve(t, rdb, fairq.Options{Notified: func() bool { return true }, Recheck: time.Hour})
	d.Store(r.d)
	select {
	case err := <-enqueued:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no refill of the tenant's shard found it empty in 10 s")
	}
	select {
	case <-r.ran:
	case <-time.After(10 * time.Second):
		t.Fatalf("the task enqueued during the empty refill did not run in 10 s: its reported write was lost")
	}
}

// afterPipeline is a go-redis hook that calls f with each pipeline's
// commands after their replies are read.
type afterPipeline func([]redis.Cmder)

func (f afterPipeline) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (f afterPipeline) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (f afterPipeline) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		f(cmds)
		return err
	}
}

// The refill moves a tenant's run of dispatches in one go; the order it
// gives must be start-time fair queuing's, dispatch by dispatch: the lowest
// virtual start first (ties to the lower name), each dispatch moving its
// tenant's start on by 1/weight. Checked against that model, in Go, over
// random backlogs and weights and several refill depths.
func TestRefillOrderIsStartTimeFairQueuing(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	ctx := context.Background()
	p := tasks.NewProducer(rdb, nil)
	for trial := range 6 {
		rng := rand.New(rand.NewPCG(uint64(trial), 7))
		queue := layout.Queue(tasks.LaneStandard, trial%layout.Shards)
		room := tasks.RoomOf(queue)
		if err := rdb.FlushAll(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		type tenant struct {
			name   string
			weight int
			ids    []string
			start  float64
		}
		var model []*tenant
		weights := map[string]int{}
		var items []tasks.Item
		for i := range 2 + rng.IntN(5) {
			tn := &tenant{name: fmt.Sprintf("t%d", i), weight: 1 + rng.IntN(4)}
			if tn.weight != 1 {
				weights[tn.name] = tn.weight
			}
			for range 1 + rng.IntN(60) {
				n := tasks.NewSMS(tn.name, "+14155550100", "x")
				n.ID = tasks.NewID()
				tn.ids = append(tn.ids, n.ID)
				items = append(items, tasks.Item{N: n, Opts: []asynq.Option{asynq.Queue(queue)}})
			}
			model = append(model, tn)
		}
		// Interleaved; each tenant's room keeps its enqueue order.
		rng.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
		byName := map[string]*tenant{}
		for _, tn := range model {
			tn.ids, byName[tn.name] = nil, tn
		}
		for _, it := range items {
			tn := byName[it.N.Tenant]
			tn.ids = append(tn.ids, it.N.ID)
		}
		if _, err := p.EnqueueMany(ctx, items); err != nil {
			t.Fatal(err)
		}
		// The model: one dispatch at a time.
		var want []string
		for {
			var next *tenant
			for _, tn := range model {
				if len(tn.ids) > 0 && (next == nil || tn.start < next.start || tn.start == next.start && tn.name < next.name) {
					next = tn
				}
			}
			if next == nil {
				break
			}
			want = append(want, next.ids[0])
			next.ids, next.start = next.ids[1:], next.start+1/float64(next.weight)
		}
		// The script: refill, then take what it moved (oldest first, as
		// Asynq's dequeue does), until nothing is left.
		low := 1 + rng.IntN(8)
		target := low + rng.IntN(24)
		if trial == 0 {
			low, target = 1<<30, 1<<30 // everything at once, as the tests' dispatch asks
		}
		args := []any{low, target, room.TaskPrefix, room.GroupPrefix, "1"}
		for name, w := range weights {
			args = append(args, name, w)
		}
		var got []string
		for range len(want) + 1 {
			if err := scripts.FairRefill.Run(ctx, rdb, []string{room.Pending, room.Groups, room.Fair, room.Clock}, args...).Err(); err != nil {
				t.Fatal(err)
			}
			ids, err := rdb.LRange(ctx, room.Pending, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			if len(ids) == 0 {
				break
			}
			slices.Reverse(ids)
			got = append(got, ids...)
			rdb.Del(ctx, room.Pending)
		}
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("trial %d (low %d, target %d, weights %v): the refills' %d-th task of %d differs from one dispatch at a time (got %d in all, want %d)", trial, low, target, weights, i+1, len(want), len(got), len(want))
		}
	}
}

// firstDiff is the first index where a and b differ, or -1.
func firstDiff(a, b []string) int {
	for i := range max(len(a), len(b)) {
		if i >= len(a) || i >= len(b) || a[i] != b[i] {
			return i
		}
	}
	return -1
}

// With a real queue gate — reports only of keys read on its tracking
// connection, and shards recorded empty only after such a read (Confirm) —
// an idle worker refills nothing, a room that gets work wakes its shard at
// once (Recheck is an hour: only the report can), and draining a backlog is
// reported a few times, not once per task.
func TestWithTheGateIdleIsQuietAndWorkWakes(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	var d atomic.Pointer[fairq.Dispatcher]
	g := pollgate.New(rdb, layout.Queues(), pollgate.Options{Recheck: time.Hour,
		OnWrite: func(keys []string) { d.Load().OnWrite(keys) }, OnForget: func() { d.Load().Forget() }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	r := serve(t, rdb, fairq.Options{Notified: g.Active, Confirm: g.Confirm, Recheck: time.Hour, Weights: func() map[string]int { return nil }})
	d.Store(r.d)
	queues := len(layout.Queues())
	sluicetest.Eventually(t, 10*time.Second, "the gate up and every queue known empty", func() bool { return g.Active() && r.d.Stats().Known == queues })
	before := r.d.Stats().Refills
	time.Sleep(200 * time.Millisecond) // idle: the server polls every 5 ms meanwhile, and nothing may be refilled
	if after := r.d.Stats().Refills; after != before {
		t.Fatalf("%d refills while idle after learning every queue empty", after-before)
	}
	p := tasks.NewProducer(rdb, nil)
	reports := g.Stats().Invalidations
	ids := fill(t, p, "late", tasks.LaneBulk, 300)
	seq := r.wait(t, len(ids))
	for i, id := range ids {
		if seq[i] != "late/"+id {
			t.Fatalf("task %d ran as %s, want late/%s", i, seq[i], id)
		}
	}
	if n := g.Stats().Invalidations - reports; n > 30 {
		t.Fatalf("a backlog of %d in one room was reported written %d times: a busy shard must not be", len(ids), n)
	}
	// One more into the shard its own dequeues just emptied, and one into
	// another lane's: each wakes its shard.
	for i, tenant := range []string{"late", "later"} {
		lane := []tasks.Lane{tasks.LaneBulk, tasks.LaneStandard}[i]
		sluicetest.Eventually(t, 10*time.Second, "every queue known empty again", func() bool { return r.d.Stats().Known == queues })
		id := fill(t, p, tenant, lane, 1)
		if seq := r.wait(t, len(ids)+i+1); seq[len(ids)+i] != tenant+"/"+id[0] {
			t.Fatalf("ran %v last, want %s/%s", seq[len(ids)+i], tenant, id[0])
		}
	}
}

// With Batch, a dequeue takes several tasks of the shard it picks in one
// call and answers the next dequeues with the others without a round trip:
// every task runs once, each tenant's in enqueue order, and the small
// tenant is still served in turn with the big one.
func TestBatchedDequeuesKeepOrderAndShares(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	p := tasks.NewProducer(rdb, nil)
	two := tenantsOn(0, 2, "b")
	big := fill(t, p, two[0], tasks.LaneStandard, 400)
	small := fill(t, p, two[1], tasks.LaneStandard, 5)
	r := serve(t, rdb, fairq.Options{Batch: func(tasks.Lane) int { return 8 }})
	seq := r.wait(t, 405)
	checkOrderAndOnce(t, seq, map[string][]string{two[0]: big, two[1]: small})
	last := 0
	for i, s := range seq {
		if tenantOf(s) == two[1] {
			last = i
		}
	}
	if last > 2*len(small)+16 {
		t.Fatalf("the small tenant's last notification ran %d-th, want within the first %d (served in turn, a batch at most behind)", last+1, 2*len(small)+16)
	}
	st := r.d.Stats()
	t.Logf("stats %+v", st)
	if st.Ahead < 300 || st.Taken < 400 {
		t.Fatalf("stats %+v: want most dequeues answered from tasks taken ahead", st)
	}
}

// Tasks taken ahead are leased as Asynq's dequeue leases a task (active,
// in the lease set, state active, no pending_since); GiveBack puts those
// no processor started back at the head of their queue in order (pending,
// out of active and lease), and they run next, once each.
func TestGiveBackPutsTasksTakenAheadBack(t *testing.T) {
	t.Parallel()
	srv, rdb := redistest.New(t)
	p := tasks.NewProducer(srv.Client(t), nil)
	ctx := context.Background()
	const tenant = "g"
	q := layout.Route(tenant, tasks.LaneStandard, nil)
	ids := fill(t, p, tenant, tasks.LaneStandard, 5)
	d := fairq.New(rdb, fairq.Options{Queues: layout.Queues(), Layout: layout, Batch: func(tasks.Lane) int { return 5 }})
	c, err := pollgate.Clone(rdb, d.Hook())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	release := make(chan struct{})
	started := make(chan string, 8)
	srvA := asynq.NewServerFromRedisClient(c, asynq.Config{Concurrency: 1, Queues: map[string]int{q: 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 5 * time.Millisecond, ShutdownTimeout: 10 * time.Second})
	if err := srvA.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	first := <-started
	if first != ids[0] {
		t.Fatalf("ran %s first, want %s", first, ids[0])
	}
	if n := d.Ahead(tasks.LaneStandard); n != 4 {
		t.Fatalf("%d tasks taken ahead, want 4", n)
	}
	room := tasks.RoomOf(q)
	active, lease := "asynq:{"+q+"}:active", "asynq:{"+q+"}:lease"
	for _, id := range ids {
		h := rdb.HGetAll(ctx, room.Task(id)).Val()
		if h["state"] != "active" || h["pending_since"] != "" {
			t.Fatalf("task %s taken: state %q, pending_since %q; want active and none, as Asynq's dequeue leaves it", id, h["state"], h["pending_since"])
		}
		if _, err := rdb.ZScore(ctx, lease, id).Result(); err != nil {
			t.Fatalf("task %s taken has no lease: %v", id, err)
		}
	}
	n, err := d.GiveBack(ctx)
	if err != nil || n != 4 {
		t.Fatalf("gave back %d, %v; want 4", n, err)
	}
	if got := rdb.LRange(ctx, room.Pending, 0, -1).Val(); !slices.Equal(got, []string{ids[4], ids[3], ids[2], ids[1]}) {
		t.Fatalf("pending after the give-back %v, want %v (the next to run at the right)", got, []string{ids[4], ids[3], ids[2], ids[1]})
	}
	if got := rdb.LRange(ctx, active, 0, -1).Val(); !slices.Equal(got, []string{first}) {
		t.Fatalf("active after the give-back %v, want only the running %s", got, first)
	}
	for _, id := range ids[1:] {
		if st := rdb.HGet(ctx, room.Task(id), "state").Val(); st != "pending" {
			t.Fatalf("task %s given back has state %q, want pending", id, st)
		}
		if err := rdb.ZScore(ctx, lease, id).Err(); err == nil {
			t.Fatalf("task %s given back kept its lease", id)
		}
	}
	close(release)
	for i := 1; i < 5; i++ {
		select {
		case id := <-started:
			if id != ids[i] {
				t.Fatalf("ran %s %d-th, want %s", id, i+1, ids[i])
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the tasks given back did not run")
		}
	}
	srvA.Shutdown()
}

// A task taken ahead that waited longer than MaxAhead for a processor is
// put back in its queue, not run from the dispatcher: its lease stood still
// meanwhile, and an orphan sweep could have put it back already. The tasks
// then run once each, in order.
func TestTasksTakenAheadTooLongArePutBack(t *testing.T) {
	t.Parallel()
	srv, rdb := redistest.New(t)
	p := tasks.NewProducer(srv.Client(t), nil)
	const tenant = "s"
	q := layout.Route(tenant, tasks.LaneStandard, nil)
	ids := fill(t, p, tenant, tasks.LaneStandard, 5)
	var skew atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	d := fairq.New(rdb, fairq.Options{Queues: layout.Queues(), Layout: layout, Now: now, Batch: func(tasks.Lane) int { return 5 }})
	c, err := pollgate.Clone(rdb, d.Hook())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	release := make(chan struct{})
	started := make(chan string, 16)
	srvA := asynq.NewServerFromRedisClient(c, asynq.Config{Concurrency: 1, Queues: map[string]int{q: 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 5 * time.Millisecond})
	if err := srvA.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srvA.Shutdown)
	if first := <-started; first != ids[0] {
		t.Fatalf("ran %s first, want %s", first, ids[0])
	}
	if n := d.Ahead(tasks.LaneStandard); n != 4 {
		t.Fatalf("%d taken ahead, want 4", n)
	}
	skew.Store(int64(fairq.MaxAhead + time.Second))
	close(release)
	for i := 1; i < 5; i++ {
		select {
		case id := <-started:
			if id != ids[i] {
				t.Fatalf("ran %s %d-th, want %s", id, i+1, ids[i])
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the tasks put back did not run")
		}
	}
	if st := d.Stats(); st.Taken < 9 {
		t.Fatalf("stats %+v: the four stale tasks were run from the dispatcher, not put back and taken again", st)
	}
	select {
	case id := <-started:
		t.Fatalf("%s ran twice", id)
	case <-time.After(200 * time.Millisecond):
	}
}
