package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/scripts"
)

// op is one operation of the limiter library as a batch carries it: its
// opcode, keys and arguments, as its encoder wrote them (ops.go).
type op struct {
	code string
	keys []string
	args []any
}

// call is an op waiting for its batch.
type call struct {
	op    *op
	nowA  string // ARGV[1]: "" for Redis TIME
	slot  int    // Cluster hash slot of the op's keys; 0 on a single node
	state atomic.Int32
	done  chan struct{}
	now   int64
	reply []int64
	err   error
}

const (
	queued int32 = iota
	taken
	abandoned
)

// batcher coalesces the calls of one Limiter: a few loops each take every
// call waiting when they are free and send them as one script call per
// Cluster slot (one round trip per node). When idle a call leaves at once.
type batcher struct {
	client    redis.UniversalClient
	cluster   bool
	direct    bool
	pipelines int
	maxBatch  int
	reqs      chan *call
	carry     chan *call // calls waiting (up to their linger) to ride with the next call
	quit      chan struct{}
	start     sync.Once
	stop      sync.Once
	wg        sync.WaitGroup
	closed    atomic.Bool
	inflight  atomic.Int32 // script calls on the wire
	// mode is how the limiter library is called: as a function (FCALL) until the
	// server shows it has none (Redis 6, miniredis, an ACL without
	// FUNCTION/FCALL), then as a script (EVALSHA).
	mode atomic.Int32
	// waitReplicas > 0: admissions wait for that many replicas (Options.WaitReplicas).
	waitReplicas int
	waitTimeout  time.Duration
}

func newBatcher(client redis.UniversalClient, opts Options) *batcher {
	b := &batcher{client: client, direct: opts.Direct, pipelines: opts.Pipelines, maxBatch: opts.MaxBatch, quit: make(chan struct{}),
		waitReplicas: opts.WaitReplicas, waitTimeout: opts.WaitTimeout}
	if b.waitTimeout <= 0 {
		b.waitTimeout = defaultWaitTimeout
	}
	_, b.cluster = client.(*redis.ClusterClient)
	if b.pipelines <= 0 {
		b.pipelines = 2
	}
	if b.maxBatch <= 0 {
		b.maxBatch = 32
	}
	b.reqs = make(chan *call, 4*b.maxBatch*b.pipelines)
	b.carry = make(chan *call, b.maxBatch)
	return b
}

// doCarried is do for an op that may wait up to linger for another call to
// carry it (one round trip for both, e.g. a done record riding with the next
// check); with no other call by then it goes alone. Like do, it returns only
// once the op ran.
func (b *batcher) doCarried(ctx context.Context, nowA, group string, o *op, linger time.Duration) (int64, []int64, error) {
	if linger <= 0 || b.direct {
		return b.do(ctx, nowA, group, o)
	}
	if b.closed.Load() {
		return 0, nil, ErrClosed
	}
	c := &call{op: o, nowA: nowA, done: make(chan struct{})}
	if b.cluster {
		c.slot = slotOf(group)
	}
	select {
	case b.carry <- c:
	default: // enough are waiting already: go as a plain call
		return b.do(ctx, nowA, group, o)
	}
	t := time.NewTimer(linger)
	defer t.Stop()
	select {
	case <-c.done:
	case <-t.C:
		if c.state.CompareAndSwap(queued, taken) {
			b.inflight.Add(1)
			b.exec(ctx, []*call{c})
			b.inflight.Add(-1)
		} else {
			<-c.done
		}
	case <-ctx.Done():
		if c.state.CompareAndSwap(queued, abandoned) {
			return 0, nil, ctx.Err()
		}
		<-c.done
	case <-b.quit:
		if c.state.CompareAndSwap(queued, abandoned) {
			return 0, nil, ErrClosed
		}
		<-c.done
	}
	return c.now, c.reply, c.err
}

// withCarried adds the calls waiting to be carried, up to maxBatch in all.
func (b *batcher) withCarried(calls []*call) []*call {
	for len(calls) < b.maxBatch {
		select {
		case c := <-b.carry:
			if c.state.CompareAndSwap(queued, taken) {
				calls = append(calls, c)
			}
		default:
			return calls
		}
	}
	return calls
}

// do runs one op and returns the batch's clock reading and the op's reply.
// A call cancelled while it waits is dropped; once its batch was sent, do
// waits for the answer (the op may have written) and returns it.
func (b *batcher) do(ctx context.Context, nowA, group string, o *op) (int64, []int64, error) {
	if b.closed.Load() {
		return 0, nil, ErrClosed
	}
	c := &call{op: o, nowA: nowA, done: make(chan struct{})}
	if b.cluster {
		c.slot = slotOf(group)
	}
	if b.direct {
		b.exec(ctx, []*call{c})
		return c.now, c.reply, c.err
	}
	// Nothing on the wire and nobody waiting: go now, on this goroutine,
	// without a hand-off; callers that come meanwhile queue for the loops.
	if b.inflight.Load() == 0 && len(b.reqs) == 0 {
		calls := b.withCarried([]*call{c})
		ectx := ctx
		if len(calls) > 1 {
			ectx = context.WithoutCancel(ctx) // the carried calls do not end with this caller
		}
		b.inflight.Add(1)
		b.exec(ectx, calls)
		b.inflight.Add(-1)
		return c.now, c.reply, c.err
	}
	b.start.Do(b.run)
	select {
	case b.reqs <- c:
	case <-ctx.Done():
		return 0, nil, ctx.Err()
	case <-b.quit:
		return 0, nil, ErrClosed
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(queued, abandoned) {
			return 0, nil, ctx.Err()
		}
		<-c.done
	}
	return c.now, c.reply, c.err
}

func (b *batcher) run() {
	for i := 0; i < b.pipelines; i++ {
		b.wg.Add(1)
		go b.loop()
	}
}

func (b *batcher) loop() {
	defer b.wg.Done()
	batch := make([]*call, 0, b.maxBatch)
	for {
		var first *call
		select {
		case first = <-b.reqs:
		case <-b.quit:
			b.drain()
			return
		}
		batch = batch[:0]
		if first.state.CompareAndSwap(queued, taken) {
			batch = append(batch, first)
		}
	more:
		for len(batch) < b.maxBatch {
			select {
			case c := <-b.reqs:
				if c.state.CompareAndSwap(queued, taken) {
					batch = append(batch, c)
				}
			default:
				break more
			}
		}
		if len(batch) > 0 {
			batch = b.withCarried(batch)
			b.inflight.Add(1)
			b.exec(context.Background(), batch)
			b.inflight.Add(-1)
		}
	}
}

// drain fails whatever is still queued after close.
func (b *batcher) drain() {
	for {
		var c *call
		select {
		case c = <-b.reqs:
		case c = <-b.carry:
		default:
			return
		}
		if c.state.CompareAndSwap(queued, taken) {
			c.err = ErrClosed
			close(c.done)
		}
	}
}

func (b *batcher) close() {
	b.stop.Do(func() {
		b.closed.Store(true)
		close(b.quit)
		b.wg.Wait()
		b.drain()
	})
}

// exec sends the calls, one script call per slot, and completes each.
func (b *batcher) exec(ctx context.Context, calls []*call) {
	defer func() {
		for _, c := range calls {
			close(c.done)
		}
	}()
	// One script call per slot and clock reading (an explicit now, for
	// tests and tools, is shared by a batch like Redis TIME is).
	groups := map[group][]*call{}
	var order []group
	for _, c := range calls {
		g := group{c.slot, c.nowA}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], c)
	}
	if b.waitReplicas > 0 {
		b.execAcked(ctx, groups, order)
		return
	}
	if len(order) == 1 {
		cs := groups[order[0]]
		keys, argv := encode(cs)
		res, err := b.call(ctx, b.client, keys, argv)
		complete(cs, res, err)
		return
	}
	cmds := make([]*redis.Cmd, len(order))
	_, _ = b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, s := range order {
			keys, argv := encode(groups[s])
			cmds[i] = queue(ctx, p, keys, argv, b.mode.Load())
		}
		return nil
	})
	for i, s := range order {
		res, err := cmds[i].Result()
		if err != nil && notLoaded(err) {
			keys, argv := encode(groups[s])
			res, err = b.call(ctx, b.client, keys, argv)
		}
		complete(groups[s], res, err)
	}
}

// The ways the limiter library is called (batcher.mode holds the first two).
const (
	modeFunction int32 = iota // FCALL, until the server shows it cannot
	modeScript                // EVALSHA, falling back to EVAL
	modeEval                  // EVAL with the script's text, for a server that lacks it
)

// call runs one call of the limiter library on c, loading the function library
// where it is missing (a new server, a Cluster master added or flushed of
// functions) and falling back to the script where there are no functions.
func (b *batcher) call(ctx context.Context, c redis.Cmdable, keys []string, argv []any) (any, error) {
	for try := 0; ; try++ {
		if b.mode.Load() == modeScript {
			return scripts.Limiter.Script.Run(ctx, c, keys, argv...).Result()
		}
		res, err := c.FCall(ctx, scripts.Limiter.Name, keys, argv...).Result()
		switch {
		case err == nil:
			return res, nil
		case noFunctions(err):
			b.mode.Store(modeScript)
		case missingFunction(err) && try == 0:
			if lerr := b.load(ctx, c); lerr != nil {
				if noFunctions(lerr) {
					b.mode.Store(modeScript)
					continue
				}
				// Not loaded (at maxmemory Redis refuses FUNCTION LOAD, not a
				// script): this call runs as the script, the next tries again.
				return scripts.Limiter.Script.Run(ctx, c, keys, argv...).Result()
			}
		default:
			return res, err
		}
	}
}

// queue adds one call of the limiter library to a pipeline, the way mode says. A
// reply that says the code is missing (notLoaded) goes through call.
func queue(ctx context.Context, p redis.Pipeliner, keys []string, argv []any, mode int32) *redis.Cmd {
	switch mode {
	case modeFunction:
		return p.FCall(ctx, scripts.Limiter.Name, keys, argv...)
	case modeEval:
		return scripts.Limiter.Script.Eval(ctx, p, keys, argv...)
	default:
		return scripts.Limiter.Script.EvalSha(ctx, p, keys, argv...)
	}
}

// load puts the limiter's function library on c's server, or on every
// master of a Cluster.
func (b *batcher) load(ctx context.Context, c redis.Cmdable) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			return n.FunctionLoadReplace(ctx, scripts.Limiter.Code).Err()
		})
	}
	return c.FunctionLoadReplace(ctx, scripts.Limiter.Code).Err()
}

// missingFunction: the server has functions but not this library.
func missingFunction(err error) bool {
	return err != nil && strings.Contains(err.Error(), "Function not found")
}

// noFunctions: the server has no functions (Redis 6, miniredis), or the
// connection's ACL user may not use them.
func noFunctions(err error) bool {
	if err == nil {
		return false
	}
	m := strings.ToLower(err.Error())
	return strings.Contains(m, "unknown command") || strings.HasPrefix(m, "noperm")
}

// notLoaded: a pipelined call found its code missing or unusable.
func notLoaded(err error) bool {
	return redis.HasErrorPrefix(err, "NOSCRIPT") || missingFunction(err) || noFunctions(err)
}

// group is the calls of a batch that travel as one script call: one Cluster
// slot, one clock reading.
type group struct {
	slot int
	now  string
}

// execAcked sends each group's script call with a WAIT behind it on one
// connection (Options.WaitReplicas), the groups in parallel: WAIT covers the
// writes of the connection it is sent on, and a Cluster slot lives on one
// master. An admission fewer replicas acknowledged fails with ErrNotReplicated.
func (b *batcher) execAcked(ctx context.Context, groups map[group][]*call, order []group) {
	if len(order) == 1 {
		b.acked(ctx, groups[order[0]])
		return
	}
	var wg sync.WaitGroup
	for _, g := range order {
		wg.Go(func() { b.acked(ctx, groups[g]) })
	}
	wg.Wait()
}

// acked runs one group's script call and, when it may admit, a WAIT, as one
// pipeline on the connection of the group's master. Redis sets a
// connection's WAIT offset after each of its commands, reads included, so
// the WAIT covers every write before the script too: also an admission that
// the script only reports (the same run asking again after a lost reply,
// its admission written by another connection).
func (b *batcher) acked(ctx context.Context, cs []*call) {
	node, err := b.master(ctx, cs[0].op.keys[0])
	if err != nil {
		complete(cs, nil, err)
		return
	}
	admits := false
	for _, c := range cs {
		admits = admits || c.op.code == opReserve || c.op.code == opPlace
	}
	keys, argv := encode(cs)
	var script *redis.Cmd
	var wait *redis.IntCmd
	send := func(mode int32) {
		_, _ = node.Pipelined(ctx, func(p redis.Pipeliner) error {
			script = queue(ctx, p, keys, argv, mode)
			if admits {
				// Pipeliner has no Wait; the pipeline's reads are bounded by
				// the client's ReadTimeout, which New checks is longer.
				wait = redis.NewIntCmd(ctx, "wait", b.waitReplicas, b.waitTimeout.Milliseconds())
				_ = p.Process(ctx, wait)
			}
			return nil
		})
	}
	send(b.mode.Load())
	res, err := script.Result()
	switch {
	case noFunctions(err):
		b.mode.Store(modeScript)
		send(modeScript)
		res, err = script.Result()
	case missingFunction(err):
		if lerr := b.load(ctx, node); lerr == nil {
			send(modeFunction)
		} else { // not loaded (at maxmemory, say): this call runs as the script
			send(modeEval)
		}
		res, err = script.Result()
	}
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		send(modeEval)
		res, err = script.Result()
	}
	if cc, ok := b.client.(*redis.ClusterClient); ok && err != nil {
		// The slot's master may have changed (a failover: MOVED, READONLY,
		// or a dead node): this call bypassed the client's redirects, so
		// have it reload the slot map for the next one.
		cc.ReloadState(ctx)
	}
	complete(cs, res, err)
	if err != nil || !admits {
		return
	}
	n, werr := wait.Result()
	if werr == nil && int(n) >= b.waitReplicas {
		return
	}
	why := fmt.Errorf("%w: %d of %d within %v", ErrNotReplicated, n, b.waitReplicas, b.waitTimeout)
	if werr != nil {
		why = fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, werr)
	}
	for _, c := range cs {
		if c.err == nil && admitted(c) {
			c.err = why
		}
	}
}

// admitted reports whether a completed call's reply lets its caller send:
// a placement in another group (P), or a reservation admitted or answered
// as a duplicate of an admission (R).
func admitted(c *call) bool {
	switch c.op.code {
	case opPlace:
		return true
	case opReserve:
		return len(c.reply) > 0 && (c.reply[0] == int64(StatusAdmitted) || c.reply[0] == int64(StatusDuplicate))
	}
	return false
}

// master is the client of the node that serves key: the single node, or the
// master of key's slot on a Cluster (New allows no other client with
// WaitReplicas).
func (b *batcher) master(ctx context.Context, key string) (*redis.Client, error) {
	switch c := b.client.(type) {
	case *redis.ClusterClient:
		return c.MasterForKey(ctx, key)
	case *redis.Client:
		return c, nil
	}
	return nil, fmt.Errorf("throttle: WaitReplicas needs a single-node or Cluster client, not %T", b.client)
}

func encode(cs []*call) ([]string, []any) {
	nk, na := 0, 2
	for _, c := range cs {
		nk += len(c.op.keys)
		na += 3 + len(c.op.args)
	}
	keys := make([]string, 0, nk)
	argv := make([]any, 0, na)
	argv = append(argv, cs[0].nowA, len(cs))
	for _, c := range cs {
		keys = append(keys, c.op.keys...)
		argv = append(argv, c.op.code, len(c.op.keys), len(c.op.args))
		argv = append(argv, c.op.args...)
	}
	return keys, argv
}

// complete hands each call its part of the batch's reply.
func complete(cs []*call, res any, err error) {
	if err != nil {
		for _, c := range cs {
			c.err = err
		}
		return
	}
	all, ok := res.([]any)
	if !ok || len(all) != len(cs)+1 {
		err := fmt.Errorf("unexpected script reply %T of %d values for %d calls", res, lenOf(res), len(cs))
		for _, c := range cs {
			c.err = err
		}
		return
	}
	now, ok := all[0].(int64)
	for i, c := range cs {
		if !ok {
			c.err = errors.New("unexpected script reply: no clock")
			continue
		}
		c.now = now
		c.reply, c.err = ints(all[i+1])
	}
}

// ints reads one op's reply: integers, or {-1, message} for an op that failed.
func ints(v any) ([]int64, error) {
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("unexpected op reply %T", v)
	}
	if len(arr) == 2 {
		if code, ok := arr[0].(int64); ok && code == -1 {
			msg, _ := arr[1].(string)
			if strings.HasPrefix(msg, "OOM ") {
				// Redis refuses a script's first write under noeviction at
				// maxmemory (a write after another one goes through, so an op
				// is all or nothing either way).
				return nil, fmt.Errorf("%w: %s", ErrOutOfMemory, strings.TrimSpace(msg))
			}
			return nil, fmt.Errorf("script: %s", strings.TrimSpace(msg))
		}
	}
	out := make([]int64, len(arr))
	for i, x := range arr {
		n, ok := x.(int64)
		if !ok {
			return nil, fmt.Errorf("unexpected op reply element %T", x)
		}
		out[i] = n
	}
	return out, nil
}

func lenOf(v any) int {
	if a, ok := v.([]any); ok {
		return len(a)
	}
	return -1
}

// slotOf is the Redis Cluster hash slot of the keys of group (their hash
// tag is the escaped group).
func slotOf(group string) int { return keyspace.Slot(keyspace.HashTag(group)) }
