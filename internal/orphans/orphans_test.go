package orphans_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/orphans"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

const queue = "orphans-test"

func key(suffix string) string { return "asynq:{" + queue + "}:" + suffix }

// loseDequeue leaves Redis as Asynq's dequeue script does when Redis dies
// just after running it: the task active with a 30 s lease, and no worker
// that received it.
var loseDequeue = redis.NewScript(`
local id = redis.call('RPOPLPUSH', KEYS[1], KEYS[2])
if not id then return redis.error_reply('nothing pending') end
redis.call('HSET', ARGV[1] .. id, 'state', 'active')
redis.call('HDEL', ARGV[1] .. id, 'pending_since')
redis.call('ZADD', KEYS[3], ARGV[2], id)
return id
`)

// enqueue puts one task on the test queue with Asynq's own client.
func enqueue(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	c := asynq.NewClientFromRedisClient(rdb)
	info, err := c.Enqueue(asynq.NewTask("t", nil), asynq.Queue(queue))
	if err != nil {
		t.Fatal(err)
	}
	return info.ID
}

func orphan(t *testing.T, rdb *redis.Client) string {
	t.Helper()
	id := enqueue(t, rdb)
	lease := time.Now().Add(30 * time.Second).Unix()
	if err := loseDequeue.Run(context.Background(), rdb, []string{key("pending"), key("active"), key("lease")}, key("t:"), lease).Err(); err != nil {
		t.Fatal(err)
	}
	return id
}

func newSweeper(t *testing.T, rdb *redis.Client, found *[]string) *orphans.Sweeper {
	t.Helper()
	var mu sync.Mutex
	s, err := orphans.New(rdb, orphans.Options{Queues: []string{queue}, After: orphans.MinAfter, OnRequeued: func(q, id string) {
		mu.Lock()
		defer mu.Unlock()
		if q != queue {
			t.Errorf("requeued from queue %q, want %q", q, queue)
		}
		if found != nil {
			*found = append(*found, id)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The sweeper was checked against one Asynq release; an upgrade must check
// the keys again (TestAsynqKeys, TestRequeueIsAsynqs) and move the const.
func TestAsynqVersionInGoMod(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(mod)) {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "github.com/hibiken/asynq" {
			if f[1] != orphans.AsynqVersion {
				t.Fatalf("go.mod has Asynq %s; the sweeper's keys were checked against %s: re-check them and update orphans.AsynqVersion", f[1], orphans.AsynqVersion)
			}
			return
		}
	}
	t.Fatal("go.mod names no github.com/hibiken/asynq")
}

// The keys and states the sweeper reads are the ones the Asynq in go.mod
// writes: an enqueued task is in :pending with state pending; a running
// one is in :active with a lease in :lease and state active.
func TestAsynqKeys(t *testing.T) {
	_, rdb := redistest.New(t)
	ctx := context.Background()
	id := enqueue(t, rdb)
	if ids := rdb.LRange(ctx, key("pending"), 0, -1).Val(); !slices.Contains(ids, id) {
		t.Fatalf("%s holds %v, not the enqueued task %s", key("pending"), ids, id)
	}
	if st := rdb.HGet(ctx, key("t:"+id), "state").Val(); st != "pending" {
		t.Fatalf("state of a pending task is %q, want pending", st)
	}
	running, release := make(chan struct{}), make(chan struct{})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 1, Queues: map[string]int{queue: 1}, LogLevel: asynq.FatalLevel})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		close(running)
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	select {
	case <-running:
	case <-time.After(10 * time.Second):
		t.Fatal("the task did not start")
	}
	if ids := rdb.LRange(ctx, key("active"), 0, -1).Val(); !slices.Equal(ids, []string{id}) {
		t.Errorf("%s holds %v while the task runs, want [%s]", key("active"), ids, id)
	}
	score, err := rdb.ZScore(ctx, key("lease"), id).Result()
	if err != nil {
		t.Errorf("no lease in %s for a running task: %v", key("lease"), err)
	} else if d := time.Until(time.Unix(int64(score), 0)); d < 20*time.Second || d > 31*time.Second {
		t.Errorf("lease of a running task ends in %v, want about 30 s", d)
	}
	if st := rdb.HGet(ctx, key("t:"+id), "state").Val(); st != "active" {
		t.Errorf("state of a running task is %q, want active", st)
	}
	close(release)
}

// The sweeper's requeue leaves a task exactly as Asynq's own Requeue does
// at shutdown (its handler unfinished): in :pending, out of :active and
// :lease, every field of its hash the same.
func TestRequeueIsAsynqs(t *testing.T) {
	ctx := context.Background()
	// Asynq's way: a server shut down while the handler still runs.
	_, theirs := redistest.New(t)
	id := enqueue(t, theirs)
	running := make(chan struct{})
	srv := asynq.NewServerFromRedisClient(theirs, asynq.Config{Concurrency: 1, Queues: map[string]int{queue: 1}, LogLevel: asynq.FatalLevel,
		ShutdownTimeout: 100 * time.Millisecond})
	if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		close(running)
		<-ctx.Done()
		return ctx.Err()
	})); err != nil {
		t.Fatal(err)
	}
	select {
	case <-running:
	case <-time.After(10 * time.Second):
		t.Fatal("the task did not start")
	}
	srv.Shutdown()
	// The sweeper's way: a lost dequeue, swept.
	_, ours := redistest.New(t)
	oid := orphan(t, ours)
	s := newSweeper(t, ours, nil)
	now := time.Now()
	if _, err := s.Sweep(ctx, now); err != nil {
		t.Fatal(err)
	}
	if moved, err := s.Sweep(ctx, now.Add(orphans.MinAfter)); err != nil || !slices.Equal(moved, []string{oid}) {
		t.Fatalf("Sweep = %v, %v; want [%s]", moved, err, oid)
	}
	type state struct {
		pending, active []string
		lease           int64
		hash            map[string]string
	}
	read := func(rdb *redis.Client, id string) state {
		h := rdb.HGetAll(ctx, key("t:"+id)).Val()
		delete(h, "msg") // the encoded task: its id differs
		return state{rdb.LRange(ctx, key("pending"), 0, -1).Val(), rdb.LRange(ctx, key("active"), 0, -1).Val(), rdb.ZCard(ctx, key("lease")).Val(), h}
	}
	a, b := read(theirs, id), read(ours, oid)
	if !slices.Equal(a.pending, []string{id}) || !slices.Equal(b.pending, []string{oid}) || len(a.active)+len(b.active) != 0 || a.lease+b.lease != 0 {
		t.Fatalf("after Asynq's requeue %+v; after the sweeper's %+v", a, b)
	}
	if !maps.Equal(a.hash, b.hash) {
		t.Fatalf("task hash after Asynq's requeue %v, after the sweeper's %v", a.hash, b.hash)
	}
}

// A lease that stands still for After is requeued, not before; a lease
// that moves in between (a heartbeat) restarts the clock.
func TestSweepWaitsForAStillLease(t *testing.T) {
	ctx := context.Background()
	_, rdb := redistest.New(t)
	id := orphan(t, rdb)
	var found []string
	s := newSweeper(t, rdb, &found)
	t0 := time.Now()
	for _, at := range []time.Duration{0, orphans.MinAfter - time.Millisecond} {
		if moved, err := s.Sweep(ctx, t0.Add(at)); err != nil || len(moved) != 0 {
			t.Fatalf("Sweep at +%v = %v, %v; want nothing moved yet", at, moved, err)
		}
	}
	// A heartbeat: the lease moves, the clock restarts.
	rdb.ZAdd(ctx, key("lease"), redis.Z{Score: float64(time.Now().Add(35 * time.Second).Unix()), Member: id})
	if moved, err := s.Sweep(ctx, t0.Add(orphans.MinAfter)); err != nil || len(moved) != 0 {
		t.Fatalf("Sweep after a heartbeat = %v, %v; want nothing moved", moved, err)
	}
	if moved, err := s.Sweep(ctx, t0.Add(2*orphans.MinAfter)); err != nil || !slices.Equal(moved, []string{id}) {
		t.Fatalf("Sweep once the new lease stood still = %v, %v; want [%s]", moved, err, id)
	}
	if !slices.Equal(found, []string{id}) {
		t.Fatalf("OnRequeued saw %v, want [%s]", found, id)
	}
	if ids := rdb.LRange(ctx, key("pending"), 0, -1).Val(); !slices.Equal(ids, []string{id}) {
		t.Fatalf("pending %v after the requeue, want [%s]", ids, id)
	}
}

// A sweep Redis did not answer forgets every observation: time without
// answers never counts towards After.
func TestUnansweredSweepRestartsTheClock(t *testing.T) {
	ctx := context.Background()
	_, rdb := redistest.New(t)
	id := orphan(t, rdb)
	s := newSweeper(t, rdb, nil)
	t0 := time.Now()
	if _, err := s.Sweep(ctx, t0); err != nil {
		t.Fatal(err)
	}
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Sweep(dead, t0.Add(time.Second)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sweep with Redis unreachable = %v, want context.Canceled", err)
	}
	if moved, err := s.Sweep(ctx, t0.Add(orphans.MinAfter)); err != nil || len(moved) != 0 {
		t.Fatalf("Sweep after the gap = %v, %v; want nothing: the observation began again", moved, err)
	}
	if moved, err := s.Sweep(ctx, t0.Add(2*orphans.MinAfter)); err != nil || !slices.Equal(moved, []string{id}) {
		t.Fatalf("Sweep = %v, %v; want [%s]", moved, err, id)
	}
}

// A task a live server lists among its active workers is never requeued,
// even with a lease that did not move (a heartbeat not yet due).
func TestListedTaskIsKept(t *testing.T) {
	sluicetest.Slow(t)
	ctx := context.Background()
	_, rdb := redistest.New(t)
	id := enqueue(t, rdb)
	running, release := make(chan struct{}), make(chan struct{})
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 1, Queues: map[string]int{queue: 1}, LogLevel: asynq.FatalLevel})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		close(running)
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	defer close(release)
	<-running
	// Asynq writes its server and worker lists on its heartbeat; wait for
	// the task to be listed (Asynq signals nothing).
	insp := asynq.NewInspectorFromRedisClient(rdb)
	sluicetest.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "the running task listed by its server", func() bool {
		servers, err := insp.Servers()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range servers {
			for _, w := range s.ActiveWorkers {
				if w.TaskID == id {
					return true
				}
			}
		}
		return false
	})
	// Two sweeps After apart in the sweeper's clock, with the lease still
	// between them in Redis's (a heartbeat moving it in between makes the
	// case vacuous, so the pair is tried again).
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			t.Fatal("a heartbeat moved the lease between two sweeps five times running")
		}
		s := newSweeper(t, rdb, nil)
		t0 := time.Now()
		before := rdb.ZScore(ctx, key("lease"), id).Val()
		if _, err := s.Sweep(ctx, t0); err != nil {
			t.Fatal(err)
		}
		moved, err := s.Sweep(ctx, t0.Add(orphans.MinAfter))
		if err != nil || len(moved) != 0 {
			t.Fatalf("Sweep = %v, %v; want nothing: the task's server lists it", moved, err)
		}
		if rdb.ZScore(ctx, key("lease"), id).Val() == before {
			return
		}
	}
}

func TestOptionsAndLifecycle(t *testing.T) {
	_, rdb := redistest.New(t)
	for name, o := range map[string]orphans.Options{
		"no queues":   {After: orphans.MinAfter},
		"short after": {Queues: []string{queue}, After: 5 * time.Second},
	} {
		if _, err := orphans.New(rdb, o); !errors.Is(err, orphans.ErrOptions) {
			t.Errorf("%s: err = %v, want ErrOptions", name, err)
		}
	}
	if _, err := orphans.New(nil, orphans.Options{Queues: []string{queue}, After: orphans.MinAfter}); !errors.Is(err, orphans.ErrOptions) {
		t.Errorf("nil client: err = %v, want ErrOptions", err)
	}
	s := newSweeper(t, rdb, nil)
	s.Stop() // never started: nothing to stop
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); !errors.Is(err, orphans.ErrOptions) {
		t.Errorf("second Start: err = %v, want ErrOptions", err)
	}
	s.Stop()
	s.Stop()
}
