package redisguard_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/redisguard"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

var ctx = context.Background()

type bundle struct {
	log *sluicetest.LogBuffer
	reg *prometheus.Registry
}

// start starts a guard with a captured log and its own registry; it is
// stopped when the test ends.
func start(t *testing.T, srv *redistest.Server, opts redisguard.Options) (*redisguard.Guard, redisguard.Report, error, *bundle) {
	t.Helper()
	b := &bundle{log: &sluicetest.LogBuffer{}, reg: prometheus.NewRegistry()}
	opts.Logger = slog.New(slog.NewTextHandler(b.log, nil))
	opts.Registerer = b.reg
	g := redisguard.New(srv.Client(t), opts)
	r, err := g.Start(ctx)
	if err == nil {
		t.Cleanup(g.Stop)
	}
	return g, r, err, b
}

// gauge is the value of a gauge or counter series with the given labels
// (-1 when there is none).
func (b *bundle) value(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || lp.GetName() == k && lp.GetValue() == v
				}
				if !found {
					continue next
				}
			}
			{
				if m.GetGauge() != nil {
					return m.GetGauge().GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// Durability is read from real servers in each mode: no AOF, AOF with
// fsync every second, AOF with fsync always. Only the last is crash-safe:
// the metric says 1 for it alone, and the start warns about the others.
func TestDurabilityEachMode(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name          string
		args          []string
		aof, fsync    string
		safe, warning bool
	}{
		{"NoAOF", nil, "no", "everysec", false, true},
		{"Everysec", []string{"--appendonly", "yes", "--appendfsync", "everysec"}, "yes", "everysec", false, true},
		{"Always", []string{"--appendonly", "yes", "--appendfsync", "always"}, "yes", "always", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t, c.args...)
			_, r, err, b := start(t, srv, redisguard.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Nodes) != 1 {
				t.Fatalf("%d nodes for one server", len(r.Nodes))
			}
			n := r.Nodes[0]
			if n.Addr != srv.Addr || n.Role != "master" || n.AppendOnly != c.aof || n.Appendfsync != c.fsync || n.CrashSafe() != c.safe || !n.Config {
				t.Fatalf("read %+v; want appendonly %s, appendfsync %s", n, c.aof, c.fsync)
			}
			want := 0.0
			if c.safe {
				want = 1
			}
			if v := b.value(t, "sluice_redis_crash_safe", map[string]string{"node": srv.Addr}); v != want {
				t.Errorf("sluice_redis_crash_safe = %v, want %v", v, want)
			}
			if v := b.value(t, "sluice_redis_node_info", map[string]string{"node": srv.Addr, "appendonly": c.aof, "appendfsync": c.fsync, "maxmemory_policy": "noeviction"}); v != 1 {
				t.Errorf("no sluice_redis_node_info series with appendonly=%s appendfsync=%s", c.aof, c.fsync)
			}
			log := b.log.String()
			warned := strings.Contains(log, "level=WARN") && strings.Contains(log, "the guarantee through a Redis crash does not hold") &&
				strings.Contains(log, srv.Addr+" (master, appendonly "+c.aof+", appendfsync "+c.fsync+")")
			if warned != c.warning {
				t.Errorf("warned = %v, want %v; log:\n%s", warned, c.warning, log)
			}
			if !strings.Contains(log, `msg="redis node" node=`+srv.Addr) || !strings.Contains(log, "appendonly="+c.aof+" appendfsync="+c.fsync) {
				t.Errorf("the node's settings are not logged at start:\n%s", log)
			}
		})
	}
}

// A policy that may evict is refused at start, naming the setting, the
// node, the value and the way out; with the override it starts, warns
// loudly, and readiness carries the warning.
func TestEvictionPolicyRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru")
	_, _, err, _ := start(t, srv, redisguard.Options{})
	if !errors.Is(err, redisguard.ErrEviction) {
		t.Fatalf("volatile-lru: %v; want ErrEviction", err)
	}
	for _, s := range []string{"maxmemory-policy is volatile-lru on " + srv.Addr + " (master, maxmemory 64.00M)", "noeviction", "SLUICE_REDIS_ALLOW_EVICTION=true", "quota windows"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("refusal does not say %q: %v", s, err)
		}
	}
	g, _, err, b := start(t, srv, redisguard.Options{AllowEviction: true})
	if err != nil {
		t.Fatalf("with the override: %v", err)
	}
	if log := b.log.String(); !strings.Contains(log, "level=WARN") || !strings.Contains(log, "RUNNING WITH EVICTION ALLOWED") {
		t.Fatalf("no loud warning:\n%s", log)
	}
	st := g.Status()
	if !st.Ready() || len(st.Warnings) == 0 || !strings.Contains(st.Warnings[0], "volatile-lru") {
		t.Fatalf("status %+v; want ready with the policy as a warning", st)
	}
	rec := httptest.NewRecorder()
	st.Write(rec)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "warning: maxmemory-policy is volatile-lru on "+srv.Addr+", allowed by SLUICE_REDIS_ALLOW_EVICTION") {
		t.Fatalf("readiness %d %q", rec.Code, rec.Body.String())
	}
}

// Where CONFIG is disabled (managed Redis), INFO still tells the policy,
// the memory and whether AOF is on; appendfsync and the listpack limit are
// unknown, and the refusal still names the policy.
func TestConfigDisabledFallsBackToInfo(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--rename-command", "CONFIG", "", "--maxmemory", "32mb", "--maxmemory-policy", "allkeys-lru", "--appendonly", "yes")
	r, err := redisguard.Read(ctx, srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	n := r.Nodes[0]
	if n.Config || n.Err != nil || n.MaxmemoryPolicy != "allkeys-lru" || n.Maxmemory != 32<<20 || n.UsedMemory <= 0 ||
		n.AppendOnly != "yes" || n.Appendfsync != redisguard.Unknown || n.ListpackEntries != -1 || n.EvictedKeys != 0 || n.Role != "master" {
		t.Fatalf("read without CONFIG: %+v", n)
	}
	if _, _, err, _ := start(t, srv, redisguard.Options{}); !errors.Is(err, redisguard.ErrEviction) || !strings.Contains(err.Error(), "maxmemory-policy is allkeys-lru") {
		t.Fatalf("start without CONFIG: %v", err)
	}
	_, _, err, b := start(t, srv, redisguard.Options{AllowEviction: true})
	if err != nil {
		t.Fatal(err)
	}
	if log := b.log.String(); !strings.Contains(log, "appendfsync unknown (CONFIG GET refused: check the provider's setting)") || !strings.Contains(log, `settings_from="info (CONFIG GET refused)"`) {
		t.Fatalf("the log does not say appendfsync could not be read:\n%s", log)
	}
}

// Evictions while running: another application's keys with TTLs fill a
// volatile-lru Redis (allowed by the override) until it evicts. The next
// read counts the evictions, logs an error naming what may be lost, and
// degrades readiness for DegradedFor; then it is ready again.
func TestEvictionsDegrade(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--maxmemory", "4mb", "--maxmemory-policy", "volatile-lru")
	g, _, err, b := start(t, srv, redisguard.Options{AllowEviction: true, Interval: 50 * time.Millisecond, DegradedFor: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := srv.Client(t)
	v := strings.Repeat("v", 4<<10)
	for i := 0; ; i++ {
		if err := c.Set(ctx, fmt.Sprintf("cache:%d", i), v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		if i%64 == 0 && c.Info(ctx, "stats").Val() != "" && !strings.Contains(c.Info(ctx, "stats").Val(), "evicted_keys:0\r\n") {
			break
		}
		if i > 100_000 {
			t.Fatal("Redis never evicted")
		}
	}
	seen := time.Now()
	// The watcher offers no signal: poll.
	st := sluicetest.EventuallyValue(t, 5*time.Second, "readiness degraded after Redis evicted", func() (redisguard.Status, bool) {
		st := g.Status()
		return st, !st.Ready()
	})
	t.Logf("degraded %v after the eviction: %s", time.Since(seen).Round(time.Millisecond), st.Problems[0])
	if !strings.Contains(st.Problems[0], "Redis evicted") || !strings.Contains(st.Problems[0], srv.Addr) || !strings.Contains(st.Problems[0], "quota windows") {
		t.Errorf("problem does not say what happened: %q", st.Problems[0])
	}
	if v := b.value(t, "sluice_redis_evicted_keys_total", map[string]string{"node": srv.Addr}); v <= 0 {
		t.Errorf("sluice_redis_evicted_keys_total = %v", v)
	}
	if r := b.value(t, "sluice_redis_memory_used_ratio", map[string]string{"node": srv.Addr}); r < 0.9 {
		t.Errorf("memory ratio %v of a Redis that evicts", r)
	}
	log := b.log.String()
	for _, s := range []string{"level=ERROR", "Redis EVICTED KEYS", "quota windows", "done records", "idempotency keys", "queued tasks"} {
		if !strings.Contains(log, s) {
			t.Errorf("the log does not say %q", s)
		}
	}
	rec := httptest.NewRecorder()
	st.Write(rec)
	if rec.Code != 503 || !strings.HasPrefix(rec.Body.String(), "not ready: degraded: Redis evicted") {
		t.Errorf("readiness %d %q", rec.Code, rec.Body.String())
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	sluicetest.EventuallyValue(t, 10*time.Second, "readiness back after the evictions stopped (DegradedFor 1s)", func() (redisguard.Status, bool) {
		st := g.Status()
		return st, st.Ready()
	})
}

// Settings change at runtime: a policy turned evicting degrades readiness
// while it lasts, a durability change is logged, and a master at its
// maxmemory under noeviction is not ready until memory is freed.
func TestRuntimeChanges(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	g, _, err, b := start(t, srv, redisguard.Options{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c := srv.Client(t)
	check := func() redisguard.Status {
		t.Helper()
		if _, err := g.Check(ctx); err != nil {
			t.Fatal(err)
		}
		return g.Status()
	}
	if st := check(); !st.Ready() {
		t.Fatalf("noeviction: %+v", st)
	}
	c.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru")
	c.ConfigSet(ctx, "appendonly", "yes")
	st := check()
	if st.Ready() || !strings.Contains(st.Problems[0], "maxmemory-policy is allkeys-lru on "+srv.Addr) {
		t.Fatalf("after CONFIG SET maxmemory-policy allkeys-lru: %+v", st)
	}
	log := b.log.String()
	if !strings.Contains(log, "level=ERROR") || !strings.Contains(log, "Redis maxmemory-policy changed") || !strings.Contains(log, "Redis durability changed") {
		t.Fatalf("changes not logged:\n%s", log)
	}
	c.ConfigSet(ctx, "maxmemory-policy", "noeviction")
	if st := check(); !st.Ready() {
		t.Fatalf("back to noeviction: %+v", st)
	}
	free := srv.Overfill(t)
	if st := check(); st.Ready() || !strings.Contains(st.Problems[0], "Redis memory is full on "+srv.Addr) {
		t.Fatalf("over maxmemory: %+v", st)
	}
	free()
	if st := check(); !st.Ready() {
		t.Fatalf("after freeing memory: %+v", st)
	}
}

// On a Cluster every master and every replica is read, with each
// master's connected replicas; masters with fewer replicas than admissions
// wait for are warned about.
func TestClusterEveryNode(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	cl, cc := redistest.NewCluster(t, 3, 1)
	b := &bundle{log: &sluicetest.LogBuffer{}, reg: prometheus.NewRegistry()}
	g := redisguard.New(cc, redisguard.Options{WaitReplicas: 2, Logger: slog.New(slog.NewTextHandler(b.log, nil)), Registerer: b.reg})
	r, err := g.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	// CLUSTER SLOTS lists a replica once the cluster's gossip knows it holds
	// data, a little after it synced: the next reads find it.
	if len(r.Nodes) < len(cl.Nodes) {
		r = sluicetest.EventuallyValueEvery(t, 45*time.Second, 100*time.Millisecond, fmt.Sprintf("a read of all %d nodes", len(cl.Nodes)), func() (redisguard.Report, bool) {
			r, err := g.Check(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return r, len(r.Nodes) >= len(cl.Nodes)
		})
	}
	roles := map[string]int{}
	for _, n := range r.Nodes {
		roles[n.Role]++
		if n.Role == "master" && n.Replicas != 1 {
			t.Errorf("master %s: %d replicas", n.Addr, n.Replicas)
		}
	}
	if len(r.Nodes) != len(cl.Nodes) || roles["master"] != 3 || roles["replica"] != 3 {
		t.Fatalf("read %d nodes (%v) of %d", len(r.Nodes), roles, len(cl.Nodes))
	}
	if r.ListpackEntries() != 128 {
		t.Errorf("listpack entries %d", r.ListpackEntries())
	}
	if log := b.log.String(); strings.Count(log, "has 1 connected") != 3 || !strings.Contains(log, "wait_replicas=2") {
		t.Errorf("no warning about masters with one replica:\n%s", log)
	}
	if st := g.Status(); !st.Ready() || len(st.Warnings) < 3 {
		t.Errorf("status %+v", st)
	}
}
