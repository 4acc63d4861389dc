package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/throttle"
)

// exitOf waits for a process that should stop on its own and returns its
// exit code.
func exitOf(t *testing.T, p *proc, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s kept running; log:\n%s", p.name, p.logText())
	}
	return p.cmd.ProcessState.ExitCode()
}

// get answers a GET of http://addr/path: status and body (0 when it fails).
func get(addr, path string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text() + "\n")
	}
	return resp.StatusCode, b.String()
}

// metricSum sums the samples of a metric family in a /metrics page.
func metricSum(page, name string) float64 {
	var sum float64
	for _, l := range strings.Split(page, "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		f := strings.Fields(l)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		sum += v
	}
	return sum
}

// The eviction policy of several managed Redis services (volatile-lru) on
// a Redis with a memory limit: the worker and the API refuse to start, exit
// 1, and say which setting, on which node, and how to fix or override it.
func TestEvictionPolicyRefusedAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=5/1h", "--maxmemory", "8mb", "--maxmemory-policy", "volatile-lru")
	w := e.worker("w0", nil)
	a := e.sluiceProc("api", map[string]string{"SLUICE_API_ADDR": freeAddr(t), "SLUICE_API_TOKEN_KEY": apiTokenKey}, "api")
	for _, p := range []*proc{w, a} {
		if code := exitOf(t, p, 20*time.Second); code != 1 {
			t.Fatalf("%s exited %d, want 1; log:\n%s", p.name, code, p.logText())
		}
		log := p.logText()
		for _, s := range []string{"maxmemory-policy is volatile-lru on " + e.redis.Addr, "noeviction", "SLUICE_REDIS_ALLOW_EVICTION=true"} {
			if !strings.Contains(log, s) {
				t.Errorf("%s's refusal does not say %q:\n%s", p.name, s, log)
			}
		}
	}
}

// The scenario with the override: a volatile-lru Redis of 8 MB
// shared with another application's cache keys (with TTLs, like every
// Sluice key). When the cache fills it and Redis evicts, the worker's and
// the API's /readyz turn degraded (503) and sluice_redis_evicted_keys_total
// rises within 10 s with the default check interval, and the logs say which
// guarantees may be lost.
func TestEvictionDegradesReadiness(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=5/1h", "--maxmemory", "8mb", "--maxmemory-policy", "volatile-lru")
	e.vars["SLUICE_REDIS_ALLOW_EVICTION"] = "true"
	waddr := freeAddr(t)
	w := e.worker("w0", map[string]string{"SLUICE_HTTP_ADDR": waddr})
	api := e.startAPI(nil)
	waitStatus(t, waddr, 200, 15*time.Second)
	for _, p := range []struct {
		name, addr, log string
	}{{"worker", waddr, w.logText()}, {"api", strings.TrimPrefix(api.base, "http://"), api.proc.logText()}} {
		if !strings.Contains(p.log, "level=WARN") || !strings.Contains(p.log, "RUNNING WITH EVICTION ALLOWED") {
			t.Errorf("%s: no loud warning at start:\n%s", p.name, p.log)
		}
		if code, body := get(p.addr, "/readyz"); code != 200 || !strings.Contains(body, "warning: maxmemory-policy is volatile-lru on "+e.redis.Addr) {
			t.Errorf("%s /readyz: %d %q", p.name, code, body)
		}
	}
	e.enqueueSMS(5, []string{"+14155550100"}, []string{"acme"})
	e.sms.WaitCount(t, 5, 30*time.Second)

	// The other application writes its cache until Redis evicts.
	e.notSluice("otherapp:")
	ctx := context.Background()
	v := strings.Repeat("c", 4<<10)
	for i := 0; ; i++ {
		if err := e.rdb.Set(ctx, fmt.Sprintf("otherapp:cache:%d", i), v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		if i%32 == 0 && field(e.rdb.Info(ctx, "stats").Val(), "evicted_keys") != "0" {
			break
		}
		if i > 50_000 {
			t.Fatal("Redis never evicted")
		}
	}
	evicted := time.Now()
	for _, p := range []struct {
		name, addr string
		proc       *proc
	}{{"worker", waddr, w}, {"api", strings.TrimPrefix(api.base, "http://"), api.proc}} {
		waitStatus(t, p.addr, 503, time.Until(evicted.Add(10*time.Second)))
		_, body := get(p.addr, "/readyz")
		_, page := get(p.addr, "/metrics")
		t.Logf("%s degraded %v after the first eviction: %s", p.name, time.Since(evicted).Round(10*time.Millisecond), strings.TrimSpace(body))
		if !strings.HasPrefix(body, "not ready: degraded: Redis evicted") {
			t.Errorf("%s /readyz: %q", p.name, body)
		}
		if n := metricSum(page, "sluice_redis_evicted_keys_total"); n <= 0 {
			t.Errorf("%s: sluice_redis_evicted_keys_total = %v", p.name, n)
		}
		log := p.proc.logText()
		for _, s := range []string{"level=ERROR", "Redis EVICTED KEYS", "quota windows", "done records", "idempotency keys", "queued tasks"} {
			if !strings.Contains(log, s) {
				t.Errorf("%s's log does not say %q", p.name, s)
			}
		}
	}
}

// With noeviction and memory full, Redis refuses writes that could grow
// memory: sends already in flight go out and their windows record them (the
// limiter's ops begin with a write Redis lets through), nothing new starts
// (Asynq's dequeue is refused), /readyz says memory is full, and once memory
// is freed every task is delivered, once, and every window holds every
// receipt.
func TestMemoryFullNothingUnrecordedNoneLost(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=10/1h,sms:tenant=1000/1h", "--maxmemory-policy", "noeviction")
	e.sms.SetLatency(200 * time.Millisecond)
	addr := freeAddr(t)
	// Two sends at a time (no waiters: every send here is admitted at once),
	// so most of the backlog is still queued when memory fills.
	w := e.worker("w0", map[string]string{"SLUICE_HTTP_ADDR": addr, "SLUICE_CONCURRENCY": "2", "SLUICE_MAX_WAITERS": "0", "SLUICE_REDIS_CHECK_INTERVAL": "500ms"})
	waitStatus(t, addr, 200, 15*time.Second)
	ids := e.enqueueSMS(40, recipients(40), []string{"acme"})
	e.sms.WaitCount(t, 8, 30*time.Second)
	free := e.redis.Overfill(t)
	full := time.Now()
	waitStatus(t, addr, 503, 10*time.Second)
	if _, body := get(addr, "/readyz"); !strings.Contains(body, "Redis memory is full on "+e.redis.Addr) {
		t.Fatalf("/readyz does not say memory is full: %q", body)
	}
	// What was in flight finishes within the provider's latency; nothing
	// else may start while memory stays full. Absence needs a span of time:
	// 3 s is 30 of the worker's polls.
	for !strings.Contains(w.logText(), "OOM command not allowed") {
		if time.Since(full) > 10*time.Second {
			t.Fatalf("the worker never met a refused write:\n%s", w.logText())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Until(full.Add(time.Second)))
	during := len(e.sms.Deliveries())
	time.Sleep(3 * time.Second)
	if after := len(e.sms.Deliveries()); after != during {
		t.Fatalf("%d sends went out with Redis refusing writes for %v", after-during, time.Since(full).Round(time.Second))
	}
	free()
	freed := time.Now()
	ds := e.waitAllDelivered(ids, time.Minute)
	r := audit(ds, 10, time.Hour, byRecipient)
	waitStatus(t, addr, 200, 10*time.Second)
	t.Logf("memory full for %v: %d delivered before, none while full; all %d delivered %v after memory was freed; %d receipts, %d repeats",
		freed.Sub(full).Round(100*time.Millisecond), during, len(ids), ds[len(ds)-1].At.Sub(freed).Round(100*time.Millisecond), r.receipts, r.duplicates)
	if r.duplicates != 0 || r.delivered != len(ids) {
		t.Fatalf("%d delivered of %d, %d repeats", r.delivered, len(ids), r.duplicates)
	}
	lim, _ := throttle.New(e.rdb, throttle.Options{Secret: []byte(secret), CompactMembers: true})
	u, err := lim.Usage(context.Background(), "acme", 0, throttle.Limit{Scope: "sms:tenant", Rule: throttle.PerHour(1000)})
	if err != nil || u[0].Used != r.receipts {
		t.Fatalf("the tenant window holds %+v (%v) for %d receipts: a send its window did not record", u, err, r.receipts)
	}
	if qi, err := e.queueInfo(); err != nil || qi.Archived != 0 {
		t.Fatalf("archived: %+v, %v", qi, err)
	}
}

// README: a Redis outage stops new admissions; sends admitted before it
// may still go out — at most as many per worker as it runs tasks at once:
// SLUICE_CONCURRENCY + SLUICE_MAX_WAITERS on the standard and bulk lanes'
// server and SLUICE_PRIORITY_CONCURRENCY + SLUICE_MAX_WAITERS on the
// priority lane's. Each task sends at most once, and none can start without
// Redis. Measured: one worker at concurrency 4, priority concurrency 2 and
// 4 waiters, a provider taking 1 s, a backlog in both lanes of sends that
// are all admitted at once (so every running task is a send in flight);
// Redis is killed and what the provider receives after the kill is counted.
func TestOutageSendsOnlyWhatWasAdmitted(t *testing.T) {
	t.Parallel()
	const concurrency, priority, waiters = 4, 2, 4
	const bound = concurrency + waiters + priority + waiters
	e := newEnv(t, "sms:recipient=100/1m,sms:tenant=100000/1h,sms.otp:exempt", "--appendonly", "yes", "--appendfsync", "always")
	e.sms.SetLatency(time.Second)
	e.worker("w0", map[string]string{"SLUICE_CONCURRENCY": strconv.Itoa(concurrency), "SLUICE_PRIORITY_CONCURRENCY": strconv.Itoa(priority),
		"SLUICE_MAX_WAITERS": strconv.Itoa(waiters)})
	ids, prio := map[string]string{}, map[string]bool{}
	rcpts := recipients(40)
	for i := 0; i < 120; i++ {
		n := tasks.NewSMS("acme", rcpts[i%len(rcpts)], "outage "+strconv.Itoa(i))
		if i%2 == 0 {
			n.Category = "otp" // the priority lane
			prio[n.ID] = true
		}
		if _, err := tasks.Enqueue(context.Background(), e.client, e.keys, n); err != nil {
			t.Fatal(err)
		}
		ids[n.ID] = n.To
	}
	// Kill while sends are at the provider. The provider answers the first
	// 30 and holds every later request unanswered until Redis is dead, so
	// that requests are in flight at the kill however the machine is
	// loaded: timed by the provider's latency alone, a loaded run once
	// killed between two waves (30 received ended one), and a run beside two
	// CPU hogs saw 4 in flight and yet none answered after the kill: the
	// kill came more than the latency (1 s) after the look ("nothing was in
	// flight").
	var answered atomic.Int64
	gate := make(chan struct{})
	e.sms.SetReply(func(string, string) (int, string) {
		if answered.Add(1) > 30 {
			<-gate // a scenario: held until the kill below, then answered
		}
		return 0, ""
	})
	e.sms.WaitFor(t, time.Minute, "30 received and 4 requests held at the provider", func(ds []fakes.Delivery) bool {
		return len(ds) >= 30 && e.sms.InFlightFrom("+15005550006") >= 4
	})
	killed := time.Now()
	e.redis.Stop()
	close(gate)
	// A send admitted before the kill arrives within the provider's latency
	// (or MAX_INLINE_WAIT, 2 s, for one waiting for its slot); nothing else
	// may arrive while Redis is down.
	time.Sleep(3 * time.Second)
	var after, otp int
	var last time.Duration
	for _, d := range e.sms.Deliveries() {
		if d.Answered.After(killed) { // at the provider after the kill: arrived since, or answered since
			after++
			last = d.Answered.Sub(killed)
			if prio[d.ID] {
				otp++
			}
		}
	}
	e.redis.Restart(t)
	ds := e.waitAllDelivered(ids, 2*time.Minute)
	r := auditWithin(ds, 100, time.Minute, byRecipient, latencyBudget+3*time.Second) // the 3 s outage's wait on top (TestRedisOutageRecoversInSeconds)
	t.Logf("Redis killed under load: %d sends reached the provider after the kill (%d of them priority), the last %v after it (bound: (CONCURRENCY %d + MAX_WAITERS %d) + (PRIORITY_CONCURRENCY %d + MAX_WAITERS %d) = %d); after the restart all %d delivered, %d repeats",
		after, otp, last.Round(time.Millisecond), concurrency, waiters, priority, waiters, bound, len(ids), r.duplicates)
	if after > bound {
		t.Fatalf("%d sends after the kill, above the tasks a worker runs at once (%d)", after, bound)
	}
	if after == 0 {
		t.Fatal("nothing was in flight at the kill: the test measured nothing")
	}
	if r.duplicates != 0 {
		t.Fatalf("%d repeats", r.duplicates)
	}
}
