// Package e2e runs the real sluice binary and real redis-server processes
// through the faults a deployment meets: killed workers, Redis restarts and
// outages, provider outages, SIGTERM under load. Every run is bounded in
// time and talks to loopback only.
package e2e

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"syscall"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

var sluiceBin string // built once by TestMain

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// The contributor's loop (go test -short ./..., ./scripts/test.sh
		// --quick) leaves out the real binaries under faults and load:
		// ./scripts/test.sh, which CI runs, runs them all.
		fmt.Println("e2e: not run with -short (./scripts/test.sh runs it)")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "sluice-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sluiceBin = filepath.Join(dir, "sluice")
	// The production build, as the Dockerfile makes it, plus the one test
	// hook of webhook/ses/testhooks.go, inert unless SLUICETEST_SNS_HOST is
	// set: SNS's signing certificate served from loopback.
	build := exec.Command("go", "build", "-tags", "nodev,sluice_testhooks", "-o", sluiceBin, "../cmd/sluice")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building sluice:", err)
		os.Exit(1)
	}
	code := m.Run()
	fmt.Printf("e2e: audits: the latest receipt reached its provider %v after its slot (budget %v); %d receipts judged at arrival\n",
		time.Duration(latestSeen.Load()), latencyBudget, judgedAtArrival.Load())
	os.RemoveAll(dir)
	os.Exit(code)
}

const secret = "e2e-subject-secret-0123456789"

// sendSlack is the workers' SLUICE_SEND_SLACK: sends are kept window +
// slack apart, so receipts at the provider keep the window as long as send
// latency varies by less than this. The audits allow no other tolerance.
// 250 ms: with 150 ms a full run on two cores saw receipts 150.4 ms beyond
// it (TestWorkerKilledMidFlight, 3 within 3.9996 s under 2/4s).
const sendSlack = 250 * time.Millisecond

type env struct {
	t      *testing.T
	keys   *tasks.Keyring
	redis  *redistest.Server
	rdb    *redis.Client
	sms    *fakes.SMSAPI
	client *asynq.Client
	insp   *asynq.Inspector
	vars   map[string]string
	cc     *redis.ClusterClient // onCluster's: where slotOf reads

	slotMu     sync.Mutex
	slotGroups []string // where slotOf found state records

	// foreign are the prefixes of keys the test itself writes as another
	// application would (notSluice): the key table check passes over them.
	foreign []string
}

// notSluice tells the key table check that keys starting with prefix are
// the test's own, written as another application sharing the Redis would.
func (e *env) notSluice(prefix string) { e.foreign = append(e.foreign, prefix) }

// newEnv starts a redis-server (extra args, e.g. AOF) and the fake SMS API.
// onCluster moves e onto a Redis Cluster of 3 masters with replicas each:
// the processes' SLUICE_REDIS_CLUSTER_ADDRS, and the harness's own client
// and inspector, which it returns with the Cluster. (The node newEnv
// started is left unused.)
func (e *env) onCluster(replicas int) (*redistest.Cluster, *redis.ClusterClient) {
	cl, cc := redistest.NewCluster(e.t, 3, replicas)
	e.t.Cleanup(func() { e.checkKeysInTable(cc) }) // before the Cluster stops
	e.cc = cc
	e.vars["SLUICE_REDIS_CLUSTER_ADDRS"] = strings.Join(cl.Addrs, ",")
	e.client = asynq.NewClientFromRedisClient(cc)
	e.insp = asynq.NewInspectorFromRedisClient(cc)
	return cl, cc
}

// smtpVars configure workers to send email to the fake smtp, from from,
// without TLS; extra is added to them.
func smtpVars(smtp *fakes.SMTPServer, from string, extra map[string]string) map[string]string {
	vars := map[string]string{"SLUICE_EMAIL_SENDER": "smtp", "SLUICE_SMTP_HOST": smtp.Host, "SLUICE_SMTP_PORT": strconv.Itoa(smtp.Port),
		"SLUICE_SMTP_TLS": "none", "SLUICE_SMTP_FROM": from}
	maps.Copy(vars, extra)
	return vars
}

func newEnv(t *testing.T, rules string, redisArgs ...string) *env {
	t.Helper()
	srv := redistest.Start(t, redisArgs...)
	spec := tasks.NewKeySpec("e2e")
	keys, err := tasks.ParseKeyring(spec)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, keys: keys, redis: srv, rdb: srv.Client(t), sms: fakes.NewSMSAPI(t)}
	t.Cleanup(func() { e.checkKeysInTable(e.rdb) }) // before Redis stops and its client closes
	e.sms.SetSlots(e.slotOf)
	e.client = asynq.NewClientFromRedisClient(e.rdb)
	e.insp = asynq.NewInspectorFromRedisClient(e.rdb)
	e.vars = map[string]string{
		"SLUICE_REDIS_URL":         srv.URL(),
		"SLUICE_SUBJECT_SECRET":    secret,
		"SLUICE_PAYLOAD_KEYS":      spec,
		"SLUICE_SEND_SLACK":        sendSlack.String(),
		"SLUICE_RULES":             rules,
		"SLUICE_SMS_SENDER":        "http",
		"SLUICE_SMS_BASE_URL":      e.sms.URL,
		"SLUICE_SMS_ACCOUNT_SID":   e.sms.AccountSID,
		"SLUICE_SMS_AUTH_TOKEN":    e.sms.AuthToken,
		"SLUICE_SMS_FROM":          "+15005550006",
		"SLUICE_HTTP_ADDR":         "off",
		"SLUICE_RETRY_BASE":        "500ms",
		"SLUICE_RETRY_MAX":         "2s",
		"SLUICE_UNAVAILABLE_RETRY": "300ms",
		"SLUICE_SHUTDOWN_TIMEOUT":  "10s",
		"SLUICE_CONCURRENCY":       "8",
		"SLUICE_LOG_LEVEL":         "info",
	}
	return e
}

type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// worker starts a `sluice worker` process with the env's variables plus extra.
func (e *env) worker(name string, extra map[string]string) *proc {
	e.t.Helper()
	return e.sluiceProc(name, extra, "worker")
}

// sluiceProc starts the sluice binary with the env's variables plus extra.
func (e *env) sluiceProc(name string, extra map[string]string, args ...string) *proc {
	e.t.Helper()
	cmd := exec.Command(sluiceBin, args...)
	cmd.Env = e.environ(extra)
	logPath := filepath.Join(e.t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	e.t.Cleanup(func() {
		p.kill()
		if e.t.Failed() {
			e.t.Logf("%s's log, its last %d lines:\n%s", name, procLogTail, lastLines(p.logText(), procLogTail))
		}
	})
	return p
}

// procLogTail is how many lines of each sluice process's log a failed
// test prints.
const procLogTail = 30

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (e *env) environ(extra map[string]string) []string {
	vars := map[string]string{}
	for k, v := range e.vars {
		vars[k] = v
	}
	for k, v := range extra {
		vars[k] = v
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return env
}

func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// term sends SIGTERM and waits for a graceful exit.
func (p *proc) term(t *testing.T, timeout time.Duration) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %v of SIGTERM", p.name, timeout)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("%s exited %d after SIGTERM; log:\n%s", p.name, code, p.logText())
	}
}

func (p *proc) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// enqueueSMS enqueues n SMS spread over recipients; it returns the ids.
func (e *env) enqueueSMS(n int, recipients []string, tenants []string) map[string]string {
	e.t.Helper()
	ids := map[string]string{} // id → recipient
	ctx := context.Background()
	for i := 0; i < n; i++ {
		to := recipients[i%len(recipients)]
		tenant := tenants[i%len(tenants)]
		note := tasks.NewSMS(tenant, to, "message "+strconv.Itoa(i))
		if _, err := tasks.Enqueue(ctx, e.client, e.keys, note); err != nil {
			e.t.Fatalf("enqueue %d: %v", i, err)
		}
		ids[note.ID] = to
	}
	return ids
}

func recipients(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("+1415555%04d", i)
	}
	return out
}

// waitAllDelivered waits until every id reached the provider at least once.
func (e *env) waitAllDelivered(ids map[string]string, timeout time.Duration) []fakes.Delivery {
	e.t.Helper()
	return e.sms.WaitFor(e.t, timeout, fmt.Sprintf("all %d notifications", len(ids)), func(ds []fakes.Delivery) bool {
		seen := map[string]bool{}
		for _, d := range ds {
			if _, ok := ids[d.ID]; ok {
				seen[d.ID] = true
			}
		}
		return len(seen) == len(ids)
	})
}

// latencyBudget is how long after its slot a send may reach the provider.
// The worker begins a send within SLUICE_SEND_SLACK/2 of its slot or asks
// the limiter again (the new slot is the one the fake reads), and a
// loopback request takes milliseconds: the budget is for a process starved
// of CPU, which is latency, not the limiter's decision. Under two CPU hogs
// beside the full suite the latest receipt seen was well inside it
// (docs/development.md, "Audits").
const latencyBudget = 2 * time.Second

// latestSeen is the longest any audited receipt took from its slot to the
// provider in this run, and judgedAtArrival how many receipts the audits
// could not judge by slot: TestMain prints both.
var latestSeen, judgedAtArrival atomic.Int64

// report summarises what a provider received against a rule.
type report struct {
	receipts, delivered, duplicates, violations int
	// atArrival counts receipts without a slot the fake could read (Redis
	// down at the time, a Cluster the harness does not read, a send no rule
	// checked): their subjects are judged by arrival time, with the send
	// slack as the only tolerance.
	atArrival int
	// latest is the longest a receipt took from its slot to the provider.
	latest time.Duration
	worst  string
}

// audit judges every receipt — first deliveries and repeats alike, since a
// repeat reaches the recipient too — against a rule of limit per window, per
// subject (subject(d): the recipient, the tenant, ...), in two parts kept
// apart:
//
//   - exact, by Redis's clock: the slots the limiter gave the receipts (one
//     per receipt, so a repeat on one slot counts twice) hold at most limit
//     within any window — 0 tolerance — and no receipt reached the provider
//     before its slot;
//   - latency: every receipt reached the provider within latencyBudget of its
//     slot.
//
// A subject with a receipt whose slot the fake could not read is judged by
// arrival times instead: more than limit receipts within window is a
// violation unless only the send latency's variation beyond the workers'
// slack explains it; no tolerance is added.
func audit(ds []fakes.Delivery, limit int, window time.Duration, subject func(fakes.Delivery) string) report {
	return auditWithin(ds, limit, window, subject, latencyBudget)
}

// auditWithin is audit with a latency budget of its own: for a test that
// stops Redis, where a send caught between its admission and its request
// waits out the outage.
func auditWithin(ds []fakes.Delivery, limit int, window time.Duration, subject func(fakes.Delivery) string, budget time.Duration) report {
	var r report
	seen := map[string]bool{}
	bySubject := map[string][]fakes.Delivery{}
	for _, d := range ds {
		r.receipts++
		if seen[d.ID] {
			r.duplicates++
		} else {
			seen[d.ID] = true
			r.delivered++
		}
		k := subject(d)
		bySubject[k] = append(bySubject[k], d)
	}
	for k, got := range bySubject {
		slotted := true
		for _, d := range got {
			if d.Slot.IsZero() {
				slotted = false
				r.atArrival++
				judgedAtArrival.Add(1)
			}
		}
		times := make([]time.Time, len(got))
		for i, d := range got {
			times[i] = d.At
			if !slotted {
				continue
			}
			times[i] = d.Slot
			switch lat := d.At.Sub(d.Slot); {
			case lat < 0:
				r.violations++
				r.worst = fmt.Sprintf("%s: %s reached the provider %v before its slot", k, d.ID, -lat)
			case lat > budget:
				r.violations++
				r.worst = fmt.Sprintf("%s: %s reached the provider %v after its slot (latency, over its %v budget)", k, d.ID, lat, budget)
			default:
				r.latest = max(r.latest, lat)
				for l := latestSeen.Load(); int64(lat) > l && !latestSeen.CompareAndSwap(l, int64(lat)); l = latestSeen.Load() {
				}
			}
		}
		sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
		what := "slots (Redis's clock)"
		if !slotted {
			what = "receipts (arrival)"
		}
		for i := 0; i+limit < len(times); i++ {
			if span := times[i+limit].Sub(times[i]); span <= window {
				r.violations++
				// The gaps tell a lost window entry (bunched) from send latency
				// outrunning the slack (a window + slack apart, less a little).
				gaps := make([]string, limit)
				for j := range gaps {
					gaps[j] = times[i+j+1].Sub(times[i+j]).String()
				}
				r.worst = fmt.Sprintf("%s: %d %s within %v (window %v; gaps %s)", k, limit+1, what, span, window, strings.Join(gaps, ", "))
			}
		}
	}
	return r
}

// stateKeys names the limiter's state records, as the workers name them
// (SLUICE_COMPACT_MEMBERS, the default, hashes the id).
var stateKeys = func() *throttle.Limiter {
	l, err := throttle.New(redis.NewClient(&redis.Options{Addr: "unused:0"}), throttle.Options{CompactMembers: true, Secret: []byte(secret)})
	if err != nil {
		panic(err)
	}
	return l
}()

// slotOf reads the slot the limiter gave notification id, by Redis's clock,
// from its state record ("a<attempt>:<slot ms>:<nonce>" while the send is
// admitted, throttle's scripts/op_reserve.lua), whatever its tenant: zero
// when there is none or it cannot be read. The fakes call it while the
// request is open, before the worker records the send done. It looks under
// the groups (tenants) it found before, then, if none holds it, with KEYS
// (the harness's small keyspaces only).
func (e *env) slotOf(id string) time.Time {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var c redis.UniversalClient = e.rdb
	if e.cc != nil {
		c = e.cc
	}
	e.slotMu.Lock()
	groups := slices.Clone(e.slotGroups)
	e.slotMu.Unlock()
	for _, g := range groups {
		if v, err := c.Get(ctx, stateKeys.StateKey(g, id)).Result(); err == nil {
			return stateSlot(v)
		}
	}
	pattern := strings.Replace(stateKeys.StateKey("x", id), "{x}", "{*}", 1)
	var keys []string
	var mu sync.Mutex
	read := func(ctx context.Context, c *redis.Client) error {
		ks, err := c.Keys(ctx, pattern).Result()
		mu.Lock()
		keys = append(keys, ks...)
		mu.Unlock()
		return err
	}
	if e.cc != nil {
		_ = e.cc.ForEachMaster(ctx, read)
	} else {
		_ = read(ctx, e.rdb)
	}
	if len(keys) != 1 {
		return time.Time{}
	}
	v, err := c.Get(ctx, keys[0]).Result()
	if err != nil {
		return time.Time{}
	}
	if a, b := strings.IndexByte(keys[0], '{'), strings.IndexByte(keys[0], '}'); a >= 0 && b > a {
		if g, err := url.PathUnescape(keys[0][a+1 : b]); err == nil {
			e.slotMu.Lock()
			e.slotGroups = append(e.slotGroups, g)
			e.slotMu.Unlock()
		}
	}
	return stateSlot(v)
}

// stateSlot is the slot of an admitted send's state record, zero for any
// other record.
func stateSlot(v string) time.Time {
	rest, ok := strings.CutPrefix(v, "a")
	if !ok {
		return time.Time{}
	}
	f := strings.Split(rest, ":")
	if len(f) < 2 {
		return time.Time{}
	}
	ms, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// byRecipient keys receipts by their recipient.
func byRecipient(d fakes.Delivery) string { return d.To }

// checkKeysInTable fails the test on every key the run left, on every
// master of rdb, that no row of keyspace's key table (docs/architecture.md's
// "Redis keys") covers: a key Sluice writes that the table does not
// document. It runs at the env's cleanup, after the test's processes were
// stopped (cleanups run last registered first) and before Redis stops; a
// Redis the test left down cannot be scanned, which it logs.
func (e *env) checkKeysInTable(rdb redis.UniversalClient) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	var stray []string
	scanned := 0
	scan := func(ctx context.Context, node *redis.Client) error {
		it := node.Scan(ctx, 0, "*", 1000).Iterator()
		for it.Next(ctx) {
			_, ok := keyspace.Match(it.Val())
			for _, p := range e.foreign {
				ok = ok || strings.HasPrefix(it.Val(), p)
			}
			mu.Lock()
			scanned++
			if !ok {
				stray = append(stray, it.Val())
			}
			mu.Unlock()
		}
		return it.Err()
	}
	var err error
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, c)
	default:
		err = fmt.Errorf("a %T", rdb)
	}
	if err != nil {
		e.t.Logf("key table check: Redis could not be scanned (%v): not checked", err)
		return
	}
	slices.Sort(stray)
	for i, k := range stray {
		if i == 20 {
			e.t.Errorf("… and %d more keys in no row", len(stray)-i)
			break
		}
		e.t.Errorf("key %q is in no row of keyspace's key table (docs/architecture.md, \"Redis keys\")", k)
	}
	e.t.Logf("key table check: %d keys scanned, %d in no row", scanned, len(stray))
}

// noKeyWithoutTTL fails if a Sluice key other than Asynq's lives forever.
func (e *env) keysWithoutTTL() []string {
	var out []string
	ctx := context.Background()
	iter := e.rdb.Scan(ctx, 0, "sluice:*", 1000).Iterator()
	for iter.Next(ctx) {
		// -1: no TTL. Not -2: the key went between the scan and the read
		// (a holders' list emptied by its last holder's ZREM, beside two CPU
		// hogs, was once counted as a key without a TTL).
		if ttl := e.rdb.PTTL(ctx, iter.Val()).Val(); ttl == -1 {
			out = append(out, iter.Val())
		}
	}
	return out
}

func field(info, name string) string {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), name+":"); ok {
			return v
		}
	}
	return "?"
}

// activeTasks lists the ids of the tasks Asynq holds as active (running,
// or orphaned by a dead worker until its lease is recovered).
func (e *env) activeTasks() []string {
	e.t.Helper()
	var out []string
	for _, q := range e.knownQueues() {
		ts, err := e.insp.ListActiveTasks(q, asynq.PageSize(1000))
		if err != nil {
			e.t.Fatal(err)
		}
		for _, ti := range ts {
			out = append(out, ti.ID)
		}
	}
	return out
}

// knownQueues are the queues of the default layout that Asynq knows (a
// queue exists from its first task on).
func (e *env) knownQueues() []string {
	e.t.Helper()
	exist, err := e.insp.Queues()
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, q := range tasks.DefaultLayout.Queues() {
		if slices.Contains(exist, q) {
			out = append(out, q)
		}
	}
	return out
}

// queueInfo sums Asynq's counters over every queue of the default layout.
func (e *env) queueInfo() (*asynq.QueueInfo, error) {
	sum := &asynq.QueueInfo{}
	exist, err := e.insp.Queues()
	if err != nil {
		return nil, err
	}
	for _, q := range tasks.DefaultLayout.Queues() {
		if !slices.Contains(exist, q) {
			continue
		}
		qi, err := e.insp.GetQueueInfo(q)
		if err != nil {
			return nil, err
		}
		sum.Size, sum.Pending, sum.Active, sum.Scheduled = sum.Size+qi.Size, sum.Pending+qi.Pending, sum.Active+qi.Active, sum.Scheduled+qi.Scheduled
		sum.Retry, sum.Archived, sum.Completed = sum.Retry+qi.Retry, sum.Archived+qi.Archived, sum.Completed+qi.Completed
		sum.Aggregating += qi.Aggregating // waiting in a tenant's room (internal/fairq)
	}
	return sum, nil
}
