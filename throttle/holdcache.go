package throttle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The hold cache (issue 52, item 5). Hold and breaker keys are global:
// every tenant's check names its channel's and its origin's holds, and a
// channel with several providers reads their breakers and holds at each
// pick. On a Cluster they live in one slot, so reading them per send
// (Reserve's read before its script, a waited send's read before its slot,
// a pick's ProviderStates) made one master carry part of every tenant's
// sends. A Limiter that watches holds (WatchHolds) serves those reads from
// memory instead:
//
//   - every write of a hold (Hold: begun or extended) and of a breaker is
//     announced on ProviderEvents by the script that writes it, in the same
//     call, and every announcement empties the cache at once, as does
//     every (re)subscription (messages sent while it was down are lost);
//   - the process that wrote empties its own cache as the write returns;
//   - a read that began before an announcement is answered but not kept;
//   - an entry is kept at most HoldCacheTTL, bounding what a lost
//     announcement can hide (a silently dead subscription is found by
//     go-redis's ping only after a second or more).
//
// So a hold or a breaker's change reaches every worker's checks within the
// announcement's latency (a round trip and the Cluster bus: milliseconds),
// and within HoldCacheTTL should the announcement be lost. A single node
// reads holds inside the check's script, exactly, and keeps doing so: the
// cache serves Clusters only.

// HoldCacheTTL is the longest a watched hold read is served from memory.
const HoldCacheTTL = 250 * time.Millisecond

// BreakerWritten is the message the breaker script announces every write
// with on ProviderEvents (the breaker's worker announces a change of its
// state itself, with ""); the hold script's is "hold", for a hold begun or
// extended.
const BreakerWritten = "breaker"

type holdCache struct {
	now func() time.Time // this process's clock (a test's own)
	mu  sync.Mutex
	// gen counts the announcements and (re)subscriptions seen; live is
	// set from the first subscription on.
	gen     uint64
	live    bool
	entries map[string]holdEntry
}

// holdEntry is a hold or breaker key as read at at (this process's
// clock): its value, nil when there is no key.
type holdEntry struct {
	val *string
	at  time.Time
}

// WatchHolds serves this Limiter's reads of hold and breaker keys on a
// Cluster (Reserve's, HeldUntil, QueueHolds, ProviderStates) from memory, kept fresh by the
// announcements on ProviderEvents (see HoldCacheTTL for the bound), until
// ctx ends. On a single node it returns at once: the check's script reads
// the holds itself.
func (l *Limiter) WatchHolds(ctx context.Context) { l.watchHolds(ctx, time.Now) }

func (l *Limiter) watchHolds(ctx context.Context, now func() time.Time) {
	if !l.batch.cluster {
		return
	}
	c := &holdCache{now: now, entries: map[string]holdEntry{}}
	l.holds.Store(c)
	defer l.holds.CompareAndSwap(c, nil)
	sub := l.client.Subscribe(ctx, l.ProviderEvents())
	defer sub.Close()
	events := sub.ChannelWithSubscriptions(redis.WithChannelHealthCheckInterval(time.Second))
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			_, subscribed := ev.(*redis.Subscription)
			c.forget(subscribed)
		}
	}
}

// forget empties the cache: an announcement, or a (re)subscription.
func (c *holdCache) forget(subscribed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.live = c.live || subscribed
	clear(c.entries)
}

// cached returns keys' values if every one is cached and fresh, with ok;
// else the generation a read from Redis starts at.
func (c *holdCache) cached(keys []string) (vals []*string, gen uint64, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live {
		return nil, c.gen, false
	}
	vals = make([]*string, len(keys))
	for i, k := range keys {
		e, found := c.entries[k]
		if !found || c.now().Sub(e.at) >= HoldCacheTTL {
			return nil, c.gen, false
		}
		vals[i] = e.val
	}
	return vals, c.gen, true
}

// keep stores a read that began at generation gen, at at, unless an
// announcement came since.
func (c *holdCache) keep(gen uint64, at time.Time, keys []string, vals []*string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen != gen || !c.live {
		return
	}
	for i, k := range keys {
		c.entries[k] = holdEntry{val: vals[i], at: at}
	}
}

// forgetHolds empties the cache (if one is watched) after this process
// wrote a hold or breaker: its own next reading sees the write whenever
// the announcement reaches it (over a Cluster's bus).
func (l *Limiter) forgetHolds() {
	if c := l.holds.Load(); c != nil {
		c.forget(false)
	}
}

// readHolds returns the ends of keys' holds (zero: none), from the cache
// when it holds them all, else from Redis in one pipeline.
func (l *Limiter) readHolds(ctx context.Context, keys []string) ([]time.Time, error) {
	raw, err := l.readRaw(ctx, keys)
	if err != nil {
		return nil, fmt.Errorf("throttle: read holds: %w", err)
	}
	return holdEnds(raw)
}

// readRaw returns keys' values (nil: no key; "" keys read as none), from
// the cache when it holds them all, else from Redis in one pipeline.
func (l *Limiter) readRaw(ctx context.Context, keys []string) ([]*string, error) {
	vals, keep := l.lookup(keys)
	if keep == nil {
		return vals, nil
	}
	var cmds []*redis.StringCmd
	_, err := l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		cmds = queueHoldReads(ctx, p, keys)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	return keep(cmds)
}

// lookup returns keys' values from the cache when it holds them all (keep
// nil); else keep, which reads the replies of queueHoldReads of keys and
// stores them unless an announcement came since this call.
func (l *Limiter) lookup(keys []string) (vals []*string, keep func([]*redis.StringCmd) ([]*string, error)) {
	c := l.holds.Load()
	var gen uint64
	var at time.Time
	if c != nil {
		vals, g, ok := c.cached(keys)
		if ok {
			return vals, nil
		}
		gen, at = g, c.now()
	}
	return nil, func(cmds []*redis.StringCmd) ([]*string, error) {
		vals, err := rawOf(cmds)
		if err != nil {
			return nil, err
		}
		if c != nil {
			c.keep(gen, at, keys, vals)
		}
		return vals, nil
	}
}

// rawOf reads the replies of queueHoldReads (a nil command: a "" key).
func rawOf(cmds []*redis.StringCmd) ([]*string, error) {
	out := make([]*string, len(cmds))
	for i, c := range cmds {
		if c == nil {
			continue
		}
		v, err := c.Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[i] = &v
	}
	return out, nil
}

// holdEnds reads hold keys' values: each hold's end, zero for a key that
// is not there.
func holdEnds(vals []*string) ([]time.Time, error) {
	out := make([]time.Time, len(vals))
	for i, v := range vals {
		if v == nil {
			continue
		}
		ms, _, _ := strings.Cut(*v, ":")
		until, err := strconv.ParseInt(ms, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("throttle: read holds: %w: %q", ErrBadRecord, *v)
		}
		out[i] = time.UnixMilli(until)
	}
	return out, nil
}
