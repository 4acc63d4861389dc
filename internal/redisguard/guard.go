package redisguard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// ErrEviction reports a Redis node whose maxmemory-policy may evict keys,
// or whose policy cannot be read, with Options.AllowEviction unset.
var ErrEviction = errors.New("redis may evict keys")

// AllowEvictionVar is the variable that sets Options.AllowEviction, as
// messages name it.
const AllowEvictionVar = "SLUICE_REDIS_ALLOW_EVICTION"

// AtRisk is what an eviction can take, as logs and /readyz name it.
const AtRisk = "quota windows (sends forgotten: recipients may get more than their limits), " +
	"done records (a re-run may send again), idempotency keys (an API retry may enqueue twice) " +
	"and queued tasks (Asynq's keys: tasks may be lost)"

// Options configure a Guard. The zero value of each field is its default.
type Options struct {
	// Interval is how often the nodes are read again. Default 5s, so an
	// eviction shows within about that long.
	Interval time.Duration
	// AllowEviction runs against nodes whose policy may evict (or cannot
	// be read), with a warning at start and in Status, instead of refusing.
	AllowEviction bool
	// DegradedFor is how long Status stays degraded after the latest rise
	// of evicted_keys seen. Default 5m; negative: never degraded by
	// evictions (they are still counted and logged).
	DegradedFor time.Duration
	// WaitReplicas is how many replicas acknowledge each admission
	// (throttle.Options.WaitReplicas): a master with fewer is warned about.
	WaitReplicas int
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Registerer takes the metrics (sluice_redis_*); nil: none.
	Registerer prometheus.Registerer
}

// Guard checks a client's Redis nodes at start and watches them until
// Stop. It is safe for concurrent use; a nil *Guard reports a ready Status.
type Guard struct {
	client redis.UniversalClient
	opts   Options
	log    *slog.Logger
	m      *metrics

	mu       sync.Mutex
	started  bool            // the start's read is applied
	last     map[string]Node // by address, from the latest read
	evicted  []eviction      // the latest rise of evicted_keys per node, while it degrades
	problems []string
	warnings []string

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

type eviction struct {
	node  string
	keys  int64
	at    time.Time
	until time.Time
}

// New returns a Guard over client; it reads nothing until Start.
func New(client redis.UniversalClient, opts Options) *Guard {
	if opts.Interval <= 0 {
		opts.Interval = 5 * time.Second
	}
	if opts.DegradedFor == 0 {
		opts.DegradedFor = 5 * time.Minute
	}
	g := &Guard{client: client, opts: opts, log: opts.Logger, last: map[string]Node{}, stop: make(chan struct{}), done: make(chan struct{})}
	if g.log == nil {
		g.log = slog.Default()
	}
	if opts.Registerer != nil {
		g.m = newMetrics(opts.Registerer)
	}
	return g
}

// Start reads every node, logs its settings and what does not hold, and
// refuses — an error wrapping ErrEviction that names the setting, the nodes
// and the way out — nodes whose policy may evict unless AllowEviction. It
// then reads them again every Interval until Stop.
func (g *Guard) Start(ctx context.Context) (Report, error) {
	r, err := Read(ctx, g.client)
	if err != nil {
		return Report{}, fmt.Errorf("redis settings: %w", err)
	}
	var evicting, unread []string
	for _, n := range r.Nodes {
		switch {
		case n.Err != nil:
			unread = append(unread, n.Addr+": "+n.Err.Error())
		case n.MaxmemoryPolicy == Unknown:
			evicting = append(evicting, fmt.Sprintf("cannot be read on %s (%s; CONFIG GET and INFO memory refused)", n.Addr, n.Role))
		case n.MayEvict():
			evicting = append(evicting, fmt.Sprintf("is %s on %s (%s, maxmemory %s)", n.MaxmemoryPolicy, n.Addr, n.Role, bytes(n.Maxmemory)))
		}
	}
	if len(evicting) > 0 && !g.opts.AllowEviction {
		return r, fmt.Errorf("%w: maxmemory-policy %s: at maxmemory Redis would delete keys Sluice relies on — %s. "+
			"Set maxmemory-policy noeviction on every node (CONFIG SET maxmemory-policy noeviction, and in redis.conf or the provider's parameter group), "+
			"or set %s=true to run anyway", ErrEviction, strings.Join(evicting, "; "), AtRisk, AllowEvictionVar)
	}
	if len(unread) > 0 {
		g.log.Warn("cannot read the settings of some Redis nodes; they are checked again every interval", "nodes", strings.Join(unread, "; "), "interval", g.opts.Interval)
	}
	for _, n := range r.Nodes {
		if n.Err == nil {
			g.logNode(n)
		}
	}
	if len(evicting) > 0 {
		g.log.Warn("RUNNING WITH EVICTION ALLOWED ("+AllowEvictionVar+"=true): maxmemory-policy "+strings.Join(evicting, "; ")+
			"; if Redis evicts, it may take "+AtRisk+". Set maxmemory-policy noeviction to keep the guarantees.", "nodes", len(evicting))
	}
	if unsafe := crashUnsafe(r); len(unsafe) > 0 {
		g.log.Warn("the guarantee through a Redis crash does not hold on these nodes: a crash loses the admissions and done records of the last second (appendfsync everysec), "+
			"or more (appendfsync no, no AOF), so a window may forget sends and a re-run send again; set appendonly yes and appendfsync always",
			"nodes", strings.Join(unsafe, "; "))
	}
	if short := fewReplicas(r, g.opts.WaitReplicas); len(short) > 0 {
		g.log.Warn("admissions wait for more replicas than these masters have: nothing is admitted on them (nothing is sent) until enough replicas acknowledge",
			"wait_replicas", g.opts.WaitReplicas, "masters", strings.Join(short, "; "))
	}
	g.apply(r, time.Now())
	g.mu.Lock()
	g.started = true
	g.mu.Unlock()
	go g.loop()
	return r, nil
}

// Stop ends the periodic reads and waits for the one in progress.
func (g *Guard) Stop() {
	if g == nil {
		return
	}
	g.once.Do(func() { close(g.stop) })
	<-g.done
}

// Check reads every node now and applies what it finds (metrics, logs,
// Status), as the periodic reads do.
func (g *Guard) Check(ctx context.Context) (Report, error) {
	r, err := Read(ctx, g.client)
	if err != nil {
		return Report{}, err
	}
	g.apply(r, time.Now())
	return r, nil
}

func (g *Guard) loop() {
	defer close(g.done)
	t := time.NewTicker(g.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), max(g.opts.Interval, 2*time.Second))
		if _, err := g.Check(ctx); err != nil {
			g.log.Debug("cannot read the Redis nodes' settings; trying again", "err", err, "in", g.opts.Interval)
		}
		cancel()
	}
}

// apply takes a fresh read: evictions, changed settings, metrics, Status.
func (g *Guard) apply(r Report, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, n := range r.Nodes {
		if n.Err != nil {
			continue // unreachable: readyz's PING and the checks say so
		}
		prev, seen := g.last[n.Addr]
		if seen && prev.EvictedKeys >= 0 && n.EvictedKeys > prev.EvictedKeys {
			d := n.EvictedKeys - prev.EvictedKeys
			if g.m != nil {
				g.m.evicted.WithLabelValues(n.Addr).Add(float64(d))
			}
			g.log.Error("Redis EVICTED KEYS: it may have taken "+AtRisk,
				"node", n.Addr, "role", n.Role, "evicted", d, "evicted_total", n.EvictedKeys, "maxmemory_policy", n.MaxmemoryPolicy,
				"used_memory", bytes(n.UsedMemory), "maxmemory", bytes(n.Maxmemory))
			g.noteEviction(eviction{node: n.Addr, keys: d, at: now, until: now.Add(g.opts.DegradedFor)})
		}
		switch {
		case seen:
			g.logChanges(prev, n)
		case g.started:
			// A node the client did not list at start (a replica added or
			// announced later, a new master).
			g.logNode(n)
			if n.MayEvict() && !g.opts.AllowEviction {
				g.log.Error("a Redis node's maxmemory-policy may evict "+AtRisk+"; set it to noeviction (readiness is degraded meanwhile)",
					"node", n.Addr, "role", n.Role, "maxmemory_policy", n.MaxmemoryPolicy)
			}
		}
		g.last[n.Addr] = n
		if g.m != nil {
			g.m.set(n)
		}
	}
	for addr := range g.last {
		if !slices.ContainsFunc(r.Nodes, func(n Node) bool { return n.Addr == addr }) {
			// Gone from the client's view (a failed master after a failover).
			delete(g.last, addr)
			if g.m != nil {
				g.m.drop(addr)
			}
		}
	}
	g.problems, g.warnings = nil, nil
	kept := g.evicted[:0]
	for _, e := range g.evicted {
		if g.opts.DegradedFor > 0 && now.Before(e.until) {
			kept = append(kept, e)
			g.problems = append(g.problems, fmt.Sprintf("Redis evicted %d keys on %s at %s: it may have taken %s (degraded until %s)",
				e.keys, e.node, e.at.UTC().Format(time.RFC3339), AtRisk, e.until.UTC().Format(time.RFC3339)))
		}
	}
	g.evicted = kept
	for _, n := range r.Nodes {
		switch {
		case n.Err != nil:
		case n.MayEvict() && !g.opts.AllowEviction:
			g.problems = append(g.problems, fmt.Sprintf("maxmemory-policy is %s on %s: Redis may evict %s; set noeviction", n.MaxmemoryPolicy, n.Addr, AtRisk))
		case n.MayEvict():
			g.warnings = append(g.warnings, fmt.Sprintf("maxmemory-policy is %s on %s, allowed by %s: an eviction may take %s", n.MaxmemoryPolicy, n.Addr, AllowEvictionVar, AtRisk))
		}
		if n.Err == nil && n.Role == "master" && n.Full() && !n.MayEvict() {
			g.problems = append(g.problems, fmt.Sprintf("Redis memory is full on %s (used %s of maxmemory %s, noeviction): it refuses writes, so nothing new is enqueued or started",
				n.Addr, bytes(n.UsedMemory), bytes(n.Maxmemory)))
		}
	}
	for _, u := range crashUnsafe(r) {
		g.warnings = append(g.warnings, "not crash-safe: "+u)
	}
	for _, s := range fewReplicas(r, g.opts.WaitReplicas) {
		g.warnings = append(g.warnings, fmt.Sprintf("admissions wait for %d replicas: %s", g.opts.WaitReplicas, s))
	}
}

// logNode logs a node's settings.
func (g *Guard) logNode(n Node) {
	from := "config"
	if !n.Config {
		from = "info (CONFIG GET refused)"
	}
	g.log.Info("redis node", "node", n.Addr, "role", n.Role, "maxmemory_policy", n.MaxmemoryPolicy, "maxmemory", bytes(n.Maxmemory),
		"used_memory", bytes(n.UsedMemory), "appendonly", n.AppendOnly, "appendfsync", n.Appendfsync,
		"zset_max_listpack_entries", n.ListpackEntries, "replicas", n.Replicas, "settings_from", from)
}

// noteEviction keeps the latest eviction per node.
func (g *Guard) noteEviction(e eviction) {
	for i := range g.evicted {
		if g.evicted[i].node == e.node {
			e.keys += g.evicted[i].keys
			g.evicted[i] = e
			return
		}
	}
	g.evicted = append(g.evicted, e)
}

// logChanges logs a node's settings that changed since the last read.
func (g *Guard) logChanges(prev, n Node) {
	if prev.MaxmemoryPolicy != n.MaxmemoryPolicy {
		switch {
		case !n.MayEvict():
			g.log.Info("Redis maxmemory-policy changed to noeviction", "node", n.Addr, "was", prev.MaxmemoryPolicy)
		case g.opts.AllowEviction:
			g.log.Warn("Redis maxmemory-policy changed; eviction is allowed ("+AllowEvictionVar+"=true), so it may take "+AtRisk, "node", n.Addr, "maxmemory_policy", n.MaxmemoryPolicy, "was", prev.MaxmemoryPolicy)
		default:
			g.log.Error("Redis maxmemory-policy changed: Redis may now evict "+AtRisk+"; set it back to noeviction (readiness is degraded meanwhile)",
				"node", n.Addr, "maxmemory_policy", n.MaxmemoryPolicy, "was", prev.MaxmemoryPolicy)
		}
	}
	if prev.AppendOnly != n.AppendOnly || prev.Appendfsync != n.Appendfsync {
		lvl := slog.LevelInfo
		if !n.CrashSafe() {
			lvl = slog.LevelWarn
		}
		g.log.Log(context.Background(), lvl, "Redis durability changed", "node", n.Addr, "appendonly", n.AppendOnly, "appendfsync", n.Appendfsync,
			"was", prev.durability(), "crash_safe", n.CrashSafe())
	}
	if prev.Full() != n.Full() && n.Role == "master" {
		if n.Full() {
			g.log.Error("Redis memory is full: it refuses writes, so nothing new is enqueued or started until memory is freed", "node", n.Addr,
				"used_memory", bytes(n.UsedMemory), "maxmemory", bytes(n.Maxmemory), "maxmemory_policy", n.MaxmemoryPolicy)
		} else {
			g.log.Info("Redis memory below maxmemory again", "node", n.Addr, "used_memory", bytes(n.UsedMemory), "maxmemory", bytes(n.Maxmemory))
		}
	}
}

// Status is what the guard knows now, for /readyz.
type Status struct {
	// Problems make a process not ready: a recent eviction, a policy that
	// may evict (not allowed), a master at its maxmemory.
	Problems []string
	// Warnings leave it ready: an eviction policy allowed by the
	// override, nodes that are not crash-safe, masters with fewer
	// replicas than admissions wait for.
	Warnings []string
}

// Ready reports no problems.
func (s Status) Ready() bool { return len(s.Problems) == 0 }

// Status is a copy of the latest findings.
func (g *Guard) Status() Status {
	if g == nil {
		return Status{}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return Status{Problems: append([]string(nil), g.problems...), Warnings: append([]string(nil), g.warnings...)}
}

// Write answers a readiness probe whose other checks passed: 503 with
// "not ready: degraded: …" and the problems, else 200 with "ready" and a
// line per warning.
func (s Status) Write(w http.ResponseWriter) {
	if !s.Ready() {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "not ready: degraded: "+strings.Join(s.Problems, "\n")+"\n")
		return
	}
	io.WriteString(w, "ready\n")
	for _, x := range s.Warnings {
		io.WriteString(w, "warning: "+x+"\n")
	}
}

// crashUnsafe lists the nodes that can lose acknowledged writes in a crash,
// each with why.
func crashUnsafe(r Report) []string {
	var out []string
	for _, n := range r.Nodes {
		if n.Err != nil || n.CrashSafe() {
			continue
		}
		why := n.durability()
		if n.AppendOnly == "yes" && n.Appendfsync == Unknown {
			why += " (CONFIG GET refused: check the provider's setting)"
		}
		out = append(out, n.Addr+" ("+n.Role+", "+why+")")
	}
	return out
}

// fewReplicas lists the masters with fewer connected replicas than want.
func fewReplicas(r Report, want int) []string {
	var out []string
	for _, n := range r.Nodes {
		if want > 0 && n.Err == nil && n.Role == "master" && n.Replicas < want {
			out = append(out, n.Addr+" has "+strconv.Itoa(n.Replicas)+" connected")
		}
	}
	return out
}

// bytes prints a byte count the way Redis's INFO does (1.50M); 0 is
// maxmemory's "no limit", -1 Unknown.
func bytes(n int64) string {
	switch {
	case n < 0:
		return Unknown
	case n == 0:
		return "0"
	case n < 1<<10:
		return strconv.FormatInt(n, 10) + "B"
	case n < 1<<20:
		return strconv.FormatFloat(float64(n)/(1<<10), 'f', 2, 64) + "K"
	case n < 1<<30:
		return strconv.FormatFloat(float64(n)/(1<<20), 'f', 2, 64) + "M"
	}
	return strconv.FormatFloat(float64(n)/(1<<30), 'f', 2, 64) + "G"
}
