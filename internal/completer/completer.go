// Package completer completes the worker's Asynq tasks in batches.
//
// When a task's handler returns, its Asynq server completes it: one script
// call (asynq v0.26: rdb.Done) that takes the task out of the active list
// and the lease set, deletes its hash and counts it processed — a round
// trip per task. A Completer is a go-redis hook on the client the servers
// use: it recognises that call by the keys it names (as internal/pollgate
// and internal/fairq recognise theirs) and answers it from a batch: the
// completions that arrive while the previous batch is on the wire are sent
// together, one call per queue (scripts/fair_done.lua: what Asynq's script
// writes, for each task), in one round trip. A lone completion goes at
// once: nothing waits for a batch to fill. Each caller gets its own task's
// answer — OK, or Asynq's NOT FOUND — once its batch is written, so Asynq
// handles every completion as it would its own.
//
// Only Asynq's plain completion is batched; a task with a uniqueness lock
// or a retention (MarkAsComplete), a retry and an archive pass through.
package completer

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/scripts"
)

// ErrNotFound is Asynq's answer for a task no longer active, leased or
// stored (recovered by another worker meanwhile, say).
var ErrNotFound = errors.New("NOT FOUND")

// Stats counts what a Completer did.
type Stats struct {
	Completed uint64 // completions answered from batches
	Batches   uint64 // batches written (each one round trip)
}

// Options configure a Completer; the zero value of each field is its default.
type Options struct {
	// Timeout bounds each batch's round trip. Default 5s.
	Timeout time.Duration
	// Before, if set, adds to a batch's pipeline, ahead of the
	// completions, what must be written before the tasks ids are completed
	// (the worker's done records); its result runs once the pipeline ran.
	// Redis runs a pipeline's commands in order on each node. A batch sent
	// again (its script had to be loaded first) runs Before again.
	Before func(ctx context.Context, p redis.Pipeliner, ids []string) func()
}

// Completer batches the completions of the Asynq servers whose client
// carries its Hook.
type Completer struct {
	rdb     redis.UniversalClient // unhooked: for the batches
	timeout time.Duration
	before  func(ctx context.Context, p redis.Pipeliner, ids []string) func()
	mu      sync.Mutex
	skip    map[string]bool // queue + " " + id: completions answered without a write (Skip)
	queued  []*completion
	busy    bool // a batch is on the wire: new completions wait for the next
	done    atomic.Uint64
	batches atomic.Uint64
}

// New returns a completer writing its batches through rdb, which must not
// carry the completer's own hook.
func New(rdb redis.UniversalClient, o Options) *Completer {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	return &Completer{rdb: rdb, timeout: o.Timeout, before: o.Before}
}

// Stats returns the counts so far.
func (c *Completer) Stats() Stats {
	return Stats{Completed: c.done.Load(), Batches: c.batches.Load()}
}

// completion is one task's completion waiting for its batch.
type completion struct {
	cmd                    *redis.Cmd
	queue, id              string
	daily, total, expireAt string
	ready                  chan struct{}
}

// Hook returns the go-redis hook to add to the client the Asynq servers use.
func (c *Completer) Hook() redis.Hook { return hook{c} }

type hook struct{ c *Completer }

func (h hook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		rc, ok := cmd.(*redis.Cmd)
		if !ok {
			return next(ctx, cmd)
		}
		p, ok := recognise(rc)
		if !ok {
			return next(ctx, cmd)
		}
		return h.c.complete(p)
	}
}

// recognise tells Asynq's plain completion (asynq v0.26, rdb.Done without
// a uniqueness key): KEYS active, lease, the task's hash, the daily and the
// total processed counters of one queue; ARGV the id, the daily counter's
// expiry, the largest int64.
func recognise(c *redis.Cmd) (*completion, bool) {
	args := c.Args()
	if len(args) != 11 {
		return nil, false
	}
	if name, _ := args[0].(string); name != "evalsha" && name != "eval" {
		return nil, false
	}
	if n, ok := args[2].(int); !ok || n != 5 {
		return nil, false
	}
	active, _ := args[3].(string)
	q, rest, ok := keyspace.QueueOf(active)
	if !ok || rest != "active" {
		return nil, false
	}
	keys := keyspace.AsynqQueue(q)
	id, _ := args[8].(string)
	daily, _ := args[6].(string)
	if id == "" || args[4] != keys.Lease() || args[5] != keys.Task(id) || args[7] != keys.Processed() || !keys.IsProcessedOn(daily) {
		return nil, false
	}
	expireAt, ok := intString(args[9])
	if !ok {
		return nil, false
	}
	return &completion{cmd: c, queue: q, id: id, daily: daily, total: keys.Processed(), expireAt: expireAt, ready: make(chan struct{})}, true
}

func intString(v any) (string, bool) {
	switch x := v.(type) {
	case int64:
		return strconv.FormatInt(x, 10), true
	case int:
		return strconv.Itoa(x), true
	case string:
		_, err := strconv.ParseInt(x, 10, 64)
		return x, err == nil
	}
	return "", false
}

// Skip makes the next completion of task id of queue answer OK without
// writing anything: the worker no longer owns the task (another worker
// took it over and runs it again under the same id), so completing it
// would delete the other run's task.
func (c *Completer) Skip(queue, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.skip == nil {
		c.skip = map[string]bool{}
	}
	c.skip[queue+" "+id] = true
}

// complete queues p and returns once its batch was written: the first
// caller to find no batch on the wire writes every completion queued
// meanwhile, batch after batch, until none waits.
func (c *Completer) complete(p *completion) error {
	c.mu.Lock()
	if k := p.queue + " " + p.id; c.skip[k] {
		delete(c.skip, k)
		c.mu.Unlock()
		p.cmd.SetVal("OK")
		return nil
	}
	c.queued = append(c.queued, p)
	if c.busy {
		c.mu.Unlock()
		<-p.ready
		return p.cmd.Err()
	}
	c.busy = true
	for len(c.queued) > 0 {
		batch := c.queued
		c.queued = nil
		c.mu.Unlock()
		c.write(batch)
		c.mu.Lock()
	}
	c.busy = false
	c.mu.Unlock()
	return p.cmd.Err()
}

// group is the completions of one queue and daily counter in a batch.
type group struct {
	items []*completion
	cmd   *redis.Cmd
}

// write sends batch, one call per queue and daily counter, in one
// pipeline, and answers each completion.
func (c *Completer) write(batch []*completion) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	groups := map[string]*group{}
	var order []*group
	for _, p := range batch {
		k := p.daily
		g := groups[k]
		if g == nil {
			g = &group{}
			groups[k] = g
			order = append(order, g)
		}
		g.items = append(g.items, p)
	}
	var ids []string
	if c.before != nil {
		ids = make([]string, len(batch))
		for i, p := range batch {
			ids[i] = p.id
		}
	}
	for attempt := 0; ; attempt++ {
		var after func()
		_, _ = c.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			if c.before != nil {
				after = c.before(ctx, pipe, ids)
			}
			for _, g := range order {
				first := g.items[0]
				keys := keyspace.AsynqQueue(first.queue)
				args := []any{first.expireAt, strconv.FormatInt(1<<63-1, 10), keys.TaskPrefix()}
				for _, p := range g.items {
					args = append(args, p.id)
				}
				g.cmd = scripts.FairDone.EvalSha(ctx, pipe,
					[]string{keys.Active(), keys.Lease(), first.daily, first.total}, args...)
			}
			return nil
		})
		if after != nil {
			after()
		}
		if attempt == 0 && anyNoScript(order) {
			if err := c.load(ctx, order); err == nil {
				continue
			}
		}
		break
	}
	c.batches.Add(1)
	for _, g := range order {
		c.answer(g)
	}
}

func anyNoScript(gs []*group) bool {
	for _, g := range gs {
		if redis.HasErrorPrefix(g.cmd.Err(), "NOSCRIPT") {
			return true
		}
	}
	return false
}

// load loads fair_done.lua where a group's node did not have it.
func (c *Completer) load(ctx context.Context, gs []*group) error {
	cc, ok := c.rdb.(*redis.ClusterClient)
	if !ok {
		return scripts.FairDone.Load(ctx, c.rdb).Err()
	}
	var errs []error
	for _, g := range gs {
		node, err := cc.MasterForKey(ctx, keyspace.AsynqQueue(g.items[0].queue).Active())
		if err == nil {
			err = scripts.FairDone.Load(ctx, node).Err()
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// answer gives each completion of g its own answer and wakes it.
func (c *Completer) answer(g *group) {
	vals, err := g.cmd.Slice()
	if err == nil && len(vals) != len(g.items) {
		err = errors.New("completer: fair_done.lua: unexpected reply")
	}
	for i, p := range g.items {
		switch {
		case err != nil:
			p.cmd.SetErr(err)
		case vals[i] == int64(1):
			p.cmd.SetVal("OK")
			c.done.Add(1)
		default:
			p.cmd.SetErr(ErrNotFound)
		}
		close(p.ready)
	}
}
