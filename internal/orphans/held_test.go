package orphans_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/orphans"
	"github.com/sluicehq/sluice/internal/pollgate"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// heldSweeper is a started sweeper recovering held tasks, whose TakeOver
// records what it was asked and answers take.
func heldSweeper(t *testing.T, rdb *redis.Client, take bool) (asked func() []orphans.HeldTask, recovered <-chan time.Duration) {
	t.Helper()
	var mu sync.Mutex
	var seen []orphans.HeldTask
	rec := make(chan time.Duration, 16)
	s, err := orphans.New(rdb, orphans.Options{Queues: []string{queue}, After: orphans.MinAfter, Held: &orphans.HeldOptions{
		TakeOver: func(_ context.Context, h orphans.HeldTask) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, h)
			return take, nil
		},
		OnRecovered: func(_ orphans.HeldTask, unseen time.Duration) { rec <- unseen },
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return func() []orphans.HeldTask {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen)
	}, rec
}

// A task a holder holds comes back to the head of its queue within
// DeadAfter + a sweep of the holder's last stamp once it stops stamping
// (its process died: no Unhold), and not while it stamps.
func TestHeldTaskOfADeadHolderIsRequeued(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, rdb := redistest.New(t)
	id := orphan(t, rdb) // active and leased, as a dequeued task is
	h := orphans.NewHolder(rdb, nil)
	hctx, die := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); h.Run(hctx) }()
	if err := h.Hold(ctx, queue, id, "run-1", "fence-1"); err != nil {
		t.Fatal(err)
	}
	asked, recovered := heldSweeper(t, rdb, true)

	// Alive for 2 s (twice DeadAfter): nothing is taken.
	time.Sleep(2 * time.Second) // the test's subject is time passing with stamps
	if a := asked(); len(a) != 0 {
		t.Fatalf("TakeOver asked for %v while the holder stamped", a)
	}
	die()
	<-done
	died := time.Now()
	var unseen time.Duration
	select {
	case unseen = <-recovered:
	case <-time.After(5 * time.Second):
		t.Fatal("the dead holder's task was not requeued within 5 s")
	}
	took := time.Since(died)
	t.Logf("requeued %v after the holder stopped (unstamped for %v by Redis's clock)", took.Round(time.Millisecond), unseen.Round(time.Millisecond))
	// Unstamped for 1 s after its last stamp (at most 250 ms before it
	// stopped), in two reads 250 ms apart: at most 1.5 s, and the 2 s the
	// issue asks for at the most, on a loaded machine too.
	if took > 2*time.Second {
		t.Errorf("requeued %v after the holder stopped; want within DeadAfter + two reads (1.5 s), 2 s at most", took)
	}
	if a := asked(); len(a) != 1 || a[0] != (orphans.HeldTask{Queue: queue, ID: id, Fence: "fence-1"}) {
		t.Fatalf("TakeOver asked for %v, want the one task with its fence", a)
	}
	if ids := rdb.LRange(ctx, key("pending"), 0, -1).Val(); !slices.Equal(ids, []string{id}) {
		t.Fatalf("pending %v, want [%s]", ids, id)
	}
	if n := rdb.LLen(ctx, key("active")).Val(); n != 0 {
		t.Fatalf("%d tasks still active", n)
	}
	// The holder's keys are gone: nothing more to read.
	sluicetest.Eventually(t, 2*time.Second, "the dead holder off the list", func() bool {
		return rdb.Exists(ctx, orphans.HoldersKey, orphans.HeldKey(h.ID())).Val() == 0
	})
}

// A takeover the fence refuses (the holder began its send) moves nothing:
// the task stays active for the lease sweep.
func TestRefusedTakeOverMovesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, rdb := redistest.New(t)
	id := orphan(t, rdb)
	h := orphans.NewHolder(rdb, nil)
	if err := h.Hold(ctx, queue, id, "run-1", "fence-1"); err != nil { // one stamp, then silence
		t.Fatal(err)
	}
	asked, _ := heldSweeper(t, rdb, false)
	sluicetest.Eventually(t, 5*time.Second, "TakeOver asked", func() bool { return len(asked()) == 1 })
	sluicetest.Eventually(t, 2*time.Second, "the entry dropped", func() bool { return rdb.Exists(ctx, orphans.HeldKey(h.ID())).Val() == 0 })
	if ids := rdb.LRange(ctx, key("active"), 0, -1).Val(); !slices.Equal(ids, []string{id}) {
		t.Fatalf("active %v, want [%s]: a refused takeover must move nothing", ids, id)
	}
}

// A holder that ends its holds stamps once more and leaves the list: a
// fleet holding nothing has no holder to read.
func TestHolderLeavesTheListWhenItHoldsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, rdb := redistest.New(t)
	h := orphans.NewHolder(rdb, nil)
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go h.Run(hctx)
	if err := h.Hold(ctx, queue, "a", "run-1", "f"); err != nil {
		t.Fatal(err)
	}
	if n := rdb.ZCard(ctx, orphans.HoldersKey).Val(); n != 1 {
		t.Fatalf("%d holders listed while holding, want 1", n)
	}
	if ttl := rdb.PTTL(ctx, orphans.HoldersKey).Val(); ttl <= 0 || ttl > orphans.HeldTTL {
		t.Fatalf("holders key TTL %v, want (0, %v]", ttl, orphans.HeldTTL)
	}
	h.Unhold(ctx, queue, "a", "run-1")
	sluicetest.Eventually(t, 2*time.Second, "the holder off the list", func() bool {
		return rdb.Exists(ctx, orphans.HoldersKey, orphans.HeldKey(h.ID())).Val() == 0
	})
}

// A holder is presumed dead only when two answered reads, an Interval
// apart, find the same old stamp, and, after a read Redis did not answer,
// only once Redis has answered the sweeper for DeadAfter again: one that stamps again in between (its stamps held up by an
// outage of Redis, say) keeps its tasks.
func TestHolderIsPresumedDeadOnTwoReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, rdb := redistest.New(t)
	id := orphan(t, rdb)
	h := orphans.NewHolder(rdb, nil)
	if err := h.Hold(ctx, queue, id, "run-1", "fence-1"); err != nil {
		t.Fatal(err)
	}
	var asked []orphans.HeldTask
	s, err := orphans.New(rdb, orphans.Options{Queues: []string{queue}, After: orphans.MinAfter, Held: &orphans.HeldOptions{
		TakeOver: func(_ context.Context, h orphans.HeldTask) (bool, error) { asked = append(asked, h); return true, nil },
	}})
	if err != nil {
		t.Fatal(err)
	}
	stale := func() { rdb.ZAddXX(ctx, orphans.HoldersKey, redis.Z{Score: 1, Member: h.ID()}) }
	sweep := func(want int) {
		t.Helper()
		if moved, err := s.SweepHeld(ctx); err != nil || len(moved) != want {
			t.Fatalf("SweepHeld = %v, %v; want %d moved", moved, err, want)
		}
	}
	// A read Redis does not answer: time until it answers again for
	// DeadAfter does not count against the holder (its stamps may have been
	// held up as the read was).
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.SweepHeld(dead); err == nil {
		t.Fatal("SweepHeld answered with its context cancelled")
	}
	stale()
	sweep(0)
	time.Sleep(orphans.BeatInterval)
	sweep(0) // stale in two reads, not yet DeadAfter of answers
	time.Sleep(orphans.DefaultDeadAfter)
	sweep(0) // a suspect
	// A stamp (a hold stamps its holder):
	if err := h.Hold(ctx, queue, "other", "run-2", "fence-2"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(orphans.BeatInterval) // the reads' spacing is what the test varies
	sweep(0)
	stale()
	sweep(0)
	sweep(0) // too soon after the first: not a confirmation
	time.Sleep(orphans.BeatInterval)
	sweep(1)
	if len(asked) != 2 {
		t.Fatalf("TakeOver asked for %v, want both of the dead holder's tasks", asked)
	}
}

// evals counts the scripts Redis ran by EVAL (the sweep's read of the
// holders rides its lease pipeline as one).
func evals(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	for _, l := range strings.Split(rdb.Info(context.Background(), "commandstats").Val(), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(l), "cmdstat_eval:calls="); ok {
			n, _ := strconv.ParseInt(strings.Split(rest, ",")[0], 10, 64)
			return n
		}
	}
	return 0
}

// With the queue gate, a sweep that found no holder has the gate track the
// holders' list and reads it no more — a busy fleet holding nothing pays
// nothing for held tasks — until a holder stamps; then it reads it again
// and takes the holder's task over when it dies.
func TestHoldersReadOnlyWhenWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, rdb := redistest.New(t)
	id := orphan(t, rdb) // leased: the sweep reads the lease set
	s := gatedSweeper(t, rdb, func(context.Context, orphans.HeldTask) (bool, error) { return true, nil })
	sweep := func() {
		t.Helper()
		if _, err := s.Sweep(ctx, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	sweep() // reads the holders: none; the gate tracks the list
	before := evals(t, rdb)
	for i := 0; i < 3; i++ {
		sweep()
	}
	if n := evals(t, rdb) - before; n != 0 {
		t.Fatalf("%d reads of an empty holders' list the gate tracks, want 0", n)
	}
	h := orphans.NewHolder(rdb, nil)
	if err := h.Hold(ctx, queue, id, "run-1", "fence-1"); err != nil { // a stamp, then silence
		t.Fatal(err)
	}
	var moved []string
	sluicetest.EventuallyEvery(t, 5*time.Second, orphans.BeatInterval, "the silent holder's task requeued", func() bool {
		m, err := s.Sweep(ctx, time.Now())
		moved = append(moved, m...)
		return err == nil && slices.Contains(moved, id)
	})
}

// A hold whose end never reached Redis (its HDel rides the read a send
// makes just before it goes, and that read failed: beside two CPU hogs,
// a context deadline) leaves the holder listed, with an entry for a task
// long done, after its last stamp. Once the holder is silent a sweep takes
// it off the list within DeadAfter and two reads, even with no task leased
// (every lease set known empty to the gate, as on a fleet gone idle);
// before, such a fleet read no holders, and the entry stayed until the
// keys' TTL (HeldTTL, a minute).
func TestSilentHolderWithAStaleEntryLeavesAnIdleList(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, rdb := redistest.New(t)
	var mu sync.Mutex
	var asked []orphans.HeldTask
	s := gatedSweeper(t, rdb, func(_ context.Context, h orphans.HeldTask) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, h)
		return false, nil // the task is done: its fence is not the sweeper's to take
	})

	h := orphans.NewHolder(rdb, nil)
	hctx, die := context.WithCancel(ctx)
	held := make(chan struct{})
	go func() { defer close(held); h.Run(hctx) }()
	if err := h.Hold(ctx, queue, "done", "run-1", "fence-1"); err != nil {
		t.Fatal(err)
	}
	p := rdb.Pipeline()
	h.QueueUnhold(ctx, p, queue, "done", "run-1")
	p.Discard() // the end of the hold never reaches Redis
	// Silence: the holder is listed (Hold stamped it; a last beat, had it
	// come, would stamp it again, its hash not empty) with the stale entry.
	die()
	<-held
	if n := rdb.HLen(ctx, orphans.HeldKey(h.ID())).Val(); n != 1 || rdb.ZScore(ctx, orphans.HoldersKey, h.ID()).Val() <= 0 {
		t.Fatalf("the holder's hash holds %d entries, listed %v; want the stale one, listed", n, rdb.ZScore(ctx, orphans.HoldersKey, h.ID()).Val())
	}
	sluicetest.EventuallyEvery(t, 5*time.Second, orphans.BeatInterval, "the silent holder off the list, no task leased", func() bool {
		if _, err := s.Sweep(ctx, time.Now()); err != nil {
			t.Fatal(err)
		}
		return rdb.Exists(ctx, orphans.HoldersKey, orphans.HeldKey(h.ID())).Val() == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 1 || asked[0] != (orphans.HeldTask{Queue: queue, ID: "done", Fence: "fence-1"}) {
		t.Fatalf("TakeOver asked for %v, want the stale entry once", asked)
	}
	if n := rdb.LLen(ctx, key("pending")).Val(); n != 0 {
		t.Fatalf("%d tasks pending: a done task was put back", n)
	}
}

// gatedSweeper is a sweeper (not started) recovering held tasks with
// takeOver, behind a running queue gate that tells it of the holders'
// list's writes.
func gatedSweeper(t *testing.T, rdb *redis.Client, takeOver func(context.Context, orphans.HeldTask) (bool, error)) *orphans.Sweeper {
	t.Helper()
	var s *orphans.Sweeper
	gate := pollgate.New(rdb, []string{queue}, pollgate.Options{
		OnWrite: func(keys []string) { s.Written(keys) }, OnForget: func() { s.Forgot() }})
	s, err := orphans.New(rdb, orphans.Options{Queues: []string{queue}, After: orphans.MinAfter, Gate: gate,
		Held: &orphans.HeldOptions{TakeOver: takeOver}})
	if err != nil {
		t.Fatal(err)
	}
	gctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); gate.Run(gctx) }()
	t.Cleanup(func() { stop(); <-done })
	sluicetest.Eventually(t, 5*time.Second, "the gate up", gate.Active)
	return s
}
