// Package orphans puts back tasks Asynq holds as active that no worker
// runs, long before Asynq's own recovery would.
//
// Asynq marks a task "active" in the same script that hands it to a worker
// (its dequeue) and gives it a 30 s lease, which the owning server's
// heartbeat extends every 5 s while the task runs. Two things leave an
// active task that no worker runs: a worker killed mid-task, and a dequeue
// whose reply was lost because Redis died just after running it (the task
// is active, nobody received it). Asynq's recoverer takes such tasks back
// only once their lease has been expired for 30 s, and runs every minute:
// 60–120 s. Its interval and cutoff are not configurable.
//
// The sweeper does it sooner, from outside Asynq: a task whose lease score
// has not moved for Options.After (SLUICE_ORPHAN_AFTER) — observed by this process, with
// every observation answered by Redis, so an outage restarts the clock —
// and that no live Asynq server lists among its active workers, is put back
// at the head of its queue, in one script that first checks the lease is
// still the one observed (a heartbeat in between wins). The move is the one
// Asynq itself makes when a server shuts down with the task unfinished
// (its Requeue: active → pending, lease dropped, state pending).
//
// A live task's lease moves with every heartbeat (5 s apart) except a first
// one in the same second as the dequeue (the score is whole seconds), so it
// stands still for at most ~6 s; After is at least 11 s (one missed
// heartbeat more), 15 s by default. A worker frozen for longer than that
// (its heartbeat stopped, its handler still to resume) may see its task run
// again elsewhere; the re-run finds the earlier admission and, like any
// unknown outcome, takes a fresh slot (rerun=at-least-once) or is archived
// (at-most-once), so no window goes over.
//
// The sweeper reads and writes Asynq's private keys (asynq:{QUEUE}:active,
// :lease, :pending, :t:ID and the task hash's state field); the tests pin
// them to the Asynq version in go.mod.
package orphans

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/pollgate"
	"github.com/sluicehq/sluice/keyspace"
)

// AsynqVersion is the Asynq release whose key names and task states the
// sweeper was checked against (TestAsynqKeys); a test fails when go.mod
// names another, so an upgrade re-checks them.
const AsynqVersion = "v0.26.0"

// ErrOptions reports options a Sweeper cannot run with.
var ErrOptions = errors.New("orphans: bad options")

// requeueOrphan moves one task from active back to the head of pending
// if its lease is still the one observed; a held task whose admission a
// takeover fenced (held.go) is moved with no lease to match ("").
//
// KEYS[1] asynq:{q}:active  KEYS[2] asynq:{q}:lease
// KEYS[3] asynq:{q}:pending KEYS[4] asynq:{q}:t:<id>
// ARGV[1] task id           ARGV[2] lease score observed, or ""
var requeueOrphan = redis.NewScript(`
if ARGV[2] ~= '' then
  local s = redis.call('ZSCORE', KEYS[2], ARGV[1])
  if not s or tonumber(s) ~= tonumber(ARGV[2]) then return 0 end
end
if redis.call('LREM', KEYS[1], 0, ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('RPUSH', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[4], 'state', 'pending')
return 1
`)

// Options configure a Sweeper.
type Options struct {
	// Queues are the Asynq queues whose active tasks are watched.
	Queues []string
	// After is how long a lease must stand still (observed while Redis
	// answered) before its task counts as orphaned; at least 11 s.
	After time.Duration
	// Gate, when set, spares reading a queue's lease set it knows empty.
	Gate *pollgate.Gate
	// Logger gets one line per requeued task; nil: discarded.
	Logger *slog.Logger
	// OnRequeued is called for each task put back.
	OnRequeued func(queue, id string)
	// Held, when set, recovers the tasks workers hold waiting for their
	// slots within seconds of their worker's death (held.go).
	Held *HeldOptions
}

// MinAfter is the shortest Options.After: a live task's lease moves every
// 5 s, and may stand still ~6 s after its dequeue.
const MinAfter = 11 * time.Second

// Sweeper watches the leases of a set of queues. Start it once; Stop ends
// it and waits. Sweep runs one observation by itself (tests).
type Sweeper struct {
	rdb        redis.UniversalClient
	insp       *asynq.Inspector
	queues     []string
	gate       *pollgate.Gate // nil: every queue's leases are read every sweep
	after      time.Duration
	interval   time.Duration
	log        *slog.Logger
	onRequeued func(queue, id string)
	held       *heldState // nil: held tasks are recovered by the lease sweep only

	mu      sync.Mutex
	started bool
	cancel  context.CancelFunc
	done    chan struct{}

	// seen holds each active task's lease score and when this process
	// first saw it (monotonic clock), by queue and task id.
	seen map[taskRef]leaseSeen
}

type taskRef struct{ queue, id string }

type leaseSeen struct {
	score float64
	since time.Time
}

// New returns a Sweeper over rdb; it does nothing until Start.
func New(rdb redis.UniversalClient, opts Options) (*Sweeper, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: no Redis client", ErrOptions)
	}
	if len(opts.Queues) == 0 {
		return nil, fmt.Errorf("%w: no queues", ErrOptions)
	}
	if opts.After < MinAfter {
		return nil, fmt.Errorf("%w: After %v is below %v (a live task's lease moves every 5 s)", ErrOptions, opts.After, MinAfter)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	held, err := newHeldState(opts.Held)
	if err != nil {
		return nil, err
	}
	return &Sweeper{
		held:       held,
		rdb:        rdb,
		insp:       asynq.NewInspectorFromRedisClient(rdb),
		queues:     opts.Queues,
		gate:       opts.Gate,
		after:      opts.After,
		interval:   min(time.Second, opts.After/4),
		log:        log,
		onRequeued: opts.OnRequeued,
		seen:       map[taskRef]leaseSeen{},
	}, nil
}

// requeueKeys are requeueOrphan's keys of task id of queue: active, lease,
// pending and its hash.
func requeueKeys(queue, id string) []string {
	q := keyspace.AsynqQueue(queue)
	return []string{q.Active(), q.Lease(), q.Pending(), q.Task(id)}
}

// Start sweeps every second (or After/4) in the background until ctx ends
// or Stop. A second Start is an error.
func (s *Sweeper) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started {
		return fmt.Errorf("%w: started twice", ErrOptions)
	}
	s.started = true
	ctx, s.cancel = context.WithCancel(ctx)
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		s.run(ctx)
	}()
	return nil
}

// Stop ends the background sweeps and waits for the one in progress. It
// is safe to call more than once, and on a Sweeper never started.
func (s *Sweeper) Stop() {
	s.mu.Lock()
	cancel, done := s.cancel, s.done
	s.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// run sweeps every interval until ctx ends; with held tasks, it also
// reads the holders every held interval while the last read listed any.
func (s *Sweeper) run(ctx context.Context) {
	tick := s.interval
	if s.held != nil {
		tick = min(tick, s.held.opts.Interval)
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if now.Sub(last) >= s.interval-tick/2 {
				last = now
				if _, err := s.Sweep(ctx, time.Now()); err != nil && ctx.Err() == nil {
					s.log.Debug("orphan sweep: redis did not answer; observations start again", "err", err)
				}
				continue
			}
			if s.held != nil && s.held.holders > 0 {
				if _, err := s.SweepHeld(ctx); err != nil && ctx.Err() == nil {
					s.log.Debug("held-task sweep: redis did not answer", "err", err)
				}
			}
		}
	}
}

// Sweep observes the leases once at now and requeues the tasks found
// orphaned; it returns their ids. Sweeps of one Sweeper must not overlap
// (Start runs them one after another). Any error forgets every observation, so
// time without answers from Redis never counts towards After. A
// queue whose lease set the gate knows to be empty (no task was dequeued
// from it since it was last read empty) is not read.
func (s *Sweeper) Sweep(ctx context.Context, now time.Time) ([]string, error) {
	cctx, cancel := context.WithTimeout(ctx, s.interval)
	defer cancel()
	reads, dead, err := s.readLeases(cctx)
	if err != nil {
		clear(s.seen)
		if s.held != nil {
			s.held.forget()
		}
		return nil, err
	}
	s.confirmEmpty(cctx, reads)
	var heldMoved []string
	if dead != nil {
		if heldMoved, err = s.recoverHeld(cctx, dead); err != nil {
			s.log.Debug("held-task sweep: not every dead holder's task was taken over; the next sweep tries again", "err", err)
		}
	} else if s.held != nil {
		s.held.holders, s.held.suspects = 0, nil // known no holder
	}
	stale, scores := s.observe(reads, now)
	if len(stale) == 0 {
		return heldMoved, nil
	}
	listed, err := s.listedTasks()
	if err != nil {
		clear(s.seen)
		return nil, err
	}
	moved, err := s.requeue(cctx, stale, scores, listed)
	if err != nil {
		clear(s.seen)
		return append(heldMoved, moved...), err
	}
	return append(heldMoved, moved...), nil
}

// leaseRead is one queue's lease set as a sweep reads it.
type leaseRead struct {
	queue string
	cmd   *redis.ZSliceCmd
}

// readLeases reads the lease set of every queue the gate does not know to
// be empty, in one pipeline, and with them (when held tasks are recovered)
// the holders, unless the gate knows that list empty: a fleet whose
// workers hold nothing reads no holders, and an idle one, whose lease sets
// and holders' list the gate knows empty, reads nothing. The holders are
// read even when no lease set is: a hold whose end never reached Redis (a
// send's read that failed) leaves its holder listed after the task is
// done, and it is taken off the list only by a read that finds it silent.
func (s *Sweeper) readLeases(ctx context.Context) (reads []leaseRead, dead *redis.Cmd, err error) {
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, q := range s.queues {
			key := keyspace.AsynqQueue(q).Lease()
			if s.gate != nil && s.gate.KnownEmpty(key) {
				continue
			}
			r := leaseRead{queue: q, cmd: p.ZRangeWithScores(ctx, key, 0, -1)}
			reads = append(reads, r)
		}
		if s.readHolders() {
			dead = s.queueDead(ctx, p)
		}
		return nil
	})
	if errors.Is(err, redis.Nil) {
		err = nil
	}
	return reads, dead, err
}

// confirmEmpty has the gate confirm, on its tracking connection, the lease
// sets the sweep found empty: it then skips them until their next write.
func (s *Sweeper) confirmEmpty(ctx context.Context, reads []leaseRead) {
	if s.gate == nil {
		return
	}
	var empty []string
	for _, r := range reads {
		if len(r.cmd.Val()) == 0 && r.cmd.Err() == nil {
			empty = append(empty, keyspace.AsynqQueue(r.queue).Lease())
		}
	}
	s.gate.ConfirmEmpty(ctx, empty...)
}

// observe records the leases read at now and returns the tasks whose lease score has not moved for After,
// with every task's score. A task whose score moved starts its clock again;
// one no longer read is forgotten.
func (s *Sweeper) observe(reads []leaseRead, now time.Time) (stale []taskRef, scores map[taskRef]float64) {
	next := make(map[taskRef]leaseSeen, len(s.seen))
	scores = map[taskRef]float64{}
	for _, r := range reads {
		zs := r.cmd.Val()
		for _, z := range zs {
			id, _ := z.Member.(string)
			ref := taskRef{r.queue, id}
			scores[ref] = z.Score
			prev, ok := s.seen[ref]
			if !ok || prev.score != z.Score {
				next[ref] = leaseSeen{z.Score, now}
				continue
			}
			next[ref] = prev
			if now.Sub(prev.since) >= s.after {
				stale = append(stale, ref)
			}
		}
	}
	s.seen = next
	return stale, scores
}

// listedTasks are the ids of the tasks live Asynq servers list as running.
func (s *Sweeper) listedTasks() (map[string]bool, error) {
	servers, err := s.insp.Servers()
	if err != nil {
		return nil, err
	}
	listed := map[string]bool{}
	for _, srv := range servers {
		for _, w := range srv.ActiveWorkers {
			listed[w.TaskID] = true
		}
	}
	return listed, nil
}

// requeue puts back at the head of its queue each stale task no server
// lists, if its lease is still the score observed, and returns the ids
// moved. Errors of single tasks are joined; the others are still tried.
func (s *Sweeper) requeue(ctx context.Context, stale []taskRef, scores map[taskRef]float64, listed map[string]bool) ([]string, error) {
	var moved []string
	var errs []error
	for _, ref := range stale {
		if listed[ref.id] {
			continue
		}
		n, err := requeueOrphan.Run(ctx, s.rdb, requeueKeys(ref.queue, ref.id), ref.id, scores[ref]).Int()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		delete(s.seen, ref)
		if n == 1 {
			moved = append(moved, ref.id)
			s.log.Info("requeued an orphaned task: Asynq held it active, but its lease had not been extended and no live worker listed it",
				"task", ref.id, "queue", ref.queue, "lease_unchanged_for", s.after)
			if s.onRequeued != nil {
				s.onRequeued(ref.queue, ref.id)
			}
		}
	}
	return moved, errors.Join(errs...)
}
