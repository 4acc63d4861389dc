package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/fakes"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// Three worker processes drain 500 SMS under tight quotas while one of them
// is killed with SIGKILL four times mid-send and restarted. Nothing is lost,
// no recipient's window is exceeded, and duplicates are counted.
func TestWorkerKilledMidFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=2/3s,sms:tenant=100000/1h")
	e.sms.SetLatency(30 * time.Millisecond) // sends are in flight when the kill lands
	workers := []*proc{e.worker("w0", nil), e.worker("w1", nil), e.worker("w2", nil)}
	ids := e.enqueueSMS(500, recipients(50), []string{"acme"})
	for k := 0; k < 4; k++ {
		e.sms.WaitCount(t, 60*(k+1), time.Minute)
		i := k % len(workers)
		workers[i].kill()
		workers[i] = e.worker(fmt.Sprintf("w%d-restart%d", i, k), nil)
	}
	// Tasks of a killed worker come back when Asynq's lease (30 s) and its
	// recoverer (every minute) say so.
	ds := e.waitAllDelivered(ids, 4*time.Minute)
	r := audit(ds, 2, 3*time.Second, 100*time.Millisecond)
	t.Logf("killed 4 times: %d notifications, %d delivered, %d lost, %d duplicate sends, %d window violations",
		len(ids), r.delivered, len(ids)-r.delivered, r.duplicates, r.violations)
	if r.violations != 0 {
		t.Fatalf("window exceeded: %s", r.worst)
	}
	if qi, _ := e.insp.GetQueueInfo(tasks.DefaultQueue); qi.Archived != 0 {
		t.Fatalf("%d tasks archived", qi.Archived)
	}
	// No PII at rest: no key holds a recipient in clear; every Sluice key expires.
	keys := e.rdb.Keys(context.Background(), "*").Val()
	for _, k := range keys {
		if strings.Contains(k, "1415555") {
			t.Fatalf("key %q holds a recipient number in clear", k)
		}
	}
	if left := e.keysWithoutTTL(); len(left) != 0 {
		t.Fatalf("keys without TTL: %v", left)
	}
	for _, w := range workers {
		if log := w.logText(); strings.Contains(log, "+1415555") {
			t.Fatalf("%s logged a recipient in clear at info level", w.name)
		}
	}
}

// Redis is killed and restarted (AOF, fsync always) mid-run: queued tasks
// and quota windows survive, workers reconnect by themselves, and there is
// no burst after the restart.
func TestRedisRestart(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=3/2s,sms:tenant=100000/1h", "--appendonly", "yes", "--appendfsync", "always")
	e.worker("w0", nil)
	e.worker("w1", nil)
	ids := e.enqueueSMS(60, recipients(2), []string{"acme"})
	e.sms.WaitCount(t, 12, time.Minute)
	e.redis.Restart(t)
	ds := e.waitAllDelivered(ids, 3*time.Minute)
	r := audit(ds, 3, 2*time.Second, 100*time.Millisecond)
	t.Logf("redis restarted: %d delivered, %d lost, %d duplicates, %d violations", r.delivered, len(ids)-r.delivered, r.duplicates, r.violations)
	if r.violations != 0 {
		t.Fatalf("window exceeded across the restart: %s", r.worst)
	}
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func readyz(addr string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// waitStatus polls /readyz (the worker offers no push signal) until it answers want.
func waitStatus(t *testing.T, addr string, want int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for readyz(addr) != want {
		if time.Now().After(deadline) {
			t.Fatalf("/readyz did not answer %d within %v", want, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// While Redis is unreachable nothing is sent, /readyz says why, and no task
// is lost or archived; work resumes when Redis returns.
func TestRedisUnreachable(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=2/1s,sms:tenant=100000/1h", "--appendonly", "yes", "--appendfsync", "always")
	addr := freeAddr(t)
	w := e.worker("w0", map[string]string{"SLUICE_HTTP_ADDR": addr})
	waitStatus(t, addr, 200, 10*time.Second)
	ids := e.enqueueSMS(40, recipients(2), []string{"acme"})
	e.sms.WaitCount(t, 8, time.Minute)
	e.redis.Stop()
	down := time.Now()
	waitStatus(t, addr, 503, 10*time.Second)
	time.Sleep(3 * time.Second) // the outage: Redis stays down this long
	// A send already past the limiter when Redis went away may still land
	// within the provider's latency; nothing may arrive later than that.
	for _, d := range e.sms.Deliveries() {
		if d.At.After(down.Add(200 * time.Millisecond)) {
			t.Fatalf("a send arrived %v into the Redis outage", d.At.Sub(down))
		}
	}
	e.redis.Restart(t)
	waitStatus(t, addr, 200, 20*time.Second)
	ds := e.waitAllDelivered(ids, 2*time.Minute)
	if qi, err := e.insp.GetQueueInfo(tasks.DefaultQueue); err != nil || qi.Archived != 0 {
		t.Fatalf("archived after the outage: %+v %v", qi, err)
	}
	r := audit(ds, 2, time.Second, 100*time.Millisecond)
	if r.violations != 0 {
		t.Fatalf("window exceeded: %s", r.worst)
	}
	if log := w.logText(); !strings.Contains(log, "connection refused") && !strings.Contains(log, "quota check failed") {
		t.Fatalf("the worker's log does not say Redis was unreachable:\n%s", log)
	}
	t.Logf("3 s Redis outage: %d delivered, %d lost, %d duplicates", r.delivered, len(ids)-r.delivered, r.duplicates)
}

// The SMS provider refuses everything (503) for a while: tasks retry with
// backoff and are delivered once it returns; refused sends give their quota
// slots back.
func TestProviderOutage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=100/1h,sms:tenant=1000/1h")
	e.sms.SetReply(func(string, string) (int, string) { return 503, "" })
	e.worker("w0", nil)
	e.worker("w1", nil)
	ids := e.enqueueSMS(40, recipients(4), []string{"acme"})
	e.sms.WaitFor(t, time.Minute, "refused attempts", func([]fakes.Delivery) bool { return e.sms.Attempts() >= 60 })
	e.sms.SetReply(nil)
	ds := e.waitAllDelivered(ids, 2*time.Minute)
	r := audit(ds, 100, time.Hour, 0)
	if r.duplicates != 0 {
		t.Fatalf("%d duplicates", r.duplicates)
	}
	lim, _ := throttle.New(e.rdb, throttle.Options{Secret: []byte(secret)})
	u, err := lim.Usage(context.Background(), "acme", 0, throttle.Limit{Scope: "sms:tenant", Rule: throttle.PerHour(1000)})
	if err != nil {
		t.Fatal(err)
	}
	if u[0].Used != len(ids) {
		t.Fatalf("tenant window holds %d sends for %d delivered after %d attempts: refused sends kept their slots", u[0].Used, len(ids), e.sms.Attempts())
	}
	t.Logf("provider outage: %d attempts for %d notifications, all delivered once, tenant window %d", e.sms.Attempts(), len(ids), u[0].Used)
}

// SIGTERM under load: in-flight sends finish, the worker exits 0, and a new
// worker takes the rest; nothing is lost or sent twice.
func TestGracefulShutdown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=1000/1h,sms:tenant=100000/1h")
	e.sms.SetLatency(300 * time.Millisecond)
	w := e.worker("w0", nil)
	ids := e.enqueueSMS(60, recipients(10), []string{"acme"})
	e.sms.WaitCount(t, 5, 30*time.Second)
	w.term(t, 15*time.Second)
	e.worker("w1", nil)
	ds := e.waitAllDelivered(ids, time.Minute)
	r := audit(ds, 1000, time.Hour, 0)
	if r.duplicates != 0 {
		t.Fatalf("%d duplicates after SIGTERM", r.duplicates)
	}
	if !strings.Contains(w.logText(), "worker stopped") {
		t.Fatalf("no clean stop in the log:\n%s", w.logText())
	}
}

// A password-protected Redis works through the URL, and the password is
// masked in the worker's log.
func TestRedisAuth(t *testing.T) {
	t.Parallel()
	const pass = "s3cret-redis-pass"
	e := newEnv(t, "sms:recipient=10/1m", "--requirepass", pass)
	authed := redis.NewClient(&redis.Options{Addr: e.redis.Addr, Password: pass})
	t.Cleanup(func() { authed.Close() })
	e.rdb = authed
	e.client = asynq.NewClientFromRedisClient(authed)
	e.vars["SLUICE_REDIS_URL"] = "redis://:" + pass + "@" + e.redis.Addr
	w := e.worker("w0", nil)
	n := tasks.NewSMS("acme", "+14155550100", "auth")
	if _, err := tasks.Enqueue(context.Background(), e.client, n); err != nil {
		t.Fatal(err)
	}
	e.sms.WaitCount(t, 1, 30*time.Second)
	if log := w.logText(); strings.Contains(log, pass) || !strings.Contains(log, "xxxxx") {
		t.Fatalf("password not masked in the log:\n%s", log)
	}
	// And without the password the worker fails closed with a clear error.
	bad := map[string]string{"SLUICE_REDIS_URL": "redis://:wrong@" + e.redis.Addr}
	p := e.worker("w-bad", bad)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatal("worker with a wrong password kept running")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(strings.ToLower(p.logText()), "wrongpass") && !strings.Contains(p.logText(), "invalid") {
		t.Fatalf("exit %d, log:\n%s", code, p.logText())
	}
}
