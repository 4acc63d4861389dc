package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/apienv"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

const (
	apiTokenKey   = "e2e-api-token-key-0123456789abcdef0123"
	apiAdminToken = "e2e-admin-token-0123456789abcdef0123456789"
)

// apiEnv is an env with a running `sluice api` and tenant tokens made by
// `sluice tenant token create`.
type apiEnv struct {
	*env
	base   string // http://127.0.0.1:port
	proc   *proc
	tokens map[string]string
}

// startAPI runs `sluice api` on a free port and waits for /readyz.
func (e *env) startAPI(extra map[string]string, tenants ...string) *apiEnv {
	e.t.Helper()
	return e.startAPIAt(freeAddr(e.t), extra, tenants...)
}

// startAPIAt runs `sluice api` on addr (host:port) and waits for /readyz.
func (e *env) startAPIAt(addr string, extra map[string]string, tenants ...string) *apiEnv {
	e.t.Helper()
	vars := map[string]string{"SLUICE_API_ADDR": addr, "SLUICE_API_TOKEN_KEY": apiTokenKey, "SLUICE_API_ADMIN_TOKEN": apiAdminToken}
	for k, v := range extra {
		vars[k] = v
	}
	a := &apiEnv{env: e, base: "http://" + addr, tokens: map[string]string{}}
	a.proc = e.sluiceProc("api", vars, "api")
	waitStatus(e.t, addr, 200, 15*time.Second)
	for _, tenant := range tenants {
		out := e.sluiceRun(map[string]string{"SLUICE_API_TOKEN_KEY": apiTokenKey}, "tenant", "token", "create", tenant, "--name", "e2e")
		a.tokens[tenant] = strings.TrimSpace(out)
	}
	return a
}

// sluiceRun runs a sluice command to completion and returns its stdout.
func (e *env) sluiceRun(extra map[string]string, args ...string) string {
	e.t.Helper()
	cmd := exec.Command(sluiceBin, args...)
	cmd.Env = e.environ(extra)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		e.t.Fatalf("sluice %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errb.String())
	}
	return out.String()
}

// call sends one API request to the `sluice api` process (apienv.Call).
func (a *apiEnv) call(method, path, token string, body any, headers ...string) apienv.Reply {
	a.t.Helper()
	return apienv.Call(a.t, a.base, method, path, token, body, headers...)
}

func smsJSON(to, body string) string {
	return fmt.Sprintf(`{"channel":"sms","to":%q,"body":%q}`, to, body)
}

// waitDrained waits until the queue holds no task in any state: nothing
// more can reach the provider.
func (e *env) waitDrained(timeout time.Duration) {
	e.t.Helper()
	// Asynq offers no push signal for an empty queue; a read of every
	// queue costs Redis, which the workers' sends need: every 50 ms.
	sluicetest.EventuallyValueEvery(e.t, timeout, 50*time.Millisecond, "the queue to drain (no task in any state)", func() (queueRead, bool) {
		qi, err := e.queueInfo()
		return queueRead{qi, err}, err == nil && qi.Size == 0 && qi.Active == 0
	})
}

// queueRead is a read of the queues' counters, as a wait reports it.
type queueRead struct {
	Info *asynq.QueueInfo
	Err  error
}

// waitState polls a notification's status every 50 ms (it is read from
// Redis: nothing signals a change) until it is in one of states, and
// returns it.
func (a *apiEnv) waitState(t *testing.T, tok, id string, timeout time.Duration, states ...string) api.Status {
	t.Helper()
	return sluicetest.EventuallyValueEvery(t, timeout, 50*time.Millisecond, fmt.Sprintf("notification %s to be %s", id, strings.Join(states, " or ")), func() (api.Status, bool) {
		var st api.Status
		a.call("GET", "/v1/notifications/"+id, tok, nil).JSON(t, &st)
		return st, slices.Contains(states, st.State)
	})
}

// Producers retry over HTTP with Idempotency-Keys — sequentially,
// concurrently, after the key's record is lost, after the send — against
// `sluice api` and two workers: exactly one send per key reaches the
// provider. A key reused with another body is refused (422), a duplicate
// while the first is in flight gets 409, another tenant sees nothing, and
// the status endpoint reports a throttled notification's rule and slot,
// then that it was sent.
func TestAPIIdempotencyIsolationAndStatus(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=1/3s,sms:tenant=1000/1h")
	a := e.startAPI(map[string]string{"SLUICE_API_RATE": "1000/1s"}, "acme", "globex")
	e.worker("w0", nil)
	e.worker("w1", nil)
	acme, globex := a.tokens["acme"], a.tokens["globex"]

	// 20 keys, each sent 3 times at once and twice more in sequence; for
	// every 4th key the idempotency record is deleted before the last retry.
	const keys = 20
	var mu sync.Mutex
	codes := map[int]int{}
	replays := 0
	idOf := map[string]string{}
	for k := 0; k < keys; k++ {
		key := fmt.Sprintf("order-%d", k)
		body := smsJSON(fmt.Sprintf("+1415555%04d", k), "order confirmed")
		var wg sync.WaitGroup
		for c := 0; c < 3; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := a.call("POST", "/v1/notifications", acme, body, "Idempotency-Key", key)
				mu.Lock()
				codes[r.Status]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		for retry := 0; retry < 2; retry++ {
			if retry == 1 && k%4 == 0 {
				e.rdb.Del(context.Background(), api.IdempotencyRedisKey("acme", key))
			}
			r := a.call("POST", "/v1/notifications", acme, body, "Idempotency-Key", key)
			codes[r.Status]++
			if r.Status != 202 {
				t.Fatalf("key %s retry %d: %d %s", key, retry, r.Status, r.Body)
			}
			if r.Header.Get(api.HeaderReplayed) == "true" {
				replays++
			}
			var acc api.Accepted
			r.JSON(t, &acc)
			idOf[key] = acc.ID
		}
	}
	if codes[202] < 2*keys || codes[202]+codes[409] != 5*keys {
		t.Fatalf("answers to the retries: %v", codes)
	}
	// Mismatch and in-flight duplicate.
	if r := a.call("POST", "/v1/notifications", acme, smsJSON("+14155550000", "another body"), "Idempotency-Key", "order-0"); r.Status != 422 {
		t.Fatalf("key reused with another body: %d %s", r.Status, r.Body)
	}
	pr, pw := io.Pipe()
	first := make(chan apienv.Reply, 1)
	go func() {
		first <- a.call("POST", "/v1/notifications", acme, io.Reader(pr), "Idempotency-Key", "slow")
	}()
	slow := smsJSON("+14155559999", "slow client")
	if _, err := pw.Write([]byte(slow[:8])); err != nil {
		t.Fatal(err)
	}
	// The key is a Redis record: no signal to wait on.
	sluicetest.Eventually(t, 5*time.Second, "the slow request to take its key", func() bool {
		return e.rdb.Exists(context.Background(), api.IdempotencyRedisKey("acme", "slow")).Val() > 0
	})
	if r := a.call("POST", "/v1/notifications", acme, slow, "Idempotency-Key", "slow"); r.Status != 409 {
		t.Fatalf("duplicate while the first is in flight: %d %s", r.Status, r.Body)
	}
	pw.Write([]byte(slow[8:]))
	pw.Close()
	if r := <-first; r.Status != 202 {
		t.Fatalf("the slow first request: %d %s", r.Status, r.Body)
	}

	// Another tenant: nothing of acme's is visible or writable.
	someID := idOf["order-1"]
	theirs := a.call("GET", "/v1/notifications/"+someID, globex, nil)
	missing := a.call("GET", "/v1/notifications/"+tasks.NewID(), globex, nil)
	if theirs.Status != 404 || !bytes.Equal(theirs.Body, missing.Body) {
		t.Fatalf("globex reading acme's notification: %d %s (missing: %d %s)", theirs.Status, theirs.Body, missing.Status, missing.Body)
	}
	if r := a.call("GET", "/v1/quotas?tenant=acme&channel=sms", globex, nil); r.Status != 403 {
		t.Fatalf("globex reading acme's quotas: %d %s", r.Status, r.Body)
	}
	if r := a.call("POST", "/v1/notifications", globex, `{"tenant":"acme","channel":"sms","to":"+14155550001","body":"x"}`); r.Status != 403 {
		t.Fatalf("globex enqueueing for acme: %d %s", r.Status, r.Body)
	}

	// Status: two SMS to one number under 1 per 3 s; the second waits.
	var ids []string
	for i := 0; i < 2; i++ {
		var acc api.Accepted
		a.call("POST", "/v1/notifications", acme, smsJSON("+14155558888", fmt.Sprintf("status %d", i))).JSON(t, &acc)
		ids = append(ids, acc.ID)
	}
	// The two go to different workers at once: either may be the one that waits.
	// Polling the status endpoint is the scenario.
	held := ""
	waiting := sluicetest.EventuallyValue(t, 10*time.Second, "either notification to read as waiting", func() (api.Status, bool) {
		var st api.Status
		for _, id := range ids {
			if a.call("GET", "/v1/notifications/"+id, acme, nil).JSON(t, &st); st.State == api.StateWaiting {
				held = id
				return st, true
			}
		}
		return st, false
	})
	ids[1] = held
	if waiting.Reason != "throttled" || waiting.Rule != "sms:recipient 1/3s" || waiting.Slot.IsZero() {
		t.Fatalf("waiting: %+v", waiting)
	}
	ds := e.sms.WaitFor(t, 15*time.Second, "the throttled notification", func(ds []fakes.Delivery) bool {
		for _, d := range ds {
			if d.ID == ids[1] {
				return true
			}
		}
		return false
	})
	var arrived time.Time
	for _, d := range ds {
		if d.ID == ids[1] {
			arrived = d.At
		}
	}
	sluicetest.EventuallyValue(t, 5*time.Second, "the throttled notification to read as sent", func() (api.Status, bool) {
		var st api.Status
		a.call("GET", "/v1/notifications/"+ids[1], acme, nil).JSON(t, &st)
		return st, st.State == api.StateSent
	})
	if arrived.Before(waiting.Slot) || arrived.After(waiting.Slot.Add(time.Second)) {
		t.Fatalf("arrived at %v; the status said slot %v", arrived, waiting.Slot)
	}

	// Every key's notification sent; retries now — record lost or not —
	// report it sent and enqueue nothing. Once the queue is empty nothing
	// more can arrive: count.
	e.waitDrained(30 * time.Second)
	for k := 0; k < keys; k += 4 {
		key := fmt.Sprintf("order-%d", k)
		e.rdb.Del(context.Background(), api.IdempotencyRedisKey("acme", key))
		r := a.call("POST", "/v1/notifications", acme, smsJSON(fmt.Sprintf("+1415555%04d", k), "order confirmed"), "Idempotency-Key", key)
		var acc api.Accepted
		r.JSON(t, &acc)
		if r.Status != 202 || acc.State != api.StateSent {
			t.Fatalf("retry of %s after its send: %d %s", key, r.Status, r.Body)
		}
	}
	e.waitDrained(10 * time.Second)
	perID := map[string]int{}
	for _, d := range e.sms.Deliveries() {
		perID[d.ID]++
	}
	sends := map[int]int{}
	for k := 0; k < keys; k++ {
		n := perID[idOf[fmt.Sprintf("order-%d", k)]]
		sends[n]++
		if n != 1 {
			t.Errorf("key order-%d: %d sends at the provider, want 1", k, n)
		}
	}
	r := audit(e.sms.Deliveries(), 1, 3*time.Second, byRecipient)
	t.Logf("%d keys × 5 requests (%d answered 202, %d 409, %d replays of the sequential retries): sends per key %v; "+
		"throttled one waited under %s for %s, arrived %v after; %d receipts, %d violations",
		keys, codes[202], codes[409], replays, sends, waiting.Rule, waiting.Slot.Format("15:04:05.000"),
		arrived.Sub(waiting.Slot).Round(time.Millisecond), r.receipts, r.violations)
	if r.violations != 0 || r.duplicates != 0 {
		t.Fatalf("receipts: %+v", r)
	}
	// SIGTERM: the API drains and exits 0.
	a.proc.term(t, 15*time.Second)
	if !strings.Contains(a.proc.logText(), "api stopped") {
		t.Fatalf("no clean stop in the API's log:\n%s", a.proc.logText())
	}
}

// A tenant's plan changes under load through `sluice tenant set` while
// producers enqueue over HTTP: the workers apply it within 2 s, no 2 s
// window after that holds more receipts than the new limit, none ever more
// than the old one, and the API's quota view shows the new rule.
func TestAPIPlanChangeUnderLoad(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:tenant=20/2s,sms:recipient=100/1m")
	e.vars["SLUICE_LOG_FORMAT"] = "json"
	a := e.startAPI(map[string]string{"SLUICE_API_RATE": "100/1s"}, "acme")
	workers := []*proc{e.worker("w0", nil), e.worker("w1", nil)}
	tok := a.tokens["acme"]
	stop := time.After(8 * time.Second)
	changeAt := time.After(3 * time.Second)
	tick := time.NewTicker(time.Second / 15)
	defer tick.Stop()
	var changed, seenByAPI time.Time
	apiSaw := make(chan time.Time, 1)
	n := 0
loop:
	for {
		select {
		case <-tick.C:
			r := a.call("POST", "/v1/notifications", tok, smsJSON(fmt.Sprintf("+1415555%04d", n%500), "load"), "Idempotency-Key", fmt.Sprintf("load-%d", n))
			if r.Status != 202 {
				t.Fatalf("enqueue %d: %d %s", n, r.Status, r.Body)
			}
			n++
		case <-changeAt:
			changed = time.Now()
			e.sluiceRun(nil, "tenant", "set", "acme", "--rules", "sms:tenant=5/2s", "--by", "e2e")
			go func() { // the admin's quota view, polled: the API offers no push
				for i := 0; i < 200; i++ {
					var q struct{ Windows []struct{ Rule string } }
					r := a.call("GET", "/v1/quotas?tenant=acme&channel=sms", apiAdminToken, nil)
					if json.Unmarshal(r.Body, &q) == nil && len(q.Windows) == 1 && q.Windows[0].Rule == "5/2s" {
						apiSaw <- time.Now()
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
				close(apiSaw)
			}()
		case <-stop:
			break loop
		}
	}
	seenByAPI = <-apiSaw
	var applied time.Time
	for _, w := range workers {
		at := planAppliedAt(t, w)
		if at.After(applied) {
			applied = at
		}
	}
	if seenByAPI.IsZero() || applied.IsZero() {
		t.Fatalf("the change was not seen: api %v, workers %v", seenByAPI, applied)
	}
	if lag := applied.Sub(changed); lag > 2*time.Second {
		t.Fatalf("the workers applied the change %v after it was made; want ≤ 2 s", lag)
	}
	// The backlog drains at the new pace after the load stops: audit at
	// least 8 receipts after the change, every one counted.
	e.sms.WaitFor(t, 20*time.Second, "8 receipts after the change", func(ds []fakes.Delivery) bool {
		k := 0
		for _, d := range ds {
			if d.At.After(applied.Add(100 * time.Millisecond)) {
				k++
			}
		}
		return k >= 8
	})
	var all, after []time.Time
	for _, d := range e.sms.Deliveries() {
		all = append(all, d.At)
		if d.At.After(applied.Add(100 * time.Millisecond)) {
			after = append(after, d.At)
		}
	}
	busiest := func(times []time.Time, window time.Duration) int {
		sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
		best := 0
		for i := range times {
			j := i
			for j < len(times) && times[j].Sub(times[i]) <= window {
				j++
			}
			best = max(best, j-i)
		}
		return best
	}
	t.Logf("%d enqueued over HTTP at 15/s; plan set by `sluice tenant set` applied by both workers %v after, shown by /v1/quotas %v after; %d receipts, %d after the change; busiest 2 s: %d overall (limit 20), %d after (limit 5)",
		n, applied.Sub(changed).Round(time.Millisecond), seenByAPI.Sub(changed).Round(time.Millisecond), len(all), len(after), busiest(all, 2*time.Second), busiest(after, 2*time.Second))
	if got := busiest(all, 2*time.Second); got > 20 {
		t.Fatalf("%d receipts within 2 s: over the old limit of 20", got)
	}
	if got := busiest(after, 2*time.Second); got > 5 {
		t.Fatalf("%d receipts within 2 s after the change: over the new limit of 5", got)
	}
	if seenByAPI.Sub(changed) > 2*time.Second {
		t.Fatalf("the API showed the new rule %v after the change", seenByAPI.Sub(changed))
	}
}

// planAppliedAt is when a worker (logging JSON) put plan version 1 or later in force.
func planAppliedAt(t *testing.T, p *proc) time.Time {
	t.Helper()
	f, err := os.Open(p.log)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Time    time.Time `json:"time"`
			Msg     string    `json:"msg"`
			Version int64     `json:"version"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "tenant plans in force" && line.Version >= 1 {
			return line.Time
		}
	}
	return time.Time{}
}
