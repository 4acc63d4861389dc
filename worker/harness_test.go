package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/scripts"
	"github.com/sluicehq/sluice/sender/smtp"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/worker"
)

// testKeys seal the payloads the tests enqueue.
var testKeys = tasks.NewKeySpec("test")

type bundle struct {
	redis  *redistest.Server
	rdb    *redis.Client
	sms    *fakes.SMSAPI
	smtp   *fakes.SMTPServer
	client *asynq.Client
	insp   *asynq.Inspector
	cfg    worker.Config
}

// setup starts a private redis-server, a fake SMS API and a fake SMTP server,
// and a worker config pointing at them.
func setup(t *testing.T, rules string) *bundle {
	t.Helper()
	srv, rdb := redistest.New(t)
	b := &bundle{redis: srv, rdb: rdb, sms: fakes.NewSMSAPI(t), smtp: fakes.NewSMTPServer(t)}
	cfg, err := worker.ParseConfig(map[string]string{
		"SLUICE_REDIS_URL":         srv.URL(),
		"SLUICE_RULES":             rules,
		"SLUICE_SUBJECT_SECRET":    "test-secret-0123456789",
		"SLUICE_PAYLOAD_KEYS":      testKeys,
		"SLUICE_HTTP_ADDR":         "off",
		"SLUICE_EMAIL_SENDER":      "smtp",
		"SLUICE_SMTP_HOST":         b.smtp.Host,
		"SLUICE_SMTP_PORT":         strconv.Itoa(b.smtp.Port),
		"SLUICE_SMTP_TLS":          "none",
		"SLUICE_SMS_SENDER":        "http",
		"SLUICE_SMS_BASE_URL":      b.sms.URL,
		"SLUICE_SMS_ACCOUNT_SID":   b.sms.AccountSID,
		"SLUICE_SMS_AUTH_TOKEN":    b.sms.AuthToken,
		"SLUICE_SMS_FROM":          "+15005550006",
		"SLUICE_SHUTDOWN_TIMEOUT":  "5s",
		"SLUICE_RETRY_BASE":        "1s",
		"SLUICE_UNAVAILABLE_RETRY": "500ms",
		"SLUICE_POLL_INTERVAL":     "100ms",
	})
	if err != nil {
		t.Fatal(err)
	}
	b.cfg = cfg
	b.client = asynq.NewClientFromRedisClient(rdb)
	b.insp = asynq.NewInspectorFromRedisClient(rdb)
	return b
}

// withEnv returns cfg with SLUICE_ variables set (KEY, VALUE, …) in its
// environment, where the senders read their settings, on a copy of it.
func withEnv(cfg worker.Config, kv ...string) worker.Config {
	env := maps.Clone(cfg.Environ)
	for i := 0; i+1 < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	cfg.Environ = env
	return cfg
}

// smtpSettings are the SMTP provider's settings of cfg.
func smtpSettings(t *testing.T, cfg worker.Config) *smtp.Settings {
	t.Helper()
	st, err := smtp.Provider.NewSettings(cfg.Environ)
	if err != nil {
		t.Fatal(err)
	}
	return st.(*smtp.Settings)
}

func (b *bundle) keys(t *testing.T) *tasks.Keyring {
	k, err := tasks.ParseKeyring(b.cfg.PayloadKeys)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

type running struct {
	w   *worker.Worker
	reg *prometheus.Registry
}

// start runs a worker with its own Redis client until the test ends.
func (b *bundle) start(t *testing.T, cfg worker.Config) *running {
	t.Helper()
	return b.startOpts(t, cfg, app.WorkerOptions{})
}

// startWith runs a worker with extra options and returns its metrics.
func (b *bundle) startWith(t *testing.T, cfg worker.Config, opts app.WorkerOptions) *prometheus.Registry {
	t.Helper()
	return b.startOpts(t, cfg, opts).reg
}

func (b *bundle) startOpts(t *testing.T, cfg worker.Config, opts app.WorkerOptions) *running {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts.Registry = reg
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	w, err := app.NewWorker(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	sluicetest.Background(t, "worker.Run", w.Run)
	return &running{w: w, reg: reg}
}

// testLogger is a worker's log, shown (its last 150 lines) only if the test
// fails, after the failure's reason.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(sluicetest.FailureLog(t, 150), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// metric sums every series of a counter family.
func metric(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			}
			if h := m.GetHistogram(); h != nil {
				sum += float64(h.GetSampleCount())
			}
		}
	}
	return sum
}

func (b *bundle) enqueue(t *testing.T, n tasks.Notification, opts ...asynq.Option) {
	t.Helper()
	if _, err := tasks.Enqueue(context.Background(), b.client, b.keys(t), n, opts...); err != nil {
		t.Fatalf("enqueue %s: %v", n.ID, err)
	}
}

// queueStats returns Asynq's counters summed over every queue the worker
// serves (lanes, shards and the legacy queue).
func (b *bundle) queueStats(t *testing.T) *asynq.QueueInfo {
	t.Helper()
	return queueStats(t, b.insp, b.cfg.Layout())
}

func queueStats(t *testing.T, insp *asynq.Inspector, l tasks.Layout) *asynq.QueueInfo {
	t.Helper()
	sum := &asynq.QueueInfo{}
	exist, err := insp.Queues()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range l.Queues() {
		if !slices.Contains(exist, q) {
			continue
		}
		qi, err := insp.GetQueueInfo(q)
		if err != nil {
			t.Fatal(err)
		}
		sum.Size += qi.Size
		sum.Pending += qi.Pending
		sum.Aggregating += qi.Aggregating // waiting in a tenant's room (internal/fairq)
		sum.Active += qi.Active
		sum.Scheduled += qi.Scheduled
		sum.Retry += qi.Retry
		sum.Archived += qi.Archived
		sum.Completed += qi.Completed
		sum.Processed += qi.Processed
		sum.Failed += qi.Failed
	}
	return sum
}

// dueWithin counts the scheduled and retrying tasks of l's queues that
// Asynq will run within d: a task put back for a moment (a late wake-up,
// a cap) is not settled; one booked for its slot a minute ahead is.
func dueWithin(t *testing.T, insp *asynq.Inspector, l tasks.Layout, d time.Duration) int {
	t.Helper()
	exist, err := insp.Queues()
	if err != nil {
		t.Fatal(err)
	}
	n, by := 0, time.Now().Add(d)
	for _, q := range l.Queues() {
		if !slices.Contains(exist, q) {
			continue
		}
		for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){insp.ListScheduledTasks, insp.ListRetryTasks} {
			ts, err := list(q, asynq.PageSize(1000))
			if err != nil {
				t.Fatal(err)
			}
			for _, ti := range ts {
				if ti.NextProcessAt.Before(by) {
					n++
				}
			}
		}
	}
	return n
}

// waitTask polls Asynq's view of a task until cond holds (Asynq offers no
// notification of state changes).
func (b *bundle) waitTask(t *testing.T, id string, timeout time.Duration, cond func(*asynq.TaskInfo) bool) *asynq.TaskInfo {
	t.Helper()
	type found struct {
		Task *asynq.TaskInfo
		Err  error
	}
	// Every 50 ms: a lookup may read every queue of the layout.
	return sluicetest.EventuallyValueEvery(t, timeout, 50*time.Millisecond, "task "+id+" to reach the condition", func() (found, bool) {
		ti, err := b.cfg.Layout().FindTask(b.insp, "", nil, id)
		return found{ti, err}, err == nil && cond(ti)
	}).Task
}

// mustKeys is the key ring of testKeys.
func mustKeys(t testing.TB) *tasks.Keyring {
	k, err := tasks.ParseKeyring(testKeys)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// dispatch moves every notification waiting in queue's rooms into its
// pending list, as a worker's fair dispatch does (tests that then handle
// the pending list themselves).
func dispatch(t *testing.T, rdb redis.UniversalClient, queue string) {
	t.Helper()
	r := tasks.RoomOf(queue)
	if err := scripts.FairRefill.Run(context.Background(), rdb, []string{r.Pending, r.Groups, r.Fair, r.Clock},
		1<<30, 1<<30, r.TaskPrefix, r.GroupPrefix, time.Now().UnixNano()).Err(); err != nil {
		t.Fatal(err)
	}
}

// serving waits until the worker's Asynq servers run (each writes its
// first heartbeat as it starts): a test that times a send from its
// enqueue starts the clock after the worker's start-up, which a loaded
// machine stretches past a second.
func (b *bundle) serving(t *testing.T) {
	t.Helper()
	// The priority lane's, and the standard and bulk lanes' dequeuers (no
	// more than they have task slots).
	want := 1 + min(b.cfg.Dequeuers, b.cfg.Concurrency+b.cfg.MaxWaiters)
	sluicetest.Eventually(t, 30*time.Second, fmt.Sprintf("the worker's %d Asynq servers to start", want), func() bool {
		ss, err := b.insp.Servers()
		return err == nil && len(ss) == want
	})
}

// deliveredOnce fails t unless each of ids reached the provider exactly
// once among deliveries (duplicates counted).
func deliveredOnce(t testing.TB, deliveries []fakes.Delivery, ids []string) {
	t.Helper()
	seen := map[string]int{}
	for _, d := range deliveries {
		seen[d.ID]++
	}
	for _, id := range ids {
		if seen[id] != 1 {
			t.Fatalf("%s reached the provider %d times, want once (%d deliveries)", id, seen[id], len(deliveries))
		}
	}
}
