package pollgate

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// invalidations is the channel Redis sends tracking invalidations to (RESP2).
const invalidations = "__redis__:invalidate"

// ErrNoTracking reports a server that would not track keys (Redis < 6, or
// CLIENT refused by an ACL): the gate then lets every poll through.
var ErrNoTracking = errors.New("pollgate: redis refused CLIENT TRACKING")

// Run keeps one subscription per master until ctx ends. While they are all
// up the gate answers polls; otherwise it lets them through. It returns
// when ctx ends; setup trouble is logged and retried, never fatal (the
// worker then simply polls as plain Asynq does).
func (g *Gate) Run(ctx context.Context) {
	var mu sync.Mutex
	bells := map[string]*bell{} // by node address
	var wg sync.WaitGroup
	defer func() {
		g.active.Store(false)
		mu.Lock()
		for _, b := range bells {
			b.stop()
		}
		mu.Unlock()
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
		mu.Lock()
		defer mu.Unlock()
		for addr, b := range bells {
			if _, ok := nodes[addr]; !ok {
				b.stop()
				delete(bells, addr)
			}
		}
		for addr, opt := range nodes {
			if _, ok := bells[addr]; ok {
				continue
			}
			b := g.newBell(opt)
			bctx, cancel := context.WithCancel(ctx)
			b.cancel = cancel
			bells[addr] = b
			wg.Add(1)
			go func() { defer wg.Done(); b.run(bctx) }()
		}
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

// bell is the subscription to one master's invalidations.
type bell struct {
	g      *Gate
	addr   string
	client *redis.Client
	cancel context.CancelFunc
	mu     sync.Mutex
	up     bool      // subscribed, and answering pings
	lastOK time.Time // last message or pong
	err    error     // why not up
}

func (g *Gate) newBell(base *redis.Options) *bell {
	o := *cloneOptions(base)
	o.Protocol = 2 // invalidations arrive as pub/sub messages (RESP3 would push them)
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns = 1, 0, 0
	o.ReadTimeout = 0
	b := &bell{g: g, addr: base.Addr}
	user := base.OnConnect
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		if user != nil {
			if err := user(ctx, cn); err != nil {
				return err
			}
		}
		// Track every queue key for this very connection, which then
		// subscribes to the invalidations: they live and die together.
		id, err := cn.ClientID(ctx).Result()
		if err != nil {
			return err
		}
		args := []interface{}{"CLIENT", "TRACKING", "on", "REDIRECT", id, "BCAST"}
		for _, p := range g.prefixes {
			args = append(args, "PREFIX", p)
		}
		if err := cn.Do(ctx, args...).Err(); err != nil {
			b.setErr(fmt.Errorf("%w: %w", ErrNoTracking, err))
			return err
		}
		return nil
	}
	b.client = redis.NewClient(&o)
	return b
}

func (b *bell) setErr(err error) {
	b.mu.Lock()
	b.up, b.err = false, err
	b.mu.Unlock()
}

// status reports whether the subscription is up and recently heard from.
func (b *bell) status() (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.up && time.Since(b.lastOK) < b.g.recheck/2+5*time.Second, b.err
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
	g := b.g
	backoff := 100 * time.Millisecond
	ps := b.client.Subscribe(ctx, invalidations)
	defer ps.Close()
	for ctx.Err() == nil {
		msg, err := ps.ReceiveTimeout(ctx, 2*time.Second)
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
			g.actMu.Lock()
			b.mu.Lock()
			b.up = false
			if !errors.Is(b.err, ErrNoTracking) {
				b.err = err
			}
			b.mu.Unlock()
			g.forgetAll()
			g.setActiveLocked(false)
			g.actMu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				// (Re)subscribed with tracking on (OnConnect): start afresh;
				// Run turns the gate on once every subscription is up.
				g.forgetAll()
				b.mu.Lock()
				b.up, b.err, b.lastOK = true, nil, time.Now()
				b.mu.Unlock()
				select {
				case g.kick <- struct{}{}:
				default:
				}
			}
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
}
