// Package fairq dispatches each lane's waiting notifications fairly
// between tenants, so that each tenant waits only for its own backlog.
//
// Producers put a tenant's notifications in its waiting room in its
// lane's shard (tasks.Room: Asynq's group of the tenant, in enqueue order).
// A Dispatcher is a go-redis hook on the client the Asynq servers use. It
// recognises Asynq's dequeue of a lane's shard (by the keys it names, as
// internal/pollgate does) and answers it with a task of the lane chosen
// fairly:
//
//   - Between the shards of a lane, by lottery weighted by the tenants
//     waiting in each (the sum of their weights, as the shard's last
//     refill reported): a tenant's share of the lane does not depend on
//     how many others its name hashes next to.
//   - Within a shard, by start-time fair queuing over its tenants
//     (scripts/fair_refill.lua): before it dequeues from a shard whose
//     pending list runs low, it tops the list up from the rooms, in the
//     same round trip (a pipeline: the refill, then Asynq's own dequeue
//     script, unchanged, on that shard's keys).
//
// With Options.Batch, a dequeue of a lane's shard takes up to as many tasks
// of the shard picked as the lane's processors can start now, in one call
// (scripts/fair_take.lua: what Asynq's dequeue writes, for each): Asynq's
// processor gets the first, and the next dequeues of the lane are answered
// with the others, in order, without a round trip. Each is leased from the
// moment it is taken, so one taken ahead when its worker dies is recovered
// like any leased task; a worker that stops gives back what it took ahead
// (GiveBack).
//
// Asynq then runs the task as any other: its message names its queue,
// which every later step (lease, done, retry) uses. A task rescheduled or
// retried comes back straight into its queue's pending list: it had its
// turn. The legacy queue and queues without rooms are dequeued as Asynq
// asked, topped up from rooms all the same.
//
// A shard that held nothing waiting is not asked again until a write to
// one of its keys is reported (OnWrite, from internal/pollgate), or, while
// no such reports come (Notified false), until Recheck passes: an idle
// worker costs Redis nothing more. Redis reports a write only of a key read
// on the gate's tracking connection since its last write, so the dispatcher
// records a shard empty only after such a read (Confirm) of the keys a
// producer writes (the pending list, the set of tenants waiting) found
// them empty: a shard that keeps yielding tasks is never read there, and
// its tasks' writes cost nothing.
package fairq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/scripts"
	"github.com/sluicehq/sluice/tasks"
)

// Options configure a Dispatcher. The zero value of each field is its default.
type Options struct {
	// Queues are the queues the hooked client's servers dequeue: the
	// layout's lanes' shards are steered, the others dequeued as asked.
	Queues []string
	// Layout tells a lane's shards (default tasks.DefaultLayout).
	Layout tasks.Layout
	// Low and Target: a shard's pending list holding fewer than Low tasks
	// is topped up to Target from its rooms before a dequeue. Defaults 8
	// and 16. A tenant arriving behind a flood waits for at most Target of
	// it.
	Low, Target int
	// Weights returns the tenants whose weight is not 1 (the plans in
	// force, plans.Policy.Weights); nil: every tenant weighs 1.
	Weights func() map[string]int
	// Notified reports whether writes are being reported (OnWrite): while
	// it is false, what a shard held is trusted for Recheck only. Nil:
	// never.
	Notified func() bool
	// Recheck bounds how long "nothing waits in this shard" is trusted
	// without reports. Default 1s.
	Recheck time.Duration
	// Batch, if set, returns how many processors serving lane could start
	// a task now (the one asking included): a dequeue then takes up to that
	// many tasks of the shard it picks, at most Target, in one call, and
	// answers the lane's next dequeues with the rest. Nil, or below 2: one
	// task a call, as Asynq's own dequeue.
	Batch func(lane tasks.Lane) int
	// OnHand, if set, hears the id of every task a dequeue hands to Asynq's
	// processor, in the order they are handed out (each then runs at once):
	// the worker keeps one recipient's checks in that order. It must not
	// block.
	OnHand func(id string)
	// OnTake, if set, hears the ids of the tasks one dequeue took together
	// (two or more), in the order they will run: the worker checks them in
	// one call (a throttle.Cohort). It must not block.
	OnTake func(lane tasks.Lane, ids []string)
	// Confirm, if set, reads keys (of one hash slot) on the connection
	// whose reads Redis reports the next write of (internal/pollgate's
	// Gate.Confirm) and returns how many exist. A shard a refill or a
	// dequeue found empty is recorded empty only once Confirm found its
	// pending list and set of waiting tenants empty. Nil: it is recorded at
	// once (reports of every write, or Recheck alone).
	Confirm func(ctx context.Context, keys ...string) (int64, error)
	Logger  *slog.Logger
	Now     func() time.Time
}

// Stats counts what a Dispatcher did.
type Stats struct {
	Refills   uint64 // refills sent (each with a dequeue)
	Moved     uint64 // tasks moved from rooms into pending lists
	Redirects uint64 // dequeues answered from another shard of the lane than Asynq asked
	Taken     uint64 // tasks taken by dequeues that took several (Batch)
	Ahead     uint64 // dequeues answered with a task taken ahead, without a round trip
	Known     int    // queues whose rooms and pending list a refill or dequeue has read
}

// Dispatcher is the fair dispatch of a worker's Asynq servers.
type Dispatcher struct {
	rdb      redis.UniversalClient // unhooked: for the refill pipelines
	o        Options
	mu       sync.Mutex
	shards   map[string]*shard
	lanes    map[tasks.Lane][]*shard
	rand     *rand.Rand
	ahead    map[tasks.Lane][]takenTask // tasks taken ahead, oldest first; guarded by mu
	refills  atomic.Uint64
	moved    atomic.Uint64
	redirect atomic.Uint64
	taken    atomic.Uint64
	answered atomic.Uint64
}

// takenTask is a task a batched dequeue took ahead of the dequeue that
// will run it.
type takenTask struct {
	queue, id, msg string
	at             time.Time // when it was taken
}

// MaxAhead is the longest a task taken ahead waits for a processor: one
// older is put back at the head of its queue instead of run. Its lease does
// not move while it waits (no server runs it yet), so the orphan sweep of
// any worker (internal/orphans, at least 11 s) could otherwise put it back
// while it is still here to be run.
const MaxAhead = 5 * time.Second

// shard is what the dispatcher knows of one queue. Guarded by mu.
type shard struct {
	queue   string
	lane    tasks.Lane // "" for a queue that is not a lane's shard
	room    tasks.Room
	epoch   uint64    // bumped by every reported write of one of its keys
	known   bool      // the fields below are what Redis last said (less own dequeues)
	at      time.Time // when known was set
	weight  float64   // the sum of the weights of the tenants waiting in its rooms
	pending int       // its pending list's length
	// taking is held from a take of the queue until its tasks are handed
	// out or kept ahead (handOut): not guarded by mu.
	taking sync.Mutex
}

// New returns a dispatcher for the queues of o. rdb is used for the
// refills; it must not carry the dispatcher's own hook.
func New(rdb redis.UniversalClient, o Options) *Dispatcher {
	if o.Layout.Shards == 0 && o.Layout.Base == "" {
		o.Layout = tasks.DefaultLayout
	}
	if o.Low <= 0 {
		o.Low = 8
	}
	if o.Target < o.Low {
		o.Target = max(16, 2*o.Low)
	}
	if o.Recheck <= 0 {
		o.Recheck = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	d := &Dispatcher{rdb: rdb, o: o, shards: map[string]*shard{}, lanes: map[tasks.Lane][]*shard{}, ahead: map[tasks.Lane][]takenTask{},
		rand: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	for _, q := range o.Queues {
		s := &shard{queue: q, room: tasks.RoomOf(q)}
		if lane, _, ok := o.Layout.Parse(q); ok {
			s.lane = lane
			d.lanes[lane] = append(d.lanes[lane], s)
		}
		d.shards[q] = s
	}
	return d
}

// Stats returns the counts so far.
func (d *Dispatcher) Stats() Stats {
	st := Stats{Refills: d.refills.Load(), Moved: d.moved.Load(), Redirects: d.redirect.Load(), Taken: d.taken.Load(), Ahead: d.answered.Load()}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.shards {
		if s.known {
			st.Known++
		}
	}
	return st
}

// Waiting returns, per queue, the sum of the weights of the tenants the
// last refill found waiting (0 for a queue not asked yet).
func (d *Dispatcher) Waiting() map[string]float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]float64, len(d.shards))
	for q, s := range d.shards {
		out[q] = s.weight
	}
	return out
}

// OnWrite takes the keys Redis reported written (internal/pollgate's
// Options.OnWrite): a shard known to hold nothing is asked again, and a
// refill or dequeue in flight meanwhile may not record it as empty (the
// report can arrive before that reply does: they come on two connections).
func (d *Dispatcher) OnWrite(keys []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, k := range keys {
		q, _, ok := keyspace.QueueOf(k)
		if !ok {
			continue
		}
		if s := d.shards[q]; s != nil {
			s.epoch++
			if s.known && s.weight == 0 && s.pending == 0 {
				s.known = false
			}
		}
	}
}

// Forget drops what the dispatcher knows (internal/pollgate's OnForget:
// writes may have gone unreported).
func (d *Dispatcher) Forget() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.shards {
		s.epoch++
		s.known = false
	}
}

// Hook returns the go-redis hook to add, before any other, to the client
// the Asynq servers use.
func (d *Dispatcher) Hook() redis.Hook { return hook{d} }

type hook struct{ d *Dispatcher }

func (h hook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c, ok := cmd.(*redis.Cmd)
		if !ok {
			return next(ctx, cmd)
		}
		s := h.d.dequeueOf(c)
		if s == nil {
			return next(ctx, cmd)
		}
		return h.d.dequeue(ctx, c, s, next)
	}
}

// dequeueOf recognises Asynq's dequeue script by the keys it names
// (asynq v0.26: KEYS pending, paused, active, lease of one queue; ARGV the
// lease's expiry, the task key prefix) and returns its queue's shard.
func (d *Dispatcher) dequeueOf(c *redis.Cmd) *shard {
	args := c.Args()
	if len(args) != 9 {
		return nil
	}
	if name, _ := args[0].(string); name != "evalsha" && name != "eval" {
		return nil
	}
	if n, ok := args[2].(int); !ok || n != 4 {
		return nil
	}
	pending, _ := args[3].(string)
	q, rest, ok := keyspace.QueueOf(pending)
	if !ok || rest != "pending" || args[4] != keyspace.AsynqQueue(q).Paused() {
		return nil
	}
	return d.shards[q]
}

// dequeue answers c, Asynq's dequeue of asked, with a task of the shard of
// asked's lane the lottery picks, trying the lane's shards known to hold
// work until one gives a task; with none, it lets c through as Asynq made it.
func (d *Dispatcher) dequeue(ctx context.Context, c *redis.Cmd, asked *shard, next redis.ProcessHook) error {
	if t, ok := d.popAhead(ctx, asked.lane); ok {
		d.answered.Add(1)
		c.SetVal(t.msg)
		return nil
	}
	tried := map[*shard]bool{}
	for range 2 * (len(d.lanes[asked.lane]) + 1) {
		s, refill := d.pick(asked, tried)
		if s == nil {
			break
		}
		s.taking.Lock()
		got, err := d.take(ctx, c, s, refill, next)
		if err == nil {
			t := d.handOut(s.lane, got)
			s.taking.Unlock()
			if s != asked {
				d.redirect.Add(1)
			}
			c.SetVal(t.msg)
			return nil
		}
		s.taking.Unlock()
		if !errors.Is(err, redis.Nil) {
			c.SetErr(err)
			return err
		}
		if refill {
			tried[s] = true // empty even after a refill: not again this time
		}
	}
	asked.taking.Lock()
	defer asked.taking.Unlock()
	if err := next(ctx, c); err != nil {
		return err
	}
	if msg, ok := c.Val().(string); ok {
		t := d.handOut(asked.lane, []takenTask{{queue: asked.queue, id: TaskID([]byte(msg)), msg: msg, at: d.o.Now()}})
		c.SetVal(t.msg)
	}
	return nil
}

// handOut hands the oldest task of lane out, of those taken ahead and got
// (just taken, in their queue's order; appended to the ones taken ahead),
// and tells OnHand, in one critical section: so the order OnHand hears is
// each queue's order in Redis, as long as the takes of one queue and the
// hand-outs that follow them are not interleaved (shard.taking).
func (d *Dispatcher) handOut(lane tasks.Lane, got []takenTask) takenTask {
	d.mu.Lock()
	defer d.mu.Unlock()
	t := got[0]
	if lane != "" {
		q := append(d.ahead[lane], got...)
		t, q[0] = q[0], takenTask{}
		d.ahead[lane] = q[1:]
	}
	if d.o.OnHand != nil {
		d.o.OnHand(t.id)
	}
	return t
}

// pick draws the shard to dequeue from: asked itself for a queue that is
// not a lane's shard, else one of its lane's shards by lottery weighted by
// the tenants waiting in each (a shard with only pending tasks, or not
// known, weighs 1). It says whether to refill first. Nil: nothing is known
// to wait.
func (d *Dispatcher) pick(asked *shard, tried map[*shard]bool) (*shard, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.o.Now()
	trust := d.o.Notified != nil && d.o.Notified()
	fresh := func(s *shard) bool { return s.known && (trust || now.Sub(s.at) < d.o.Recheck) }
	candidates := []*shard{asked}
	if asked.lane != "" {
		candidates = d.lanes[asked.lane]
	}
	var total float64
	weights := make([]float64, len(candidates))
	for i, s := range candidates {
		switch {
		case tried[s]:
		case s.weight > 0: // stale or not: its tenants' weight, last known
			weights[i] = s.weight
		case !fresh(s), s.pending > 0:
			weights[i] = 1
		}
		total += weights[i]
	}
	if total == 0 {
		return nil, false
	}
	x := d.rand.Float64() * total
	for i, s := range candidates {
		if x < weights[i] || i == len(candidates)-1 && weights[i] > 0 {
			return s, !fresh(s) || s.pending < d.o.Low
		}
		x -= weights[i]
	}
	for i := len(candidates) - 1; i >= 0; i-- { // rounding: the last with weight
		if weights[i] > 0 {
			return candidates[i], !fresh(candidates[i]) || candidates[i].pending < d.o.Low
		}
	}
	return nil, false
}

// take runs Asynq's dequeue (c's script, on s's keys), after a refill of s
// when refill, and returns the tasks it took (several: takeMany), in their
// queue's order, or redis.Nil.
func (d *Dispatcher) take(ctx context.Context, c *redis.Cmd, s *shard, refill bool, next redis.ProcessHook) ([]takenTask, error) {
	args := append([]any(nil), c.Args()...)
	k := keyspace.AsynqQueue(s.queue)
	args[3], args[4], args[5], args[6], args[8] = k.Pending(), k.Paused(), k.Active(), k.Lease(), k.TaskPrefix()
	if k := d.batchOf(s); k > 1 {
		return d.takeMany(ctx, s, refill, args, k)
	}
	deq := redis.NewCmd(ctx, args...)
	epoch := d.epochOf(s)
	if !refill {
		if err := next(ctx, deq); err != nil {
			if errors.Is(err, redis.Nil) {
				d.learnEmpty(ctx, s, epoch, nil)
			}
			return nil, err
		}
		d.learn(s, epoch, nil, false, 1)
		return d.took(s, deq)
	}
	r, err := d.refill(ctx, s, deq)
	if err != nil {
		return nil, err
	}
	if err := deq.Err(); err != nil {
		if errors.Is(err, redis.Nil) {
			d.learnEmpty(ctx, s, epoch, r)
		} else {
			d.learn(s, epoch, r, false, 0)
		}
		return nil, err
	}
	d.learn(s, epoch, r, false, 1)
	return d.took(s, deq)
}

// took is the task Asynq's dequeue deq took of s.
func (d *Dispatcher) took(s *shard, deq *redis.Cmd) ([]takenTask, error) {
	msg, err := deq.Text()
	if err != nil {
		return nil, err
	}
	return []takenTask{{queue: s.queue, id: TaskID([]byte(msg)), msg: msg, at: d.o.Now()}}, nil
}

// learnEmpty records a dequeue of s that found nothing (after the refill
// r, if any). With Confirm, s is recorded empty only if its pending list
// and waiting tenants, read where Redis reports their next write, are
// empty; otherwise it is left unknown (asked again).
func (d *Dispatcher) learnEmpty(ctx context.Context, s *shard, epoch uint64, r *refillReply) {
	if d.o.Confirm == nil || r != nil && r.weight > 0 {
		d.learn(s, epoch, r, true, 0)
		return
	}
	epoch = d.epochOf(s)
	if n, err := d.o.Confirm(ctx, s.room.Pending, s.room.Groups); err != nil || n > 0 {
		d.mu.Lock()
		s.known = false
		d.mu.Unlock()
		return
	}
	d.learn(s, epoch, r, true, 0)
}

// epochOf reads s's epoch before a call whose reply learn will record.
func (d *Dispatcher) epochOf(s *shard) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return s.epoch
}

// refillReply is what fair_refill.lua answered.
type refillReply struct {
	moved, pending, tenants int64
	weight                  float64
}

// refill sends the refill of s and deq in one pipeline, loading the refill
// script where Redis does not have it. deq's own error (Asynq's script not
// loaded: Asynq sends it again in full) is left in deq.
func (d *Dispatcher) refill(ctx context.Context, s *shard, deq redis.Cmder) (*refillReply, error) {
	keys := []string{s.room.Pending, s.room.Groups, s.room.Fair, s.room.Clock}
	args := []any{d.o.Low, d.o.Target, s.room.TaskPrefix, s.room.GroupPrefix, strconv.FormatInt(d.o.Now().UnixNano(), 10)}
	if d.o.Weights != nil {
		for tenant, w := range d.o.Weights() {
			args = append(args, tenant, w)
		}
	}
	for attempt := 0; ; attempt++ {
		var rc *redis.Cmd
		_, _ = d.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			rc = scripts.FairRefill.EvalSha(ctx, p, keys, args...)
			_ = p.Process(ctx, deq)
			return nil
		})
		vals, err := rc.Slice()
		if err == nil {
			d.refills.Add(1)
		}
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") && attempt == 0 {
			if err := loadScripts(ctx, d.rdb, s.queue, scripts.FairRefill, scripts.FairTake); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		r, err := parseRefill(vals)
		if err == nil {
			d.moved.Add(uint64(r.moved))
		}
		return r, err
	}
}

func parseRefill(vals []any) (*refillReply, error) {
	if len(vals) != 4 {
		return nil, errors.New("fairq: refill: unexpected reply")
	}
	var r refillReply
	var ok [3]bool
	r.moved, ok[0] = vals[0].(int64)
	r.pending, ok[1] = vals[1].(int64)
	r.tenants, ok[2] = vals[2].(int64)
	w, _ := vals[3].(string)
	var err error
	if r.weight, err = strconv.ParseFloat(w, 64); err != nil || !ok[0] || !ok[1] || !ok[2] {
		return nil, errors.New("fairq: refill: unexpected reply")
	}
	return &r, nil
}

// batchOf is how many tasks a dequeue of s may take at once: 1 for a
// queue outside the lanes, or without Options.Batch.
func (d *Dispatcher) batchOf(s *shard) int {
	if d.o.Batch == nil || s.lane == "" {
		return 1
	}
	return min(d.o.Batch(s.lane), d.o.Target)
}

// takeMany takes up to k tasks of s in one call (after a refill of s when
// refill; one round trip for both) and returns them in their queue's order
// (handOut keeps those not handed out for the lane's next dequeues);
// redis.Nil when s has none. args are Asynq's dequeue's, on s's keys: its
// lease expiry and task key prefix.
func (d *Dispatcher) takeMany(ctx context.Context, s *shard, refill bool, args []any, k int) ([]takenTask, error) {
	keys := []any{args[3], args[4], args[5], args[6]}
	take := redis.NewCmd(ctx, append(append([]any{"evalsha", scripts.FairTake.Hash(), 4}, keys...), args[7], args[8], k)...)
	epoch := d.epochOf(s)
	var r *refillReply
	var err error
	if refill {
		r, err = d.refill(ctx, s, take)
		if err == nil && redis.HasErrorPrefix(take.Err(), "NOSCRIPT") {
			take.SetErr(nil)
			err = d.runLoading(ctx, s, take) // the refill was loaded, the take not
		}
	} else {
		err = d.runLoading(ctx, s, take)
	}
	if err != nil {
		return nil, err
	}
	vals, err := take.Slice()
	if err != nil {
		return nil, err
	}
	got := make([]takenTask, 0, len(vals)/2)
	for i := 0; i+1 < len(vals); i += 2 {
		id, ok1 := vals[i].(string)
		msg, ok2 := vals[i+1].(string)
		if !ok1 || !ok2 {
			return nil, errors.New("fairq: take: unexpected reply")
		}
		got = append(got, takenTask{queue: s.queue, id: id, msg: msg, at: d.o.Now()})
	}
	if len(got) == 0 {
		d.learnEmpty(ctx, s, epoch, r)
		return nil, redis.Nil
	}
	d.taken.Add(uint64(len(got)))
	if d.o.OnTake != nil && len(got) > 1 {
		ids := make([]string, len(got))
		for i, t := range got {
			ids[i] = t.id
		}
		d.o.OnTake(s.lane, ids)
	}
	d.learn(s, epoch, r, false, len(got))
	return got, nil
}

// runLoading runs cmd (an EVALSHA of one of the dispatcher's scripts) on
// the unhooked client, loading the scripts where Redis does not have them.
func (d *Dispatcher) runLoading(ctx context.Context, s *shard, cmd *redis.Cmd) error {
	for attempt := 0; ; attempt++ {
		err := d.rdb.Process(ctx, cmd)
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") && attempt == 0 {
			if err := loadScripts(ctx, d.rdb, s.queue, scripts.FairRefill, scripts.FairTake); err != nil {
				return err
			}
			cmd.SetErr(nil)
			continue
		}
		return err
	}
}

// loadScripts loads scripts on the node that holds queue's keys.
func loadScripts(ctx context.Context, rdb redis.UniversalClient, queue string, ss ...*redis.Script) error {
	for _, sc := range ss {
		if c, ok := rdb.(*redis.ClusterClient); ok {
			node, err := c.MasterForKey(ctx, keyspace.AsynqQueue(queue).Pending())
			if err != nil {
				return err
			}
			if err := sc.Load(ctx, node).Err(); err != nil {
				return err
			}
			continue
		}
		if err := sc.Load(ctx, rdb).Err(); err != nil {
			return err
		}
	}
	return nil
}

// popAhead returns the oldest task taken ahead for lane, if any. Those
// that waited longer than MaxAhead are put back in their queue instead.
func (d *Dispatcher) popAhead(ctx context.Context, lane tasks.Lane) (takenTask, bool) {
	if lane == "" {
		return takenTask{}, false
	}
	d.mu.Lock()
	q := d.ahead[lane]
	var stale []takenTask
	for len(q) > 0 && d.o.Now().Sub(q[0].at) > MaxAhead {
		stale = append(stale, q[0])
		q = q[1:]
	}
	var t takenTask
	ok := len(q) > 0
	if ok {
		t = q[0]
		q[0] = takenTask{}
		q = q[1:]
		if d.o.OnHand != nil {
			d.o.OnHand(t.id) // under mu: in the order they were taken (handOut)
		}
	}
	d.ahead[lane] = q
	d.mu.Unlock()
	if len(stale) > 0 {
		if _, err := d.untake(ctx, stale); err != nil {
			d.o.Logger.Warn("tasks taken ahead and not started in time not put back; they run elsewhere once their lease expires", "tasks", len(stale), "err", err)
		}
	}
	return t, ok
}

// Ahead returns how many tasks wait, taken ahead, for lane's processors.
func (d *Dispatcher) Ahead(lane tasks.Lane) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.ahead[lane])
}

// GiveBack puts every task taken ahead and not yet handed to a processor
// back at the head of its queue (scripts/fair_untake.lua), for a worker
// that stops taking tasks: they run elsewhere at once instead of waiting
// for their lease to expire. It returns how many it put back.
func (d *Dispatcher) GiveBack(ctx context.Context) (int, error) {
	d.mu.Lock()
	var all []takenTask
	for lane, q := range d.ahead {
		all = append(all, q...)
		delete(d.ahead, lane)
	}
	d.mu.Unlock()
	return d.untake(ctx, all)
}

// untake puts ts back at the head of their queues, in the order taken.
func (d *Dispatcher) untake(ctx context.Context, ts []takenTask) (int, error) {
	byQueue := map[string][]any{}
	var order []string
	for _, t := range ts {
		if _, ok := byQueue[t.queue]; !ok {
			order = append(order, t.queue)
		}
		byQueue[t.queue] = append(byQueue[t.queue], t.id)
	}
	n, errs := 0, []error(nil)
	for _, q := range order {
		ids := byQueue[q]
		r := tasks.RoomOf(q)
		k := keyspace.AsynqQueue(q)
		got, err := scripts.FairUntake.Run(ctx, d.rdb, []string{r.Pending, k.Active(), k.Lease()},
			append([]any{r.TaskPrefix}, ids...)...).Int()
		n += got
		if err != nil {
			errs = append(errs, fmt.Errorf("fairq: give back %d tasks of %s: %w", len(ids), q, err))
		}
	}
	return n, errors.Join(errs...)
}

// learn records what a refill (r, if any) and a dequeue (empty: it found
// nothing) of s, sent at epoch, said; taken is how many tasks the dequeue
// took. "Nothing waits" is not recorded when a write of s was reported
// since the call was sent: the reply may predate the write, whose report
// would then have been spent on a shard not yet known empty — a wake-up
// lost until Recheck, or for good while reports are trusted. (Other
// knowledge is kept: a shard with work is asked again anyway, and its own
// dequeues' writes move the epoch all the time.) With Confirm, "nothing
// waits" is recorded only from a confirmed empty dequeue (empty): a shard
// that its own dequeues emptied is asked again, and found empty then.
func (d *Dispatcher) learn(s *shard, epoch uint64, r *refillReply, empty bool, taken int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer func() {
		if s.weight == 0 && s.pending == 0 && (s.epoch != epoch || d.o.Confirm != nil && !empty) {
			s.known = false
		}
	}()
	if r != nil {
		s.known, s.at, s.weight, s.pending = true, d.o.Now(), r.weight, int(r.pending)
	}
	switch {
	case empty:
		s.pending = 0
		if r == nil && s.weight == 0 {
			s.known, s.at = true, d.o.Now()
		}
	default:
		s.pending = max(0, s.pending-taken)
	}
}

// TaskID reads the id of an Asynq task message (asynq v0.26's TaskMessage,
// protocol buffers: id is field 3); "" when it has none.
func TaskID(msg []byte) string {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return ""
		}
		msg = msg[n:]
		if num == 3 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(msg)
			if n < 0 {
				return ""
			}
			return string(v)
		}
		if n = protowire.ConsumeFieldValue(num, typ, msg); n < 0 {
			return ""
		}
		msg = msg[n:]
	}
	return ""
}
