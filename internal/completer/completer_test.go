package completer_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/completer"
	"github.com/sluicehq/sluice/internal/pollgate"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

type quiet struct{}

func (quiet) Debug(...any) {}
func (quiet) Info(...any)  {}
func (quiet) Warn(...any)  {}
func (quiet) Error(...any) {}
func (quiet) Fatal(...any) {}

// run drains n tasks of queue q with an Asynq server of concurrency conc
// on client c, and returns once every task ran and none is active.
func run(t *testing.T, c, rdb redis.UniversalClient, q string, n, conc int) {
	t.Helper()
	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()
	for i := range n {
		if _, err := client.Enqueue(asynq.NewTask("t", []byte(strconv.Itoa(i))), asynq.Queue(q)); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	wg.Add(n)
	srv := asynq.NewServerFromRedisClient(c, asynq.Config{Concurrency: conc, Queues: map[string]int{q: 1}, Logger: quiet{},
		LogLevel: asynq.FatalLevel, TaskCheckInterval: 10 * time.Millisecond})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { wg.Done(); return nil })); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	wg.Wait()
	insp := asynq.NewInspectorFromRedisClient(rdb)
	sluicetest.Eventually(t, 10*time.Second, "every task completed", func() bool {
		qi, err := insp.GetQueueInfo(q)
		return err == nil && qi.Active == 0 && qi.Processed == n
	})
}

// An Asynq server through the completer leaves Redis as Asynq's own
// completion does — no active task, no lease, no task hash, every task
// counted processed, today and in all — and writes the completions that
// arrive together in fewer round trips than tasks.
func TestCompletionsAsAsynqsInBatches(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srvA, plain := redistest.New(t)
	_ = srvA
	srvB, rdb := redistest.New(t)
	_ = srvB
	c := completer.New(rdb, completer.Options{})
	hooked, err := pollgate.Clone(rdb, c.Hook())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hooked.Close() })
	const n = 400
	run(t, plain, plain, "q", n, 20) // Asynq alone
	run(t, hooked, rdb, "q", n, 20)  // through the completer
	keys := func(r *redis.Client) map[string]string {
		out := map[string]string{}
		iter := r.Scan(ctx, 0, "asynq:{q}:*", 0).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			typ := r.Type(ctx, k).Val()
			v := typ
			if typ == "string" {
				v += "=" + r.Get(ctx, k).Val()
			}
			out[k] = v
		}
		return out
	}
	want, got := keys(plain), keys(rdb)
	if fmt.Sprint(want) != fmt.Sprint(got) {
		t.Fatalf("keys after Asynq's own completions:\n%v\nthrough the completer:\n%v", want, got)
	}
	st := c.Stats()
	t.Logf("%d tasks: stats %+v", n, st)
	if st.Completed != n {
		t.Fatalf("completer answered %d completions, want every one of %d (did Asynq's done script change?)", st.Completed, n)
	}
	if st.Batches >= n {
		t.Fatalf("%d batches for %d completions: none were written together", st.Batches, n)
	}
}

// A completion of a task no longer active (recovered by another worker,
// say) gets Asynq's NOT FOUND, and the others of its batch complete.
func TestNotFoundIsAnsweredPerTask(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, rdb := redistest.New(t)
	c := completer.New(rdb, completer.Options{})
	hooked, err := pollgate.Clone(rdb, c.Hook())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hooked.Close() })
	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()
	release := make(chan struct{})
	started := make(chan string, 2)
	srv := asynq.NewServerFromRedisClient(hooked, asynq.Config{Concurrency: 2, Queues: map[string]int{"q": 1}, Logger: quiet{},
		LogLevel: asynq.FatalLevel, TaskCheckInterval: 10 * time.Millisecond})
	if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, _ *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		started <- id
		<-release
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	for range 2 {
		if _, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue("q")); err != nil {
			t.Fatal(err)
		}
	}
	a, b := <-started, <-started
	// a vanishes from the active list while it runs.
	if err := rdb.LRem(ctx, "asynq:{q}:active", 0, a).Err(); err != nil {
		t.Fatal(err)
	}
	close(release)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	sluicetest.Eventually(t, 10*time.Second, "b completed", func() bool {
		_, err := insp.GetTaskInfo("q", b)
		return err != nil // deleted: completed
	})
	if _, err := insp.GetTaskInfo("q", a); err != nil {
		t.Fatalf("a's hash is gone (%v): its completion must have answered NOT FOUND and written nothing", err)
	}
	if got := c.Stats().Completed; got != 1 {
		t.Fatalf("%d completed, want 1 (b)", got)
	}
}

// Before adds its writes to the batch's pipeline ahead of the completions:
// every task completed has its write, and each batch's result runs once.
func TestBeforeGoesWithTheBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, rdb := redistest.New(t)
	var mu sync.Mutex
	var batches, results int
	c := completer.New(rdb, completer.Options{Before: func(ctx context.Context, p redis.Pipeliner, ids []string) func() {
		mu.Lock()
		batches++
		mu.Unlock()
		for _, id := range ids {
			p.Set(ctx, "before:"+id, "1", time.Minute)
		}
		return func() { mu.Lock(); results++; mu.Unlock() }
	}})
	hooked, err := pollgate.Clone(rdb, c.Hook())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hooked.Close() })
	const n = 200
	run(t, hooked, rdb, "q", n, 20)
	keys, err := rdb.Keys(ctx, "before:*").Result()
	if err != nil || len(keys) != n {
		t.Fatalf("%d writes of Before (%v), want one per task completed (%d)", len(keys), err, n)
	}
	mu.Lock()
	defer mu.Unlock()
	// A batch that found fair_done.lua missing is sent again once it is
	// loaded, Before's writes with it.
	if results != batches || batches == 0 || uint64(batches) < c.Stats().Batches || uint64(batches) > c.Stats().Batches+1 {
		t.Fatalf("Before called %d times, its results %d, batches %d", batches, results, c.Stats().Batches)
	}
}
