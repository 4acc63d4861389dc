package pollgate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// invalidations is the channel Redis sends tracking invalidations to (RESP2).
const invalidations = "__redis__:invalidate"

// ErrNoTracking reports a server that would not track keys (Redis < 6, or
// CLIENT refused by an ACL): the gate then lets every poll through.
var ErrNoTracking = errors.New("pollgate: redis refused CLIENT TRACKING")

// errNoReader: a key's master has no tracking connection up (yet).
var errNoReader = errors.New("pollgate: no tracking connection to the key's master")

// Run keeps one subscription per master until ctx ends. While they are all
// up the gate answers polls; otherwise it lets them through. It returns
// when ctx ends; setup trouble is logged and retried, never fatal (the
// worker then simply polls as plain Asynq does).
func (g *Gate) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer func() {
		g.active.Store(false)
		g.bellMu.Lock()
		for _, b := range g.bells {
			b.stop()
		}
		g.bellMu.Unlock()
		wg.Wait()
	}()
	warned := false
	refresh := func() {
		nodes, err := g.nodes(ctx)
		if err != nil {
			if ctx.Err() == nil {
				g.log.Debug("queue gate: cannot list the Redis masters; polling every queue meanwhile", "err", err)
			}
			g.actMu.Lock()
			g.setActiveLocked(false)
			g.actMu.Unlock()
			return
		}
		g.bellMu.Lock()
		for addr, b := range g.bells {
			if _, ok := nodes[addr]; !ok {
				b.stop()
				delete(g.bells, addr)
			}
		}
		for addr, opt := range nodes {
			if _, ok := g.bells[addr]; ok {
				continue
			}
			b := g.newBell(opt)
			bctx, cancel := context.WithCancel(ctx)
			b.cancel = cancel
			g.bells[addr] = b
			wg.Add(1)
			go func() { defer wg.Done(); b.run(bctx) }()
		}
		bells := make([]*bell, 0, len(g.bells))
		for _, b := range g.bells {
			bells = append(bells, b)
		}
		g.bellMu.Unlock()
		g.actMu.Lock()
		defer g.actMu.Unlock()
		up := len(bells) > 0
		for _, b := range bells {
			ok, err := b.status()
			up = up && ok
			if errors.Is(err, ErrNoTracking) && !warned {
				warned = true
				g.log.Warn("queue gate off: Redis refused CLIENT TRACKING, so idle workers poll every queue (about 3 Redis calls per queue per second)", "node", b.addr, "err", err)
			}
		}
		g.setActiveLocked(up)
	}
	refresh()
	t := time.NewTicker(min(time.Second, g.recheck/2))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			refresh()
		case <-g.kick:
			refresh()
		}
	}
}

// setActiveLocked turns the gate on or off; either way what it knew is
// dropped, since invalidations may have been missed while a subscription
// was down. g.actMu held.
func (g *Gate) setActiveLocked(up bool) {
	if g.active.Load() != up {
		g.forgetAll()
		g.active.Store(up)
		g.log.Debug("queue gate", "active", up)
	}
}

// nodes lists the masters to subscribe to, by address, with the options
// to dial each.
func (g *Gate) nodes(ctx context.Context) (map[string]*redis.Options, error) {
	out := map[string]*redis.Options{}
	switch c := g.rdb.(type) {
	case *redis.Client:
		o := c.Options()
		out[o.Addr] = o
	case *redis.ClusterClient:
		var mu sync.Mutex
		err := c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			o := node.Options()
			mu.Lock()
			out[o.Addr] = o
			mu.Unlock()
			return nil
		})
		if err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("pollgate: %T is neither a single-node nor a Cluster client", g.rdb)
	}
	return out, nil
}

// readerFor returns the tracking connection of the master that holds key.
func (g *Gate) readerFor(ctx context.Context, key string) (*redis.Client, error) {
	addr := ""
	switch c := g.rdb.(type) {
	case *redis.Client:
		addr = c.Options().Addr
	case *redis.ClusterClient:
		node, err := c.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		addr = node.Options().Addr
	}
	g.bellMu.Lock()
	b := g.bells[addr]
	g.bellMu.Unlock()
	if b == nil {
		return nil, errNoReader
	}
	if r := b.reader.Load(); r != nil {
		return r, nil
	}
	return nil, errNoReader
}

// bell is one master's tracking: a subscription that receives the
// invalidations, and a reader connection whose reads Redis tracks (the
// default mode of CLIENT TRACKING, redirected to the subscription). Redis
// reports a key once, at its first write after the reader read it: a key
// the gate does not read — a queue that keeps yielding tasks — costs
// nothing.
type bell struct {
	g          *Gate
	addr       string
	base       *redis.Options
	client     *redis.Client // the subscription
	id         atomic.Int64  // the subscription's connection id (CLIENT ID)
	reader     atomic.Pointer[redis.Client]
	cancel     context.CancelFunc
	mu         sync.Mutex
	subscribed bool      // the subscription is up (its reader may not be)
	isUp       bool      // subscribed, tracking on, and answering pings
	lastOK     time.Time // last message or pong
	err        error     // why not up
}

func (g *Gate) newBell(base *redis.Options) *bell {
	o := *cloneOptions(base)
	o.Protocol = 2 // invalidations arrive as pub/sub messages (RESP3 would push them)
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns = 1, 0, 0
	o.ReadTimeout = 0
	b := &bell{g: g, addr: base.Addr, base: base}
	user := base.OnConnect
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if user != nil {
			if err := user(ctx, cn); err != nil {
				return err
			}
		}
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			return err
		}
		b.id.Store(id)
		return nil
	}
	b.client = redis.NewClient(&o)
	return b
}

// openReader dials the connection whose reads Redis tracks for the
// subscription with id sub. Its own reconnection would lose what Redis
// tracked for it, so the gate forgets everything when it (re)connects.
func (b *bell) openReader(ctx context.Context, sub int64) (*redis.Client, error) {
	o := *cloneOptions(b.base)
	o.Protocol = 2
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns = 1, 0, 0
	user := b.base.OnConnect
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if user != nil {
			if err := user(ctx, cn); err != nil {
				return err
			}
		}
		if err := cn.Do(ctx, "CLIENT", "TRACKING", "on", "REDIRECT", sub).Err(); err != nil {
			return fmt.Errorf("%w: %w", ErrNoTracking, err)
		}
		b.g.forgetAll()
		return nil
	}
	r := redis.NewClient(&o)
	if err := r.Ping(ctx).Err(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// swapReader installs r (nil: none) and closes the one before.
func (b *bell) swapReader(r *redis.Client) {
	if old := b.reader.Swap(r); old != nil {
		old.Close()
	}
}

func (b *bell) setErr(err error) {
	b.mu.Lock()
	b.isUp, b.err = false, err
	b.mu.Unlock()
}

// status reports whether the subscription is up and recently heard from.
func (b *bell) status() (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.isUp && time.Since(b.lastOK) < b.g.recheck/2+5*time.Second, b.err
}

func (b *bell) stop() {
	if b.cancel != nil {
		b.cancel()
	}
}

// run receives invalidations until ctx ends, reconnecting (and tracking
// again) on errors. Any gap forgets everything the gate knew.
func (b *bell) run(ctx context.Context) {
	defer b.client.Close()
	defer b.swapReader(nil)
	backoff := 100 * time.Millisecond
	ps := b.client.Subscribe(ctx, invalidations)
	defer ps.Close()
	// A read blocks for up to readerCheck whatever ctx says: closing the
	// subscription when ctx ends lets Run stop at once.
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
			_ = ps.Close()
		case <-stopped:
		}
	}()
	checked := time.Now()
	for ctx.Err() == nil {
		if time.Since(checked) >= readerCheck {
			checked = time.Now()
			b.checkReader(ctx)
		}
		msg, err := ps.ReceiveTimeout(ctx, readerCheck)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			var timeout interface{ Timeout() bool }
			if errors.As(err, &timeout) && timeout.Timeout() {
				if perr := ps.Ping(ctx); perr == nil {
					continue
				}
			}
			// Down, or a message we cannot read (a FLUSHALL's null payload):
			// whatever was missed, forget it all, and answer nothing until
			// every subscription is up again.
			b.mu.Lock()
			b.subscribed = false
			b.mu.Unlock()
			b.down(err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		b.receive(ctx, msg)
	}
}

// readerCheck is how often a bell makes sure its reader's connection is
// the one Redis tracks for: one killed and dialled again (OnConnect) makes
// the gate forget, so a write it missed meanwhile costs at most this much
// wake-up latency.
const readerCheck = 2 * time.Second

// checkReader pings the reader, which dials again (and makes the gate
// forget) if its connection was lost; a reader that cannot be reached
// turns the bell down, and one is opened again for a live subscription.
func (b *bell) checkReader(ctx context.Context) {
	b.mu.Lock()
	subscribed := b.subscribed
	b.mu.Unlock()
	if r := b.reader.Load(); r != nil {
		if err := r.Ping(ctx).Err(); err != nil && ctx.Err() == nil {
			b.down(err)
		}
		return
	}
	if subscribed {
		b.up(ctx)
	}
}

// down marks the bell down after err: the reader goes (what Redis tracked
// for it is lost), the gate forgets and turns off until every bell is up.
func (b *bell) down(err error) {
	g := b.g
	g.actMu.Lock()
	defer g.actMu.Unlock()
	b.swapReader(nil)
	b.mu.Lock()
	b.isUp = false
	if !errors.Is(b.err, ErrNoTracking) || errors.Is(err, ErrNoTracking) {
		b.err = err
	}
	b.mu.Unlock()
	g.forgetAll()
	g.setActiveLocked(false)
}

// up opens a reader for the live subscription and turns the bell up.
func (b *bell) up(ctx context.Context) {
	r, err := b.openReader(ctx, b.id.Load())
	if err != nil {
		b.down(err)
		return
	}
	b.swapReader(r)
	b.g.forgetAll()
	b.mu.Lock()
	b.isUp, b.err, b.lastOK = true, nil, time.Now()
	b.mu.Unlock()
	select {
	case b.g.kick <- struct{}{}:
	default:
	}
}

// receive handles one message of the subscription.
func (b *bell) receive(ctx context.Context, msg any) {
	g := b.g
	switch m := msg.(type) {
	case *redis.Subscription:
		if m.Kind != "subscribe" {
			return
		}
		// (Re)subscribed: a reader tracking for this subscription, and
		// start afresh; Run turns the gate on once every bell is up.
		b.mu.Lock()
		b.subscribed = true
		b.mu.Unlock()
		b.up(ctx)
	case *redis.Message:
		if m.Channel == invalidations {
			if len(m.PayloadSlice) > 0 {
				g.invalidate(m.PayloadSlice)
			} else if m.Payload != "" {
				g.invalidate([]string{m.Payload})
			} else {
				g.forgetAll()
			}
		}
		b.mu.Lock()
		b.lastOK = time.Now()
		b.mu.Unlock()
	case *redis.Pong:
		b.mu.Lock()
		b.lastOK = time.Now()
		b.mu.Unlock()
	}
}
