// Package pollgate keeps idle Asynq servers from polling Redis.
//
// An Asynq server polls every queue it serves: a dequeue script per queue
// each TaskCheckInterval while all are empty, a forward script for each
// queue's scheduled and retry sets each DelayedTaskCheckInterval, and
// housekeeping scripts (expired completed tasks, expired leases, stale
// aggregation sets). With lanes × shards that is dozens of empty round trips
// per poll. A Gate is a go-redis hook on the client the servers use: it
// answers those scripts itself — "empty", "nothing due" — for keys it
// knows the state of, and lets every other command through untouched.
//
// It knows a key's state only from having read it itself, on a connection
// of its own whose reads Redis tracks (client-side caching, CLIENT TRACKING
// in its default mode, redirected to a subscription; one per master, Redis
// 6+): a dequeue that found a queue empty is followed by the gate's own read
// of the pending list, a sorted set's lowest score is read by a probe. Redis
// then reports the key's next write, whoever makes it — Sluice's producers,
// a plain Asynq client, a forwarder of another worker, an operator's
// redis-cli — once, and the gate forgets the key. A key the gate has not
// read since its last write is not reported again: a queue that keeps
// yielding tasks, whose keys its tasks write all the time, costs the gate
// and Redis nothing. No producer has to ring a bell and no server setting is
// needed.
//
// Safety: every piece of knowledge also expires after Recheck (then the
// script runs for real once); an observation is recorded only if no
// invalidation of the key arrived since the read was sent (epochs); while a
// subscription or its reading connection is down (reconnecting, a failover,
// CLIENT TRACKING refused by an ACL or an old server) the gate passes
// everything through, which is plain Asynq's behaviour, and a reading
// connection that reconnects makes the gate forget everything (Redis
// forgets what it tracked for the old one).
//
// The scripts are recognised by the keys they name, which are Asynq's
// private layout (asynq v0.26: "asynq:{<queue>}:pending" and friends); a
// test pins the recognition to the Asynq version in go.mod by running a
// real Asynq server through the gate.
package pollgate

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/sluicehq/sluice/keyspace"
)

// Options configure a Gate. The zero value of each field is its default.
type Options struct {
	// Recheck is the longest the gate trusts what it knows of a queue's
	// pending list and delayed sets before letting a poll through again.
	// Default 10s.
	Recheck time.Duration
	// Housekeeping is the same for the sets Asynq's janitor, recoverer and
	// aggregator read (completed, lease, aggregation sets). Default 1m.
	Housekeeping time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Now is the clock; default time.Now. Asynq scores are Unix seconds.
	Now func() time.Time
	// OnWrite, if set, hears of every key Redis reported written: a key
	// the gate read (its own states, or a caller's Confirm) written since.
	// The fair dispatch learns of work arriving in a waiting room this way.
	// It must not block.
	OnWrite func(keys []string)
	// OnForget, if set, hears that the gate forgot what it knew (a
	// subscription came up again, a message was lost): writes may have
	// gone unreported meanwhile. It must not block.
	OnForget func()
}

// Stats counts what the gate did; see Gate.Stats.
type Stats struct {
	// Passed: polls that went to Redis (unknown state, stale, or due).
	Passed uint64
	// Skipped: polls the gate answered without a round trip.
	Skipped uint64
	// Probes: reads the gate made on its tracking connections (a sorted
	// set's lowest score, a confirmation that a key is empty).
	Probes uint64
	// Invalidations: keys Redis reported written (each once per read).
	Invalidations uint64
}

type kind uint8

const (
	kPending kind = iota + 1 // list: a dequeue finds nothing while it is empty
	kDelayed                 // scheduled, retry: a forward moves nothing before the lowest score
	kHouse                   // completed, lease, aggregation sets: likewise, checked rarely
	kPaused                  // not polled: a write (pause/unpause) resets its queue's pending list
)

// state is what the gate knows of one key.
type state struct {
	kind    kind
	epoch   uint64 // bumped by every invalidation of the key
	tracked bool   // read on a tracking connection since its last invalidation: Redis will report its next write
	known   bool
	at      time.Time // when known was set
	empty   bool      // kPending: the list was empty
	due     int64     // kDelayed, kHouse: lowest score (Unix s); math.MaxInt64 when empty
	queue   *state    // kPaused: the queue's pending list
}

// Gate answers Asynq's polls of keys it knows the state of. Use Hook on
// the client the Asynq servers use, and Run to keep its subscriptions.
type Gate struct {
	rdb       redis.UniversalClient // for probes and subscriptions (not hooked)
	recheck   time.Duration
	house     time.Duration
	log       *slog.Logger
	now       func() time.Time
	onWrite   func([]string)
	onForget  func()
	mu        sync.Mutex
	keys      map[string]*state
	bellMu    sync.Mutex
	bells     map[string]*bell // by master address: Run's subscriptions and their readers
	actMu     sync.Mutex       // orders turning active on (Run) and off (a subscription's error)
	kick      chan struct{}    // a subscription came up: Run re-evaluates at once
	active    atomic.Bool      // every subscription is up: knowledge may be used
	passed    atomic.Uint64
	skipped   atomic.Uint64
	probes    atomic.Uint64
	invalided atomic.Uint64
}

// New returns a gate for the given Asynq queues. rdb is used for its
// probes and subscriptions; it must not carry the gate's own hook.
func New(rdb redis.UniversalClient, queues []string, opts Options) *Gate {
	g := &Gate{rdb: rdb, recheck: opts.Recheck, house: opts.Housekeeping, log: opts.Logger, now: opts.Now, keys: map[string]*state{}, kick: make(chan struct{}, 1),
		onWrite: opts.OnWrite, onForget: opts.OnForget, bells: map[string]*bell{}}
	if g.recheck <= 0 {
		g.recheck = 10 * time.Second
	}
	if g.house <= 0 {
		g.house = time.Minute
	}
	if g.log == nil {
		g.log = slog.Default()
	}
	if g.now == nil {
		g.now = time.Now
	}
	for _, q := range queues {
		k := keyspace.AsynqQueue(q)
		pending := &state{kind: kPending}
		g.keys[k.Pending()] = pending
		g.keys[k.Paused()] = &state{kind: kPaused, queue: pending}
		g.keys[k.Scheduled()] = &state{kind: kDelayed}
		g.keys[k.Retry()] = &state{kind: kDelayed}
		g.keys[k.Completed()] = &state{kind: kHouse}
		g.keys[k.Lease()] = &state{kind: kHouse}
		g.keys[k.AggregationSets()] = &state{kind: kHouse}
	}
	return g
}

// Active reports whether the gate is answering polls (every subscription up).
func (g *Gate) Active() bool { return g.active.Load() }

// Stats returns the gate's counters.
func (g *Gate) Stats() Stats {
	return Stats{Passed: g.passed.Load(), Skipped: g.skipped.Load(), Probes: g.probes.Load(), Invalidations: g.invalided.Load()}
}

// forgetAll drops everything known: after a (re)subscription, a lost
// message, or when the gate goes inactive.
func (g *Gate) forgetAll() {
	g.mu.Lock()
	for _, s := range g.keys {
		s.epoch++
		s.known, s.tracked = false, false
	}
	g.mu.Unlock()
	if g.onForget != nil {
		g.onForget()
	}
}

// invalidate records that Redis reported keys written.
func (g *Gate) invalidate(keys []string) {
	g.mu.Lock()
	for _, k := range keys {
		s := g.keys[k]
		if s == nil {
			continue
		}
		g.invalided.Add(1)
		if s.kind == kPaused {
			s = s.queue
		}
		s.epoch++
		s.known, s.tracked = false, false
	}
	g.mu.Unlock()
	if g.onWrite != nil {
		g.onWrite(keys)
	}
}

// fresh reports whether s is known and young enough to trust. g.mu held.
func (g *Gate) fresh(s *state, now time.Time) bool {
	if !s.known {
		return false
	}
	limit := g.recheck
	if s.kind == kHouse {
		limit = g.house
	}
	return now.Sub(s.at) < limit
}

// observe records what a read of s found, unless it was written since the
// read was sent (epoch moved). g.mu not held.
func (g *Gate) observe(s *state, epoch uint64, empty bool, due int64) {
	g.mu.Lock()
	if s.epoch == epoch {
		s.known, s.at, s.empty, s.due, s.tracked = true, g.now(), empty, due, true
	}
	g.mu.Unlock()
}

// KnownEmpty reports whether a tracked sorted set or list is known, freshly,
// to hold nothing: a reader that would only find nothing can skip it.
func (g *Gate) KnownEmpty(key string) bool {
	if !g.active.Load() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.keys[key]
	if s == nil || !g.fresh(s, g.now()) {
		return false
	}
	if s.kind == kPending {
		return s.empty
	}
	return s.due == math.MaxInt64
}

// ConfirmEmpty is for a caller whose own read found keys the gate tracks
// empty (the orphan sweep's read of the lease sets): the gate reads them
// again on its tracking connections, one pipeline per master, and knows
// those still empty empty until their next write.
func (g *Gate) ConfirmEmpty(ctx context.Context, keys ...string) {
	if !g.active.Load() {
		return
	}
	type read struct {
		s     *state
		epoch uint64
		cmd   *redis.IntCmd
	}
	byReader := map[*redis.Client][]string{}
	for _, k := range keys {
		if r, err := g.readerFor(ctx, k); err == nil {
			byReader[r] = append(byReader[r], k)
		}
	}
	for r, ks := range byReader {
		var reads []read
		_, _ = r.Pipelined(ctx, func(p redis.Pipeliner) error {
			g.mu.Lock()
			defer g.mu.Unlock()
			for _, k := range ks {
				if s := g.keys[k]; s != nil && s.kind != kPaused {
					reads = append(reads, read{s, s.epoch, p.Exists(ctx, k)})
				}
			}
			return nil
		})
		g.probes.Add(uint64(len(reads)))
		g.mu.Lock()
		for _, rd := range reads {
			if n, err := rd.cmd.Result(); err == nil && n == 0 && rd.s.epoch == rd.epoch {
				rd.s.known, rd.s.at, rd.s.empty, rd.s.due, rd.s.tracked = true, g.now(), true, math.MaxInt64, true
			}
		}
		g.mu.Unlock()
	}
}

// confirmEmpty reads key on its master's tracking connection and records it
// empty if it is and nothing was reported written since the read was sent.
func (g *Gate) confirmEmpty(ctx context.Context, s *state, key string) bool {
	g.mu.Lock()
	epoch := s.epoch
	g.mu.Unlock()
	n, err := g.Confirm(ctx, key)
	if err != nil || n != 0 {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if s.epoch != epoch {
		return false
	}
	s.known, s.at, s.empty, s.due, s.tracked = true, g.now(), true, math.MaxInt64, true
	return true
}

// Confirm reads keys — of one master: one Redis Cluster hash slot, or a
// single node — on the gate's tracking connection (EXISTS) and returns how
// many exist. From then on Redis reports the next write of each of them to
// the gate, and through it to OnWrite. A caller that learns "empty" this
// way and heard of no write of the keys since it called (OnWrite) knows
// them empty until it does. An error: nothing is tracked (the gate is down,
// or its connection to that master).
func (g *Gate) Confirm(ctx context.Context, keys ...string) (int64, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	r, err := g.readerFor(ctx, keys[0])
	if err != nil {
		return 0, err
	}
	g.probes.Add(1)
	return r.Exists(ctx, keys...).Result()
}

// poll is a recognised Asynq script call.
type poll struct {
	s      *state
	key    string
	cutoff int64 // delayed and housekeeping scripts act on scores <= cutoff
	reply  func(*redis.Cmd)
}

// classify recognises Asynq's polling scripts by the keys they name.
func (g *Gate) classify(cmd redis.Cmder) (poll, bool) {
	args := cmd.Args()
	if len(args) < 4 {
		return poll{}, false
	}
	name, _ := args[0].(string)
	if name != "evalsha" && name != "eval" {
		return poll{}, false
	}
	nk, ok := intArg(args[2])
	if !ok || nk < 1 || nk > 4 || len(args) < 3+nk {
		return poll{}, false
	}
	key0, _ := args[3].(string)
	g.mu.Lock()
	s := g.keys[key0]
	g.mu.Unlock()
	if s == nil {
		return poll{}, false
	}
	key1 := func() string { k, _ := args[4].(string); return k }
	switch {
	case s.kind == kPending && nk == 4 && key1() == key0[:len(key0)-len("pending")]+"paused":
		// dequeue: KEYS pending, paused, active, lease → a message or nil
		return poll{s: s, key: key0, reply: func(c *redis.Cmd) { c.SetErr(redis.Nil) }}, true
	case s.kind == kDelayed && nk == 2 && key1() == key0[:len(key0)-len(suffix(key0))]+"pending":
		// forward: KEYS scheduled|retry, pending; ARGV[1] now → tasks moved
		if cut, ok := argInt(args, 3+nk); ok {
			return poll{s: s, key: key0, cutoff: cut, reply: func(c *redis.Cmd) { c.SetVal(int64(0)) }}, true
		}
	case s.kind == kHouse && nk == 1:
		cut, ok := argInt(args, 4)
		if !ok {
			return poll{}, false
		}
		switch suffix(key0) {
		case "completed": // janitor: expired completed tasks deleted → count
			return poll{s: s, key: key0, cutoff: cut, reply: func(c *redis.Cmd) { c.SetVal(int64(0)) }}, true
		case "lease": // recoverer: tasks whose lease expired → messages
			return poll{s: s, key: key0, cutoff: cut, reply: func(c *redis.Cmd) { c.SetVal([]interface{}{}) }}, true
		case "aggregation_sets": // recoverer: stale aggregation sets reclaimed → OK
			return poll{s: s, key: key0, cutoff: cut, reply: func(c *redis.Cmd) { c.SetVal("OK") }}, true
		}
	}
	return poll{}, false
}

// suffix is the part of an Asynq key after its last ':'.
func suffix(key string) string {
	for i := len(key) - 1; i >= 0; i-- {
		if key[i] == ':' {
			return key[i+1:]
		}
	}
	return key
}

func intArg(v interface{}) (int, bool) {
	switch x := v.(type) {
	case int:
		return x, true
	case int64:
		return int(x), true
	case string:
		n, err := strconv.Atoi(x)
		return n, err == nil
	}
	return 0, false
}

func argInt(args []interface{}, i int) (int64, bool) {
	if i >= len(args) {
		return 0, false
	}
	switch x := args[i].(type) {
	case int64:
		return x, true
	case int:
		return int64(x), true
	case string:
		n, err := strconv.ParseInt(x, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// Hook returns the go-redis hook to add to the client the Asynq servers use.
func (g *Gate) Hook() redis.Hook { return hook{g} }

// Client returns a new client on the options of the gate's own client,
// with the gate's hook: for the Asynq servers, so that the gate's client
// (and whoever else shares it) goes untouched. Close it after them. The
// outer hooks, if any, come before the gate's: they see every call first.
func (g *Gate) Client(outer ...redis.Hook) (redis.UniversalClient, error) {
	return Clone(g.rdb, append(outer, g.Hook())...)
}

// Clone returns a new client on the options of rdb (a single-node or a
// Cluster client) with hooks, the first outermost. Close it after its users.
func Clone(rdb redis.UniversalClient, hooks ...redis.Hook) (redis.UniversalClient, error) {
	var c redis.UniversalClient
	switch r := rdb.(type) {
	case *redis.Client:
		c = redis.NewClient(cloneOptions(r.Options()))
	case *redis.ClusterClient:
		o := *r.Options()
		o.PushNotificationProcessor = nil
		o.MaintNotificationsConfig = noMaint()
		c = redis.NewClusterClient(&o)
	default:
		return nil, fmt.Errorf("pollgate: %T is neither a single-node nor a Cluster client", rdb)
	}
	for _, h := range hooks {
		c.AddHook(h)
	}
	return c, nil
}

// cloneOptions copies client options for another client: without the
// push-notification processor the first client stored in them (a second
// client must register its own), and without its maintenance-notification
// settings (noMaint).
func cloneOptions(base *redis.Options) *redis.Options {
	o := *base
	o.PushNotificationProcessor = nil
	o.MaintNotificationsConfig = noMaint()
	return &o
}

// noMaint is the maintenance-notification setting of a cloned client: off.
// The first client's own settings are not copied: go-redis writes them,
// under a lock of its own, when a connection's handshake turns the "auto"
// mode off, and copying them raced with that (the race detector, in a
// full suite run). The clones (the Asynq servers' client, the gate's
// subscriptions) ask for no maintenance events.
func noMaint() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

type hook struct{ g *Gate }

func (h hook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g := h.g
		p, ok := g.classify(cmd)
		if !ok {
			return next(ctx, cmd)
		}
		c, isCmd := cmd.(*redis.Cmd)
		if !isCmd || !g.active.Load() {
			g.passed.Add(1)
			return next(ctx, cmd)
		}
		now := g.now()
		g.mu.Lock()
		s := p.s
		epoch := s.epoch
		fresh := g.fresh(s, now)
		skip := fresh && (s.kind == kPending && s.empty || s.kind != kPending && s.due > p.cutoff)
		g.mu.Unlock()
		if skip {
			g.skipped.Add(1)
			p.reply(c)
			return c.Err()
		}
		if s.kind != kPending && !fresh {
			// Learn the lowest score first: most sets have nothing due.
			due, err := g.probe(ctx, p.key)
			if err == nil {
				g.observe(s, epoch, due == math.MaxInt64, due) // and tracked: the probe read it on its master's tracking connection
				if due > p.cutoff {
					g.mu.Lock()
					stillKnown := s.epoch == epoch
					g.mu.Unlock()
					if stillKnown {
						g.skipped.Add(1)
						p.reply(c)
						return c.Err()
					}
				}
			}
			g.mu.Lock()
			epoch = s.epoch
			g.mu.Unlock()
		}
		g.passed.Add(1)
		err := next(ctx, cmd)
		switch {
		case s.kind == kPending && err == redis.Nil:
			// Empty: read on the tracking connection, so that Redis reports
			// the next write (a busy queue is never read there) — unless it
			// still is tracked (its knowledge only aged past Recheck), which
			// the epoch tells.
			g.mu.Lock()
			still := s.tracked && s.epoch == epoch
			if still {
				s.known, s.at, s.empty = true, g.now(), true
			}
			g.mu.Unlock()
			if !still {
				g.confirmEmpty(ctx, s, p.key)
			}
		case s.kind == kPending:
			// A task, or an error: nothing learnt (it may hold more).
		case err == nil:
			// Everything due up to the cutoff is gone; the rest is not
			// known until a probe (the script's writes invalidate it anyway).
		}
		return err
	}
}

// probe reads the lowest score of a sorted set, on the tracking connection
// of its master (Redis reports its next write): math.MaxInt64 when empty.
func (g *Gate) probe(ctx context.Context, key string) (int64, error) {
	r, err := g.readerFor(ctx, key)
	if err != nil {
		return 0, err
	}
	g.probes.Add(1)
	zs, err := r.ZRangeWithScores(ctx, key, 0, 0).Result()
	if err != nil {
		return 0, err
	}
	if len(zs) == 0 {
		return math.MaxInt64, nil
	}
	return int64(zs[0].Score), nil
}
