package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/throttle"
)

// Three worker processes drain 700 SMS under tight quotas while two of them
// are killed with SIGKILL, four times mid-send, and restarted. Nothing is lost,
// and no recipient's window holds more receipts than the limit — every
// receipt counted, repeats included: a send whose outcome the killed worker
// never recorded is sent again (at-least-once) in a fresh slot. The delay
// until a killed worker's tasks are delivered (Asynq's lease recovery) is
// measured.
func TestWorkerKilledMidFlight(t *testing.T) {
	t.Parallel()
	// 28 per recipient at 2 per 4 s: about 56 s of backlog, room for four
	// rounds of kills 5 s apart while work remains.
	e := newEnv(t, "sms:recipient=2/4s,sms:tenant=100000/1h")
	e.sms.SetLatency(300 * time.Millisecond) // sends are in flight when the kill lands
	workers := []*proc{e.worker("w0", nil), e.worker("w1", nil), e.worker("w2", nil)}
	all := slices.Clone(workers)
	ids := e.enqueueSMS(700, recipients(25), []string{"acme"})
	type orphan struct {
		id     string
		killed time.Time
	}
	var orphans []orphan
	for k := 0; k < 4; k++ {
		e.sms.WaitCount(t, 60*(k+1), time.Minute)
		// Kill two of the three workers while tasks are in flight: sends take
		// 300 ms at the provider, so a burst keeps slots busy. Asynq offers no
		// signal for it, and its servers list their running tasks only in
		// heartbeats (every 5 s), while a worker takes its tasks a batch at a
		// time, so which one holds them is not known: two of three hold most
		// of them. The third, a different one each time, survives.
		var active []string
		if err := sluicetest.Wait(30*time.Second, "6 tasks in flight", func() bool { active = e.activeTasks(); return len(active) >= 6 }); err != nil {
			t.Fatalf("kill %d: fewer than 6 tasks in flight for 30 s (%d delivered of %d): the backlog ran out before the kills", k+1, len(e.sms.Deliveries()), len(ids))
		}
		survivor := k % len(workers)
		for i := range workers {
			if i != survivor {
				workers[i].kill()
			}
		}
		killed := time.Now()
		for i := range workers {
			if i != survivor {
				workers[i] = e.worker(fmt.Sprintf("w%d-restart%d", i, k), nil)
				all = append(all, workers[i])
			}
		}
		// A live worker finishes a task within its inline wait (2 s) and a
		// send; what is still active 5 s after the kill was the killed one's.
		time.Sleep(5 * time.Second)
		still := map[string]bool{}
		for _, id := range e.activeTasks() {
			still[id] = true
		}
		for _, id := range active {
			if still[id] {
				orphans = append(orphans, orphan{id, killed})
			}
		}
	}
	// Tasks of a killed worker come back when the survivors' sweepers see
	// their leases stand still for SLUICE_ORPHAN_AFTER (15 s), not after
	// Asynq's own lease recovery (60–120 s).
	ds := e.waitAllDelivered(ids, 3*time.Minute)
	r := audit(ds, 2, 4*time.Second, byRecipient)
	first := map[string]time.Time{}
	for _, d := range ds {
		if _, ok := first[d.ID]; !ok {
			first[d.ID] = d.At
		}
	}
	// When each was put back in the queue: the sweepers log it (a task a
	// later kill orphaned again is put back again).
	requeued := map[string][]time.Time{}
	for _, w := range all {
		for _, line := range strings.Split(w.logText(), "\n") {
			if !strings.Contains(line, `msg="requeued an orphaned task`) {
				continue
			}
			var at time.Time
			var id string
			for _, f := range strings.Fields(line) {
				if v, ok := strings.CutPrefix(f, "time="); ok {
					at, _ = time.Parse(time.RFC3339Nano, v)
				}
				if v, ok := strings.CutPrefix(f, "task="); ok {
					id = v
				}
			}
			requeued[id] = append(requeued[id], at)
		}
	}
	var delays, requeues []time.Duration
	for _, o := range orphans {
		if at, ok := first[o.id]; ok && at.After(o.killed) {
			delays = append(delays, at.Sub(o.killed))
		}
		for _, at := range requeued[o.id] { // the first after its kill
			if at.After(o.killed) {
				requeues = append(requeues, at.Sub(o.killed))
				break
			}
		}
	}
	slices.Sort(delays)
	slices.Sort(requeues)

	t.Logf("two of three killed, 4 times: %d notifications, %d receipts, %d lost, %d repeats, %d window violations; %d tasks in flight on killed workers: %d requeued by the orphan sweep after p50 %v max %v, delivered (at their recipients' slots) after p50 %v max %v",
		len(ids), r.receipts, len(ids)-r.delivered, r.duplicates, r.violations, len(orphans), len(requeues), pct(requeues, 50), pct(requeues, 100), pct(delays, 50), pct(delays, 100))
	if r.violations != 0 {
		t.Fatalf("window exceeded, counting every receipt: %s", r.worst)
	}
	if len(orphans) == 0 {
		t.Fatal("no task was in flight on a killed worker: the kills tested nothing")
	}
	// Requeued about 16 s after the kill (its lease last moved at or before
	// the kill; ORPHAN_AFTER 15 s and a sweep; 17 s seen under CI's load,
	// 30 s beside two CPU hogs and a benchmark, as a sweeper counts only
	// time it saw answers from Redis), well under the 55 s Asynq's own
	// recovery needs at the least (and the log line says the sweep did it);
	// then sent at its recipient's slot. The bound is latency: 45 s.
	if len(requeues) == 0 {
		t.Fatal("no task of a killed worker was requeued by the orphan sweep")
	}
	if worst := requeues[len(requeues)-1]; worst > 45*time.Second {
		t.Fatalf("a killed worker's task was requeued %v after the kill; want ORPHAN_AFTER (15 s) + a sweep", worst)
	}
	if qi, err := e.queueInfo(); err != nil || qi.Archived != 0 {
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

// pct is the p-th percentile of sorted durations (0 when empty).
func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, len(d)*p/100)].Round(100 * time.Millisecond)
}

// Redis crashes (SIGKILL) mid-run and comes back from its AOF (fsync
// always) 2 s later. Sends that reached the provider while Redis was down
// get their done record once it is back, so nothing is sent twice; nothing
// is lost, and no window holds more receipts than the limit.
func TestRedisCrash(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=3/2s,sms:tenant=100000/1h", "--appendonly", "yes", "--appendfsync", "always")
	e.sms.SetLatency(40 * time.Millisecond)
	e.worker("w0", nil)
	e.worker("w1", nil)
	ids := e.enqueueSMS(60, recipients(4), []string{"acme"})
	e.sms.WaitCount(t, 12, time.Minute)
	e.redis.Stop()
	time.Sleep(2 * time.Second) // the outage under test: Redis stays dead this long
	e.redis.Restart(t)
	ds := e.waitAllDelivered(ids, 2*time.Minute)
	r := auditWithin(ds, 3, 2*time.Second, byRecipient, latencyBudget+2*time.Second) // the outage's wait on top (TestRedisOutageRecoversInSeconds)
	t.Logf("redis crashed for 2 s: %d receipts, %d lost, %d repeats, %d violations", r.receipts, len(ids)-r.delivered, r.duplicates, r.violations)
	if r.violations != 0 {
		t.Fatalf("window exceeded across the crash: %s", r.worst)
	}
	if r.duplicates != 0 {
		t.Fatalf("%d notifications were received twice", r.duplicates)
	}
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
	sluicetest.EventuallyValueEvery(t, timeout, 50*time.Millisecond, fmt.Sprintf("/readyz to answer %d", want), func() (int, bool) {
		code := readyz(addr)
		return code, code == want
	})
}

// A 2-second Redis crash while sends are in flight: nothing is sent while
// Redis is away, /readyz says why, and work resumes within seconds of its
// return — tasks caught mid-check or mid-record wait in the worker and
// retry every SLUICE_UNAVAILABLE_RETRY instead of waiting for Asynq's lease
// recovery. Nothing is lost or sent twice.
//
// One case is Asynq's own: a task whose dequeue Redis ran just as it died
// (the reply lost) stays "active" with no worker. Asynq would recover it
// 60–120 s later; the workers' orphan sweepers requeue it once its lease
// has stood still for SLUICE_ORPHAN_AFTER (15 s) with Redis answering.
// Such orphans are told apart (still active 6 s after Redis returned, when
// any live task has long finished), counted, and must arrive within
// ORPHAN_AFTER + 7 s; everything else within 8 s.
func TestRedisOutageRecoversInSeconds(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=5/1m,sms:tenant=100000/1h", "--appendonly", "yes", "--appendfsync", "always")
	e.sms.SetLatency(100 * time.Millisecond)
	addr := freeAddr(t)
	w0 := e.worker("w0", map[string]string{"SLUICE_HTTP_ADDR": addr})
	w1 := e.worker("w1", nil)
	waitStatus(t, addr, 200, 10*time.Second)
	ids := e.enqueueSMS(120, recipients(120), []string{"acme"})
	e.sms.WaitCount(t, 20, time.Minute)
	e.redis.Stop()
	down := time.Now()
	waitStatus(t, addr, 503, 10*time.Second)
	time.Sleep(time.Until(down.Add(2 * time.Second))) // the outage under test
	e.redis.Restart(t)
	back := time.Now()
	// A send already past the limiter when Redis went away lands within the
	// provider's latency; nothing may arrive later while Redis is down.
	for _, d := range e.sms.Deliveries() {
		if d.At.After(down.Add(500*time.Millisecond)) && d.At.Before(back) {
			t.Fatalf("a send arrived %v into the Redis outage", d.At.Sub(down))
		}
	}
	time.Sleep(time.Until(back.Add(6 * time.Second))) // live tasks finish within ~2.5 s: what is active after 6 s has no worker
	delivered := map[string]bool{}
	for _, d := range e.sms.Deliveries() {
		delivered[d.ID] = true
	}
	// Active but already delivered: Asynq is still syncing its completion
	// (its syncer retries every 5 s); not an orphan.
	orphans := map[string]bool{}
	for _, id := range e.activeTasks() {
		if !delivered[id] {
			orphans[id] = true
		}
	}
	ds := e.waitAllDelivered(ids, 3*time.Minute)
	// A send caught by the crash between its admission and its request
	// waits the outage out (one reached the provider 2.51 s after its slot
	// beside two CPU hogs): the latency budget is the outage's on top of
	// the audits'. The slots themselves are judged exactly as ever.
	r := auditWithin(ds, 5, time.Minute, byRecipient, latencyBudget+2*time.Second)
	var lastLive, lastOrphan time.Time
	for _, d := range ds {
		if orphans[d.ID] {
			lastOrphan = maxTime(lastOrphan, d.At)
		} else {
			lastLive = maxTime(lastLive, d.At)
		}
	}
	orphaned := "none orphaned by a lost dequeue reply"
	if len(orphans) > 0 {
		orphaned = fmt.Sprintf("%d orphaned by a lost dequeue reply, the last delivered %v after (orphan sweep)", len(orphans), lastOrphan.Sub(back).Round(100*time.Millisecond))
	}
	t.Logf("2 s Redis crash: %d receipts, %d repeats; all but Asynq's orphans delivered %v after Redis returned; %s",
		r.receipts, r.duplicates, lastLive.Sub(back).Round(100*time.Millisecond), orphaned)
	if r.duplicates != 0 || r.violations != 0 {
		t.Fatalf("%d repeats, %d violations (%s)", r.duplicates, r.violations, r.worst)
	}
	if since := lastLive.Sub(back); since > 8*time.Second {
		t.Fatalf("a notification arrived %v after Redis returned; want a few seconds", since)
	}
	if since := lastOrphan.Sub(back); len(orphans) > 0 && since > 22*time.Second {
		t.Fatalf("a task orphaned by a lost dequeue arrived %v after Redis returned; want ORPHAN_AFTER (15 s) + a few seconds", since)
	}
	// A take whose reply Redis lost as it died leaves every task it leased
	// active and received by no one: since dequeues are batched (issue 55),
	// up to a batch (SLUICE_DEQUEUE_BATCH, 16) each, not one; a full run
	// lost 5 in one reply. More than a batch per worker is a leak.
	if len(orphans) > 2*16 {
		t.Fatalf("%d tasks stuck active after the restart: more than the two workers' lost dequeue replies explain (a batch of 16 each)", len(orphans))
	}
	if qi, err := e.queueInfo(); err != nil || qi.Archived != 0 {
		t.Fatalf("archived after the outage: %+v %v", qi, err)
	}
	// The workers saw the outage: one with a task on Redis then says
	// "redis unreachable"; when no task touched Redis in those 2 s (a full
	// run, its sends late and held back before the crash, had none), the
	// dequeues Asynq tried did.
	if l0, l1 := w0.logText(), w1.logText(); !strings.Contains(l0+l1, "redis unreachable") && !strings.Contains(l0+l1, "connection refused") {
		t.Fatalf("neither worker's log shows the outage:\n%s\n%s", l0, l1)
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
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
	r := audit(ds, 100, time.Hour, byRecipient)
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
	r := audit(ds, 1000, time.Hour, byRecipient)
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
	if _, err := tasks.Enqueue(context.Background(), e.client, e.keys, n); err != nil {
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
