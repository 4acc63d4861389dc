package pollgate_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/pollgate"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

func queues(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "gq." + strconv.Itoa(i)
	}
	return out
}

type bundle struct {
	srv   *redistest.Server
	rdb   *redis.Client // ungated: probes, subscriptions, the producer
	gated *redis.Client // the Asynq servers'
	gate  *pollgate.Gate
}

// setup starts a redis-server and a running gate over qs.
func setup(t *testing.T, qs []string, opts pollgate.Options) *bundle {
	t.Helper()
	srv, rdb := redistest.New(t)
	return setupOn(t, srv, rdb, qs, opts)
}

func setupOn(t *testing.T, srv *redistest.Server, rdb *redis.Client, qs []string, opts pollgate.Options) *bundle {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	g := pollgate.New(rdb, qs, opts)
	c, err := g.Client()
	if err != nil {
		t.Fatal(err)
	}
	gated := c.(*redis.Client)
	t.Cleanup(func() { gated.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &bundle{srv: srv, rdb: rdb, gated: gated, gate: g}
}

// waitActive waits for the gate's subscriptions (a state, polled: the gate
// offers no notification of it).
func (b *bundle) waitActive(t *testing.T, want bool) {
	t.Helper()
	sluicetest.Eventually(t, 10*time.Second, fmt.Sprintf("gate active = %v", want), func() bool { return b.gate.Active() == want })
}

// server runs an Asynq server over qs on client c, handling every task by
// sending its id on got.
func server(t *testing.T, c redis.UniversalClient, qs []string, got chan<- string, cfg asynq.Config) {
	t.Helper()
	cfg.Queues = map[string]int{}
	for _, q := range qs {
		cfg.Queues[q] = 1
	}
	if cfg.TaskCheckInterval == 0 {
		cfg.TaskCheckInterval = 100 * time.Millisecond
	}
	if cfg.DelayedTaskCheckInterval == 0 {
		cfg.DelayedTaskCheckInterval = 250 * time.Millisecond
	}
	cfg.Concurrency = 4
	cfg.LogLevel = asynq.ErrorLevel
	cfg.Logger = quiet{}
	srv := asynq.NewServerFromRedisClient(c, cfg)
	mux := asynq.NewServeMux()
	mux.HandleFunc("t", func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		if string(task.Payload()) == "fail-once" {
			if n, _ := asynq.GetRetryCount(ctx); n == 0 {
				return fmt.Errorf("first attempt fails")
			}
		}
		got <- id
		return nil
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
}

type quiet struct{}

func (quiet) Debug(...any) {}
func (quiet) Info(...any)  {}
func (quiet) Warn(...any)  {}
func (quiet) Error(...any) {}
func (quiet) Fatal(...any) {}

// evalshas counts the scripts and functions Redis ran since the last CONFIG RESETSTAT.
func evalshas(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		for _, name := range []string{"cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), name); ok {
				calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				c, _ := strconv.Atoi(calls)
				n += c
			}
		}
	}
	return n
}

// An idle Asynq server over many queues polls Redis through the gate far
// less than without it, and still takes a task the moment a producer that
// knows nothing of the gate enqueues it.
func TestIdleServerPollsLittleAndWakesOnEnqueue(t *testing.T) {
	sluicetest.Slow(t)
	qs := queues(12)
	b := setup(t, qs, pollgate.Options{Recheck: time.Minute})
	got := make(chan string, 16)
	server(t, b.gated, qs, got, asynq.Config{})
	b.waitActive(t, true)

	ctx := context.Background()
	// Measure a window of idleness (a measurement, not a synchronisation).
	b.rdb.ConfigResetStat(ctx)
	time.Sleep(2 * time.Second)
	gated := evalshas(t, b.rdb)

	// The same server without the gate, for comparison, in the same run.
	srv2, rdb2 := redistest.New(t)
	_ = srv2
	plain := make(chan string, 1)
	server(t, rdb2, qs, plain, asynq.Config{})
	time.Sleep(500 * time.Millisecond) // past its start-up work
	rdb2.ConfigResetStat(ctx)
	time.Sleep(2 * time.Second)
	ungated := evalshas(t, rdb2)
	t.Logf("scripts run by an idle server over %d queues in 2 s: %d through the gate, %d without", len(qs), gated, ungated)
	if ungated < 100 {
		t.Fatalf("the ungated server ran only %d scripts in 2 s: the comparison is void", ungated)
	}
	if gated*10 > ungated {
		t.Fatalf("through the gate the idle server ran %d scripts, without it %d: want at most a tenth", gated, ungated)
	}
	if s := b.gate.Stats(); s.Skipped == 0 {
		t.Fatalf("stats %+v: nothing skipped", s)
	}

	// A plain Asynq client (no bell of its own) enqueues into the last queue.
	client := asynq.NewClientFromRedisClient(b.rdb)
	defer client.Close()
	info, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(qs[len(qs)-1]))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != info.ID {
			t.Fatalf("got %s, want %s", id, info.ID)
		}
	case <-time.After(5 * time.Second): // the Recheck is a minute: only the invalidation can wake it
		t.Fatal("the enqueued task was not taken within 5 s")
	}
}

// Delayed tasks (scheduled by a producer, or retried after a failure) are
// forwarded when due, though the gate skips the forwarder's polls between.
func TestDelayedTasksForwardedWhenDue(t *testing.T) {
	sluicetest.Slow(t)
	qs := queues(4)
	b := setup(t, qs, pollgate.Options{Recheck: time.Minute})
	got := make(chan string, 16)
	server(t, b.gated, qs, got, asynq.Config{RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Second }})
	b.waitActive(t, true)
	client := asynq.NewClientFromRedisClient(b.rdb)
	defer client.Close()
	start := time.Now()
	sched, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(qs[1]), asynq.ProcessIn(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	retried, err := client.Enqueue(asynq.NewTask("t", []byte("fail-once")), asynq.Queue(qs[2]), asynq.MaxRetry(3))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{sched.ID: true, retried.ID: true}
	for len(want) > 0 {
		select {
		case id := <-got:
			if id == sched.ID && time.Since(start) < time.Second {
				t.Fatalf("scheduled task ran %v after enqueue, before it was due", time.Since(start))
			}
			delete(want, id)
		case <-time.After(15 * time.Second):
			t.Fatalf("not run within 15 s (Recheck is a minute): %v", want)
		}
	}
	if s := b.gate.Stats(); s.Probes == 0 || s.Skipped == 0 {
		t.Fatalf("stats %+v: the forwards were not gated", s)
	}
}

// recorder captures every script an Asynq server sends.
type recorder struct {
	mu   sync.Mutex
	cmds [][]interface{}
}

func (r *recorder) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *recorder) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (r *recorder) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name, _ := cmd.Args()[0].(string); name == "evalsha" || name == "eval" {
			r.mu.Lock()
			r.cmds = append(r.cmds, cmd.Args())
			r.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

// The gate recognises Asynq's polls by the keys they name: this pins that
// to the Asynq version in go.mod. A real server, its janitor and recoverer
// run through the gate; every script it sends is recorded (before the
// gate decides). Every kind of poll must be recognised, and no script that
// writes a task (enqueue, schedule, done, complete, retry, archive) ever is.
func TestRecognisesTheAsynqVersionInUse(t *testing.T) {
	sluicetest.Slow(t)
	qs := queues(2)
	srv, rdb := redistest.New(t)
	g := pollgate.New(rdb, qs, pollgate.Options{Recheck: time.Minute, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	rec := &recorder{}
	o := *rdb.Options()
	gated := redis.NewClient(&o)
	t.Cleanup(func() { gated.Close() })
	gated.AddHook(rec) // go-redis runs hooks in the order added: the recorder sees every call
	gated.AddHook(g.Hook())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	b := &bundle{srv: srv, rdb: rdb, gated: gated, gate: g}
	b.waitActive(t, true)

	got := make(chan string, 16)
	server(t, gated, qs, got, asynq.Config{JanitorInterval: 50 * time.Millisecond,
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Second }})
	client := asynq.NewClientFromRedisClient(gated) // the producer's writes pass the gate too
	defer client.Close()
	for i, opts := range [][]asynq.Option{
		{asynq.Queue(qs[0])}, {asynq.Queue(qs[0]), asynq.Retention(time.Hour)}, {asynq.Queue(qs[1]), asynq.ProcessIn(time.Second)},
		{asynq.Queue(qs[1]), asynq.MaxRetry(0)}, {asynq.Queue(qs[1]), asynq.MaxRetry(2)},
	} {
		payload := []byte(nil)
		if i >= 3 {
			payload = []byte("fail-once") // archived (MaxRetry 0), or retried once
		}
		if _, err := client.Enqueue(asynq.NewTask("t", payload), opts...); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 4; i++ {
		select {
		case <-got:
		case <-time.After(15 * time.Second):
			t.Fatal("tasks not processed")
		}
	}
	// Let the last task finish (a state, polled: Asynq signals nothing).
	insp := asynq.NewInspectorFromRedisClient(rdb)
	type held struct{ Active, Completed, Archived int }
	h := sluicetest.EventuallyValueEvery(t, 10*time.Second, 50*time.Millisecond, "the last task to finish (none active)", func() (held, bool) {
		var h held
		for _, q := range qs {
			qi, err := insp.GetQueueInfo(q)
			if err != nil {
				t.Fatal(err)
			}
			h.Active, h.Completed, h.Archived = h.Active+qi.Active, h.Completed+qi.Completed, h.Archived+qi.Archived
		}
		return h, h.Active == 0
	})
	if h.Active != 0 || h.Completed != 1 || h.Archived != 1 {
		t.Errorf("queues hold %d active, %d completed, %d archived; want 0, 1, 1: a write was lost", h.Active, h.Completed, h.Archived)
	}
	polls := []string{"pending,paused,active,lease", "scheduled,pending", "retry,pending", "completed", "lease"}
	recognised, seen := map[string]int{}, map[string]int{}
	rec.mu.Lock()
	for _, args := range rec.cmds {
		if name, _ := args[0].(string); name == "eval" {
			continue // the fallback after NOSCRIPT: judged as its evalsha
		}
		nk, _ := args[2].(int)
		keys := make([]string, 0, nk)
		for _, k := range args[3 : 3+nk] {
			keys = append(keys, k.(string))
		}
		sh := shape(keys)
		seen[sh]++
		if g.Recognised(redis.NewCmd(context.Background(), args...)) {
			recognised[sh]++
		}
	}
	rec.mu.Unlock()
	t.Logf("scripts by key shape: %v; recognised: %v; gate stats %+v", seen, recognised, g.Stats())
	for _, p := range polls {
		if recognised[p] == 0 || recognised[p] != seen[p] {
			t.Errorf("%q: %d seen, %d recognised: the gate no longer matches Asynq's polls", p, seen[p], recognised[p])
		}
	}
	for sh, n := range recognised {
		if !slices.Contains(polls, sh) && sh != "aggregation_sets" {
			t.Errorf("%q recognised %d times: the gate must only answer polls", sh, n)
		}
	}
	for _, w := range []string{"t,pending", "t,scheduled", "active,lease,t,processed,processed", "active,lease,completed,t,processed,processed",
		"t,active,lease,retry,processed,failed,processed,failed", "t,active,lease,archived,processed,failed,processed,failed,t"} {
		if seen[w] == 0 {
			t.Errorf("write %q not seen: the scenario no longer covers it (seen %v)", w, seen)
		}
	}
}

// shape names keys by their last segment ("asynq:{q}:pending" → pending;
// a task key → t).
func shape(keys []string) string {
	out := make([]string, len(keys))
	for i, k := range keys {
		switch {
		case strings.Contains(k, "}:t:"):
			out[i] = "t"
		case strings.Contains(k, ":processed:") || strings.Contains(k, ":failed:"):
			out[i] = k[strings.Index(k, "}:")+2 : strings.LastIndex(k, ":")]
		default:
			out[i] = k[strings.LastIndex(k, ":")+1:]
		}
	}
	return strings.Join(out, ",")
}

// Where CLIENT TRACKING is refused (an ACL here), the gate stays off and
// every poll goes to Redis: tasks are still taken.
func TestTrackingRefusedMeansPlainPolling(t *testing.T) {
	srv, admin := redistest.New(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "worker", "on", ">pw", "~*", "&*", "+@all", "-client|tracking").Err(); err != nil {
		t.Fatal(err)
	}
	o := *admin.Options()
	o.Username, o.Password = "worker", "pw"
	rdb := redis.NewClient(&o)
	t.Cleanup(func() { rdb.Close() })
	var logs sluicetest.LogBuffer
	b := setupOn(t, srv, rdb, queues(3), pollgate.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	got := make(chan string, 1)
	server(t, b.gated, queues(3), got, asynq.Config{})
	client := asynq.NewClientFromRedisClient(rdb)
	defer client.Close()
	info, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue("gq.2"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != info.ID {
			t.Fatal("wrong task")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("task not taken with the gate off")
	}
	logs.WaitFor(t, 5*time.Second, "a warning that the gate is off", func(s string) bool { return strings.Contains(s, "queue gate off") })
	if b.gate.Active() || b.gate.Stats().Skipped != 0 {
		t.Fatalf("gate active %v, stats %+v: want off, nothing answered", b.gate.Active(), b.gate.Stats())
	}
}

// A lost subscription turns the gate off until it is back, and nothing
// enqueued meanwhile is missed; a Redis restart likewise.
func TestSubscriptionLossAndRestart(t *testing.T) {
	qs := queues(3)
	b := setup(t, qs, pollgate.Options{Recheck: time.Minute})
	got := make(chan string, 16)
	server(t, b.gated, qs, got, asynq.Config{})
	b.waitActive(t, true)
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(b.rdb)
	defer client.Close()
	take := func(what string) {
		t.Helper()
		info, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(qs[0]))
		if err != nil {
			t.Fatal(err)
		}
		select {
		case id := <-got:
			if id != info.ID {
				t.Fatalf("%s: wrong task", what)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: task not taken", what)
		}
	}
	take("before")
	if err := b.rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	take("right after the subscription was killed")
	b.waitActive(t, true)
	take("after it came back")

	b.srv.Restart(t)
	take("after a Redis restart")
	b.waitActive(t, true)
	take("after the gate came back")
}

// A queue that keeps yielding tasks is not reported to the gate: Redis
// reports a key's write only when the gate read it since the last one, and
// the gate reads a queue only when a dequeue found it empty. Draining 600
// tasks costs a handful of reports, not one for every key each task writes
// (the pending and active lists, the lease, the task hash: about nine a
// task when every write under the queues' prefix was reported).
func TestABusyQueueIsNotReported(t *testing.T) {
	qs := queues(3)
	b := setup(t, qs, pollgate.Options{Recheck: time.Minute})
	b.waitActive(t, true)
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(b.rdb)
	defer client.Close()
	const n = 600
	ids := map[string]bool{}
	for i := 0; i < n; i++ {
		info, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(qs[1]))
		if err != nil {
			t.Fatal(err)
		}
		ids[info.ID] = true
	}
	before := b.gate.Stats()
	got := make(chan string, n)
	server(t, b.gated, qs, got, asynq.Config{})
	for range n {
		select {
		case id := <-got:
			if !ids[id] {
				t.Fatalf("unexpected task %s", id)
			}
			delete(ids, id)
		case <-time.After(30 * time.Second):
			t.Fatalf("%d tasks not taken in 30 s", len(ids))
		}
	}
	// Enqueue to the drained queue: the gate knows it empty now (a state
	// polled: it signals nothing), and the write is reported and wakes it.
	sluicetest.Eventually(t, 10*time.Second, "the drained queue known empty", func() bool { return b.gate.KnownEmpty("asynq:{" + qs[1] + "}:pending") })
	after := b.gate.Stats()
	reports := after.Invalidations - before.Invalidations
	t.Logf("draining %d tasks: %d keys reported written, %d probes; stats %+v", n, reports, after.Probes-before.Probes, after)
	if reports > n/20 {
		t.Fatalf("draining %d tasks reported %d writes: a busy queue's writes must not be reported", n, reports)
	}
	info, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(qs[1]))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != info.ID {
			t.Fatalf("got %s, want %s", id, info.ID)
		}
	case <-time.After(5 * time.Second): // Recheck is a minute: only the report can wake it
		t.Fatal("a task enqueued into the drained queue was not taken within 5 s")
	}
	_ = ctx
}

// The gate's reading connection is the one Redis tracks keys for: killed,
// Redis forgets what it tracked, so a write would go unreported. The gate
// notices within its reader check (2 s), forgets what it knew, and the task
// enqueued meanwhile is taken — though Recheck alone would wait an hour.
func TestAKilledReaderLosesNoWakeUp(t *testing.T) {
	qs := queues(2)
	b := setup(t, qs, pollgate.Options{Recheck: time.Hour})
	got := make(chan string, 4)
	server(t, b.gated, qs, got, asynq.Config{})
	b.waitActive(t, true)
	ctx := context.Background()
	pending := "asynq:{" + qs[0] + "}:pending"
	sluicetest.Eventually(t, 10*time.Second, "the idle queue known empty", func() bool { return b.gate.KnownEmpty(pending) })
	list, err := b.rdb.ClientList(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	killed := 0
	for _, line := range strings.Split(list, "\n") {
		var id, flags string
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			}
			if v, ok := strings.CutPrefix(f, "flags="); ok {
				flags = v
			}
		}
		if strings.Contains(flags, "t") && !strings.Contains(flags, "P") { // tracking, not the subscription
			if err := b.rdb.Do(ctx, "CLIENT", "KILL", "ID", id).Err(); err != nil {
				t.Fatal(err)
			}
			killed++
		}
	}
	if killed != 1 {
		t.Fatalf("killed %d tracking connections, want the gate's reader alone; CLIENT LIST:\n%s", killed, list)
	}
	client := asynq.NewClientFromRedisClient(b.rdb)
	defer client.Close()
	info, err := client.Enqueue(asynq.NewTask("t", nil), asynq.Queue(qs[0]))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-got:
		if id != info.ID {
			t.Fatalf("got %s, want %s", id, info.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the task enqueued after the reader was killed was not taken within 10 s")
	}
}
