package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/completer"
	"github.com/sluicehq/sluice/internal/fairq"
	"github.com/sluicehq/sluice/internal/orphans"
	"github.com/sluicehq/sluice/internal/pollgate"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// intake is how tasks reach the send path: the Asynq servers (the
// priority lane's, then DEQUEUERS for standard and bulk), their Redis
// client with its hooks — the fair dispatch, which dequeues in batches, the
// batched completions, the queue gate — and what the batches are sized by:
// the tasks on their way to a send, and the cohorts the tasks one dequeue
// took are checked in.
type intake struct {
	*core
	servers   []*asynq.Server
	asynqRDB  redis.UniversalClient // the servers' client, through the hooks
	gate      *pollgate.Gate        // nil: QUEUE_RECHECK=0, every queue polled
	fair      *fairq.Dispatcher     // each lane's waiting rooms, dispatched fairly, in batches
	completer *completer.Completer  // the servers' completions, in batches
	mux       *asynq.ServeMux
	busy      [2]atomic.Int64                 // tasks on their way to a send (idle): the priority lane's, the others
	seats     sync.Map                        // task id → throttle.Seat: the cohort of a batched dequeue
	order     *recipientOrder                 // one recipient's checks in hand-out order
	sweeper   atomic.Pointer[orphans.Sweeper] // hears of writes of the holders' list (gate)
}

// sweepWritten and sweepForgot pass the gate's news to the orphan sweep.
func (in *intake) sweepWritten(keys []string) {
	if s := in.sweeper.Load(); s != nil {
		s.Written(keys)
	}
}

func (in *intake) sweepForgot() {
	if s := in.sweeper.Load(); s != nil {
		s.Forgot()
	}
}

// retryDelay is Asynq's RetryDelayFunc.
func (in *intake) retryDelay(n int, err error, _ *asynq.Task) time.Duration {
	now := time.Now()
	var te *ThrottledError
	if errors.As(err, &te) {
		return max(0, te.WakeAt.Sub(now))
	}
	var ue *UnavailableError
	if errors.As(err, &ue) {
		return in.cfg.UnavailableRetry
	}
	var se *sender.SendError
	if errors.As(err, &se) && se.RetryAfter > 0 {
		return se.RetryAfter
	}
	d := in.cfg.RetryBase
	for i := 0; i < n && d < in.cfg.RetryMax; i++ {
		d *= 2
	}
	return min(d, in.cfg.RetryMax)
}
func (in *intake) handleError(ctx context.Context, t *asynq.Task, err error) {
	if !isFailure(err) {
		return // throttled or unavailable: logged where it happened
	}
	id, _ := asynq.GetTaskID(ctx)
	in.log.Debug("task attempt failed", "task_id", id, "type", t.Type(), "err", err)
}

// stopServers stops taking tasks and gives the sends in flight
// ShutdownTimeout to finish; unfinished tasks go back to the queue.
func (in *intake) stopServers(context.Context) error {
	in.log.Info("shutting down: finishing in-flight sends", "timeout", in.cfg.ShutdownTimeout)
	close(in.stopping)
	var wg sync.WaitGroup
	for _, srv := range in.servers {
		wg.Go(srv.Shutdown)
	}
	wg.Wait()
	gctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if n, err := in.fair.GiveBack(gctx); err != nil {
		in.log.Warn("tasks taken ahead not put back; they run elsewhere once their lease expires", "err", err)
	} else if n > 0 {
		in.log.Info("put back tasks taken ahead and not started", "tasks", n)
	}
	return nil
}

// startServers starts the Asynq servers; if one fails, those started stop.
func (in *intake) startServers(context.Context) error {
	for i, srv := range in.servers {
		if err := srv.Start(in.mux); err != nil {
			for _, started := range in.servers[:i] {
				started.Shutdown()
			}
			return err
		}
	}
	return nil
}

// laneClass is the index of busy for a task of queue q.
func (in *intake) laneClass(q string) int {
	if lane, _, ok := in.layout.Parse(q); ok && lane == tasks.LanePriority {
		return 0
	}
	return 1
}

// seatCohort seats the tasks one dequeue took together in a limiter
// cohort: their checks go to Redis as one call (fairq's OnTake).
func (in *intake) seatCohort(_ tasks.Lane, ids []string) {
	c := in.limiter.NewCohort(len(ids), in.cfg.CohortWait)
	for i, id := range ids {
		in.seats.Store(id, c.Seat(i))
	}
}

// onTheWay marks the task on (or off) its way to a send.
func onTheWay(ctx context.Context, busy bool) {
	if m, ok := ctx.Value(busyKey{}).(*busyMark); ok {
		m.set(busy)
	}
}

// sent marks the task off the way to a send: its request is over.
func sent(ctx context.Context) { onTheWay(ctx, false) }

// waiting marks the task off the way to a send while it waits in process
// for its slot; the returned func marks it on again.
func waiting(ctx context.Context) func() {
	m, ok := ctx.Value(busyKey{}).(*busyMark)
	if !ok {
		return func() {}
	}
	m.set(false)
	return func() { m.set(true) }
}

// idle is how many tasks of lane the worker could take now (the fair
// dispatch's Batch): its send slots (CONCURRENCY, PRIORITY_CONCURRENCY)
// less the tasks on their way to a send — being checked, or holding or
// waiting for a request slot; not those waiting in process for their slot,
// nor those whose request is over — and those already taken ahead, plus
// the tasks those slots will send within a quarter of the send slack at the
// providers' recent pace (lookahead), between 1 and DEQUEUE_BATCH. Taking
// more than can be sent soon would only age their admissions: a send that
// begins later than half the send slack after its slot gives it back and
// asks again. Against a provider that answers in 100 µs that is a whole
// batch; against one that takes 300 ms, only the idle slots.
func (in *intake) idle(lane tasks.Lane) int {
	slots, class := in.cfg.Concurrency, 1
	ahead := in.fair.Ahead(tasks.LaneStandard) + in.fair.Ahead(tasks.LaneBulk)
	if lane == tasks.LanePriority {
		slots, class, ahead = in.cfg.PriorityConcurrency, 0, in.fair.Ahead(lane)
	}
	n := slots - int(in.busy[class].Load()) - ahead
	if l := in.paceOf(); l > 0 && in.cfg.SendSlack > 0 {
		n += int(int64(slots) * int64(in.cfg.SendSlack/4) / int64(l))
	}
	return max(1, min(in.cfg.DequeueBatch, n))
}

// countMiddleware counts the tasks in the handler, by lane class: what
// idle subtracts from the processors.
func (in *intake) countMiddleware(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		q, _ := asynq.GetQueueName(ctx)
		m := &busyMark{n: &in.busy[in.laneClass(q)]}
		m.set(true)
		defer m.set(false)
		ctx = context.WithValue(ctx, busyKey{}, m)
		id, _ := asynq.GetTaskID(ctx)
		if s, ok := in.seats.LoadAndDelete(id); ok {
			h := &seatHolder{seat: s.(throttle.Seat)}
			ctx = context.WithValue(ctx, seatKey{}, h)
			defer h.seat.Leave() // a task that ends before its check frees the others
		}
		if seq, ok := in.order.start(id); ok {
			p := &orderPlace{o: in.order, seq: seq}
			ctx = context.WithValue(ctx, orderKey{}, p)
			defer p.done() // a task that ends before its check frees its place
		}
		return next.ProcessTask(ctx, t)
	})
}

// newServers builds the Asynq servers: one for the priority lane, with its
// own dequeuer and slots, so no standard or bulk task is ever ahead of a
// priority one; DEQUEUERS for the standard and bulk lanes and the legacy
// queue, each picking among the shards that hold work at random by weight
// (standard 4, bulk BULK_WEIGHT), so one tenant's shard never starves
// another's and bulk never starves standard. An Asynq server dequeues one
// task at a time (a round trip each): several take tasks side by side. They
// share the CONCURRENCY + MAX_WAITERS task slots; the providers' slots
// (CONCURRENCY each, failover.go) are the worker's, whichever server took
// the task.
func (in *intake) newServers() []*asynq.Server {
	cfg := in.cfg
	base := asynq.Config{
		IsFailure:                isFailure,
		RetryDelayFunc:           in.retryDelay,
		ErrorHandler:             asynq.ErrorHandlerFunc(in.handleError),
		Logger:                   asynqLogger{in.log.With("component", "asynq")},
		LogLevel:                 asynqLevel(cfg.LogLevel),
		ShutdownTimeout:          cfg.ShutdownTimeout,
		DelayedTaskCheckInterval: cfg.DelayedCheckInterval,
		TaskCheckInterval:        cfg.PollInterval,
	}
	prio, std := base, base
	prio.Concurrency = cfg.PriorityConcurrency + cfg.MaxWaiters
	prio.Queues = map[string]int{}
	for _, q := range in.layout.LaneQueues(tasks.LanePriority) {
		prio.Queues[q] = 1
	}
	std.Queues = map[string]int{in.layout.Legacy(): standardWeight}
	for _, q := range in.layout.LaneQueues(tasks.LaneStandard) {
		std.Queues[q] = standardWeight
	}
	for _, q := range in.layout.LaneQueues(tasks.LaneBulk) {
		std.Queues[q] = cfg.BulkWeight
	}
	servers := []*asynq.Server{asynq.NewServerFromRedisClient(in.asynqRDB, prio)}
	for _, n := range shareSlots(cfg.Concurrency+cfg.MaxWaiters, cfg.Dequeuers) {
		std.Concurrency = n
		servers = append(servers, asynq.NewServerFromRedisClient(in.asynqRDB, std))
	}
	return servers
}

// busyMark is whether a task counts as on its way to a send (idle).
type busyMark struct {
	n    *atomic.Int64
	held bool // only the task's own goroutine touches it
}

type busyKey struct{}

func (m *busyMark) set(busy bool) {
	if m.held != busy {
		m.held = busy
		if busy {
			m.n.Add(1)
		} else {
			m.n.Add(-1)
		}
	}
}

// seatHolder is a task's cohort seat, used by its first check only.
type seatHolder struct {
	seat throttle.Seat
	used bool
}

type seatKey struct{}

// takeSeat returns the task's cohort seat the first time it is asked.
func takeSeat(ctx context.Context) throttle.Seat {
	h, ok := ctx.Value(seatKey{}).(*seatHolder)
	if !ok || h.used {
		return throttle.Seat{}
	}
	h.used = true
	return h.seat
}

// shareSlots splits total task slots between k dequeuers (at most total of
// them, at least one), as evenly as whole slots go: they add up to total.
func shareSlots(total, k int) []int {
	k = max(min(k, total), 1)
	out := make([]int, k)
	for i := range out {
		out[i] = total / k
		if i < total%k {
			out[i]++
		}
	}
	return out
}

// standardWeight is each standard shard's weight in its dequeuer (bulk's is BULK_WEIGHT).
const standardWeight = 4

type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...)) }
func (a asynqLogger) Info(args ...any)  { a.l.Info(fmt.Sprint(args...)) }
func (a asynqLogger) Warn(args ...any)  { a.l.Warn(fmt.Sprint(args...)) }
func (a asynqLogger) Error(args ...any) { a.l.Error(fmt.Sprint(args...)) }
func (a asynqLogger) Fatal(args ...any) { a.l.Error(fmt.Sprint(args...)); os.Exit(1) }

func asynqLevel(s string) asynq.LogLevel {
	switch strings.ToLower(s) {
	case "debug":
		return asynq.DebugLevel
	case "warn":
		return asynq.WarnLevel
	case "error":
		return asynq.ErrorLevel
	}
	// Asynq's info level logs every retry ("Retry exhausted", ...); keep it at warn.
	return asynq.WarnLevel
}

// newIntake builds the Asynq servers' client — the fair dispatch first
// (each lane's waiting rooms served fairly between tenants, in batches),
// then the batched completions, then the queue gate (idle queues answered
// without a round trip) — and the servers on it.
func newIntake(co *core, reg prometheus.Registerer, before func(context.Context, redis.Pipeliner, []string) func()) (*intake, error) {
	cfg := co.cfg
	in := &intake{core: co, mux: asynq.NewServeMux(), order: newRecipientOrder()}
	fo := fairq.Options{Queues: co.layout.Queues(), Layout: co.layout, Batch: in.idle, OnTake: in.seatCohort, OnHand: in.order.handed, Target: max(16, cfg.DequeueBatch),
		Weights: func() map[string]int { return co.plans.Policy().Weights() },
		Recheck: cfg.PollInterval, Logger: co.log.With("component", "fair")}
	if cfg.QueueRecheck > 0 {
		in.gate = pollgate.New(co.rdb, co.layout.Queues(), pollgate.Options{Recheck: cfg.QueueRecheck,
			Logger:  co.log.With("component", "queue-gate"),
			OnWrite: func(keys []string) { in.fair.OnWrite(keys); in.sweepWritten(keys) }, OnForget: func() { in.fair.Forget(); in.sweepForgot() }})
		fo.Notified, fo.Confirm = in.gate.Active, in.gate.Confirm
	}
	in.fair = fairq.New(co.rdb, fo)
	in.completer = completer.New(co.rdb, completer.Options{Timeout: cfg.ShutdownTimeout, Before: before})
	var err error
	if in.gate != nil {
		if in.asynqRDB, err = in.gate.Client(in.fair.Hook(), in.completer.Hook()); err != nil {
			return nil, fmt.Errorf("%w: %sQUEUE_RECHECK: %w (set it to 0)", config.ErrConfig, config.EnvPrefix, err)
		}
		registerGateMetrics(reg, in.gate)
	} else if in.asynqRDB, err = pollgate.Clone(co.rdb, in.fair.Hook(), in.completer.Hook()); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	registerFairMetrics(reg, in.fair)
	registerCompleterMetrics(reg, in.completer)
	in.servers = in.newServers()
	return in, nil
}

// isFailure tells Asynq which errors count as failures (and spend a retry).
func isFailure(err error) bool {
	var te *ThrottledError
	var ue *UnavailableError
	return !errors.As(err, &te) && !errors.As(err, &ue)
}

// close closes the servers' client, once they stopped.
func (in *intake) close() {
	if in.asynqRDB != nil && in.asynqRDB != in.rdb {
		_ = in.asynqRDB.Close()
	}
}
