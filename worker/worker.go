package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/digest"
	"github.com/sluicehq/sluice/internal/completer"
	"github.com/sluicehq/sluice/internal/fairq"
	"github.com/sluicehq/sluice/internal/lifecycle"
	"github.com/sluicehq/sluice/internal/orphans"
	"github.com/sluicehq/sluice/internal/pollgate"
	"github.com/sluicehq/sluice/internal/redisguard"
	"github.com/sluicehq/sluice/internal/services"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/unsubscribe"
)

// Options are what a Worker takes besides Config and the shared services.
type Options struct {
	// Providers deliver each channel's notifications, in the order they
	// are tried (internal/app opens those Config names). Senders is the
	// short form: one provider per channel, named DefaultProvider. One of
	// the two is required.
	Providers map[tasks.Channel][]sender.Named
	Senders   map[tasks.Channel]sender.Sender
	// Listener serves the HTTP endpoints instead of listening on Config.HTTPAddr.
	Listener net.Listener
	// OnDecision, if set, is called with every limiter decision (dev mode
	// shows them live). It must not block.
	OnDecision func(tasks.Notification, throttle.Decision)
	// OnPlanChange, if set, is called after the worker applied a change of
	// tenant plans (tests, tools). It must not block.
	OnPlanChange func(version int64)
	// TracerProvider makes the spans of every task run (see SpanTask);
	// default: the global provider, which records nothing unless the
	// process installed one (cmd/sluice does when OTEL_TRACES_EXPORTER asks).
	TracerProvider trace.TracerProvider
	// NoRedisChecks skips reading Redis's settings (eviction policy,
	// durability; docs/redis.md, "Redis requirements"): for dev mode's embedded
	// miniredis, which has none to read and never evicts.
	NoRedisChecks bool
}

// Worker is a throttled Asynq server: it takes notification tasks from the
// queue, checks every quota that applies, and sends.
type Worker struct {
	cfg           Config
	svc           *services.Set // Redis, limiter, key ring, logger, registry, rules
	log           *slog.Logger
	rdb           redis.UniversalClient
	limiter       *throttle.Limiter
	plans         *plans.Live
	planner       plans.Planner
	onPlan        func(int64)
	client        *asynq.Client
	inspector     *asynq.Inspector // runs an armed fallback at once
	layout        tasks.Layout
	servers       []*asynq.Server       // the priority lane's, then standard and bulk's
	asynqRDB      redis.UniversalClient // the servers' client, through the gate
	gate          *pollgate.Gate        // nil: QUEUE_RECHECK=0, every queue polled
	fair          *fairq.Dispatcher     // each lane's waiting rooms, dispatched fairly
	completer     *completer.Completer  // the servers' completions, in batches
	queues        *queueCollector       // the queues' depths, for /metrics and /queue-depth
	mux           *asynq.ServeMux
	metrics       *Metrics
	registry      *prometheus.Registry
	providers     map[tasks.Channel][]*provider // each channel's, in the order they are tried
	listener      net.Listener
	onDecide      func(tasks.Notification, throttle.Decision)
	released      *releaser // queued-work removals, in the background
	tracer        trace.Tracer
	keys          *tasks.Keyring
	delivery      *delivery.Store
	digests       *digest.Store
	templates     *digest.Templates
	suppressCodes map[int]bool // SMS_SUPPRESS_CODES; nil: no suppression list
	consent       *consent.Store
	unsubscribe   *unsubscribe.Signer // nil without SLUICE_UNSUBSCRIBE_URL
	waiters       chan struct{}       // tokens of tasks waiting in process for their slot
	stopping      chan struct{}       // closed when shutdown starts
	noRedisChecks bool
	busy          [2]atomic.Int64                  // tasks on their way to a send (idle): the priority lane's, the others
	seats         sync.Map                         // task id → throttle.Seat: the cohort of a batched dequeue
	redisGuard    atomic.Pointer[redisguard.Guard] // Redis's settings, watched once running
	fromDomains   config.FromDomains               // SLUICE_EMAIL_FROM_DOMAINS
}

// New builds a worker on svc (internal/app opens it); it does not connect
// until Run, which closes svc when it returns.
func New(cfg Config, svc *services.Set, opts Options) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	list := opts.Providers
	if len(list) == 0 {
		list = map[tasks.Channel][]sender.Named{}
		for ch, s := range opts.Senders {
			list[ch] = []sender.Named{{Name: DefaultProvider, Sender: s}}
		}
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("%w: worker: no senders", config.ErrConfig)
	}
	w := &Worker{cfg: cfg, svc: svc, log: svc.Log, rdb: svc.Redis, limiter: svc.Limiter, plans: svc.Plans, planner: cfg.Planner(),
		keys: svc.Keys, registry: svc.Registry, listener: opts.Listener, onDecide: opts.OnDecision, onPlan: opts.OnPlanChange,
		noRedisChecks: opts.NoRedisChecks}
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	w.tracer = tp.Tracer(TracerName)
	w.metrics = NewMetrics(w.registry)
	w.waiters = make(chan struct{}, cfg.MaxWaiters)
	w.providers = w.newProviders(list)
	w.released = newReleaser(svc.Queued, w.log.With("component", "queued"))
	w.stopping = make(chan struct{})
	w.delivery = delivery.NewStore(w.rdb, w.limiter)
	w.digests = digest.New(w.rdb, w.limiter)
	w.templates = digest.NewTemplates(w.rdb)
	w.consent = svc.Consent
	w.fromDomains, _ = config.ParseFromDomains(cfg.EmailFromDomains) // validated
	var err error
	if cfg.UnsubscribeURL != "" {
		if w.unsubscribe, err = unsubscribe.NewSigner(cfg.SubjectSecret); err != nil {
			return nil, err
		}
	}
	if w.suppressCodes, err = cfg.SuppressCodes(); err != nil {
		return nil, fmt.Errorf("%w: %sSMS_SUPPRESS_CODES %w", config.ErrConfig, config.EnvPrefix, err)
	}
	w.client = asynq.NewClientFromRedisClient(w.rdb)
	w.inspector = asynq.NewInspectorFromRedisClient(w.rdb)
	w.layout = cfg.Layout()
	// The Asynq servers' client: the fair dispatch first (each lane's
	// waiting rooms served fairly between tenants), then the queue gate
	// (idle queues answered without a round trip).
	fo := fairq.Options{Queues: w.layout.Queues(), Layout: w.layout, Batch: w.idle, OnTake: w.seatCohort, Target: max(16, cfg.DequeueBatch),
		Weights: func() map[string]int { return w.plans.Policy().Weights() },
		Recheck: cfg.PollInterval, Logger: w.log.With("component", "fair")}
	if cfg.QueueRecheck > 0 {
		w.gate = pollgate.New(w.rdb, w.layout.Queues(), pollgate.Options{Recheck: cfg.QueueRecheck,
			Logger:  w.log.With("component", "queue-gate"),
			OnWrite: func(keys []string) { w.fair.OnWrite(keys) }, OnForget: func() { w.fair.Forget() }})
		fo.Notified, fo.Confirm = w.gate.Active, w.gate.Confirm
	}
	w.fair = fairq.New(w.rdb, fo)
	w.completer = completer.New(w.rdb, cfg.ShutdownTimeout)
	if w.gate != nil {
		if w.asynqRDB, err = w.gate.Client(w.fair.Hook(), w.completer.Hook()); err != nil {
			return nil, fmt.Errorf("%w: %sQUEUE_RECHECK: %w (set it to 0)", config.ErrConfig, config.EnvPrefix, err)
		}
		registerGateMetrics(w.registry, w.gate)
	} else if w.asynqRDB, err = pollgate.Clone(w.rdb, w.fair.Hook(), w.completer.Hook()); err != nil {
		return nil, fmt.Errorf("worker: %w", err)
	}
	registerFairMetrics(w.registry, w.fair)
	registerCompleterMetrics(w.registry, w.completer)
	w.queues = newQueueCollector(w.rdb, w.layout, w.log.With("component", "queue-metrics"))
	w.registry.MustRegister(w.queues)
	w.servers = w.newServers()
	w.mux = asynq.NewServeMux()
	w.mux.Use(w.countMiddleware, w.traceMiddleware, w.throttleMiddleware)
	w.mux.Handle(tasks.TypeEmail, w.sendHandler(tasks.Email))
	w.mux.Handle(tasks.TypeSMS, w.sendHandler(tasks.SMS))
	w.mux.Handle(tasks.TypeWhatsApp, w.sendHandler(tasks.WhatsApp))
	return w, nil
}

// newServers builds the Asynq servers: one for the priority lane, with its
// own dequeuer and slots, so no standard or bulk task is ever ahead of a
// priority one; DEQUEUERS for the standard and bulk lanes and the legacy
// queue, each picking among the shards that hold work at random by weight
// (standard 4, bulk BULK_WEIGHT), so one tenant's shard never starves
// another's and bulk never starves standard. An Asynq server dequeues one
// task at a time (a round trip each): several take tasks side by side. They
// share the CONCURRENCY + MAX_WAITERS task slots; the providers' slots
// (CONCURRENCY each, failover.go) are the worker's, whichever server took
// the task.
func (w *Worker) newServers() []*asynq.Server {
	cfg := w.cfg
	base := asynq.Config{
		IsFailure:                isFailure,
		RetryDelayFunc:           w.retryDelay,
		ErrorHandler:             asynq.ErrorHandlerFunc(w.handleError),
		Logger:                   asynqLogger{w.log.With("component", "asynq")},
		LogLevel:                 asynqLevel(cfg.LogLevel),
		ShutdownTimeout:          cfg.ShutdownTimeout,
		DelayedTaskCheckInterval: cfg.DelayedCheckInterval,
		TaskCheckInterval:        cfg.PollInterval,
	}
	prio, std := base, base
	prio.Concurrency = cfg.PriorityConcurrency + cfg.MaxWaiters
	prio.Queues = map[string]int{}
	for _, q := range w.layout.LaneQueues(tasks.LanePriority) {
		prio.Queues[q] = 1
	}
	std.Queues = map[string]int{w.layout.Legacy(): standardWeight}
	for _, q := range w.layout.LaneQueues(tasks.LaneStandard) {
		std.Queues[q] = standardWeight
	}
	for _, q := range w.layout.LaneQueues(tasks.LaneBulk) {
		std.Queues[q] = cfg.BulkWeight
	}
	servers := []*asynq.Server{asynq.NewServerFromRedisClient(w.asynqRDB, prio)}
	for _, n := range shareSlots(cfg.Concurrency+cfg.MaxWaiters, cfg.Dequeuers) {
		std.Concurrency = n
		servers = append(servers, asynq.NewServerFromRedisClient(w.asynqRDB, std))
	}
	return servers
}

// countMiddleware counts the tasks in the handler, by lane class: what
// idle subtracts from the processors.
func (w *Worker) countMiddleware(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		q, _ := asynq.GetQueueName(ctx)
		m := &busyMark{n: &w.busy[w.laneClass(q)]}
		m.set(true)
		defer m.set(false)
		ctx = context.WithValue(ctx, busyKey{}, m)
		id, _ := asynq.GetTaskID(ctx)
		if s, ok := w.seats.LoadAndDelete(id); ok {
			h := &seatHolder{seat: s.(throttle.Seat)}
			ctx = context.WithValue(ctx, seatKey{}, h)
			defer h.seat.Leave() // a task that ends before its check frees the others
		}
		return next.ProcessTask(ctx, t)
	})
}

// idle is how many tasks of lane the worker could take now (the fair
// dispatch's Batch): its send slots (CONCURRENCY, PRIORITY_CONCURRENCY)
// less the tasks on their way to a send — being checked, or holding or
// waiting for a request slot; not those waiting in process for their slot,
// nor those whose request is over — and those already taken ahead, between
// 1 and DEQUEUE_BATCH. Taking more than can be sent soon would only age
// their admissions: a send that begins later than half the send slack after
// its slot gives it back and asks again.
func (w *Worker) idle(lane tasks.Lane) int {
	var n int
	if lane == tasks.LanePriority {
		n = w.cfg.PriorityConcurrency - int(w.busy[0].Load()) - w.fair.Ahead(lane)
	} else {
		n = w.cfg.Concurrency - int(w.busy[1].Load()) - w.fair.Ahead(tasks.LaneStandard) - w.fair.Ahead(tasks.LaneBulk)
	}
	return max(1, min(w.cfg.DequeueBatch, n))
}

// busyMark is whether a task counts as on its way to a send (idle).
type busyMark struct {
	n    *atomic.Int64
	held bool // only the task's own goroutine touches it
}

type busyKey struct{}

func (m *busyMark) set(busy bool) {
	if m.held != busy {
		m.held = busy
		if busy {
			m.n.Add(1)
		} else {
			m.n.Add(-1)
		}
	}
}

// waiting marks the task off the way to a send while it waits in process
// for its slot; the returned func marks it on again.
func (w *Worker) waiting(ctx context.Context) func() {
	m, ok := ctx.Value(busyKey{}).(*busyMark)
	if !ok {
		return func() {}
	}
	m.set(false)
	return func() { m.set(true) }
}

// sent marks the task off the way to a send: its request is over.
func (w *Worker) sent(ctx context.Context) { w.onTheWay(ctx, false) }

// onTheWay marks the task on (or off) its way to a send.
func (w *Worker) onTheWay(ctx context.Context, busy bool) {
	if m, ok := ctx.Value(busyKey{}).(*busyMark); ok {
		m.set(busy)
	}
}

// seatCohort seats the tasks one dequeue took together in a limiter
// cohort: their checks go to Redis as one call (fairq's OnTake).
func (w *Worker) seatCohort(_ tasks.Lane, ids []string) {
	c := w.limiter.NewCohort(len(ids), w.cfg.CohortWait)
	for i, id := range ids {
		w.seats.Store(id, c.Seat(i))
	}
}

// seatHolder is a task's cohort seat, used by its first check only.
type seatHolder struct {
	seat throttle.Seat
	used bool
}

type seatKey struct{}

// takeSeat returns the task's cohort seat the first time it is asked.
func takeSeat(ctx context.Context) throttle.Seat {
	h, ok := ctx.Value(seatKey{}).(*seatHolder)
	if !ok || h.used {
		return throttle.Seat{}
	}
	h.used = true
	return h.seat
}

// laneClass is the index of busy for a task of queue q.
func (w *Worker) laneClass(q string) int {
	if lane, _, ok := w.layout.Parse(q); ok && lane == tasks.LanePriority {
		return 0
	}
	return 1
}

// shareSlots splits total task slots between k dequeuers (at most total of
// them, at least one), as evenly as whole slots go: they add up to total.
func shareSlots(total, k int) []int {
	k = max(min(k, total), 1)
	out := make([]int, k)
	for i := range out {
		out[i] = total / k
		if i < total%k {
			out[i]++
		}
	}
	return out
}

// standardWeight is each standard shard's weight in its dequeuer (bulk's is BULK_WEIGHT).
const standardWeight = 4

// Keys returns the payload key ring.
func (w *Worker) Keys() *tasks.Keyring { return w.keys }

// Limiter returns the worker's limiter (for tools sharing its configuration).
func (w *Worker) Limiter() *throttle.Limiter { return w.limiter }

// Policy returns the rules in force.
func (w *Worker) Policy() plans.Policy { return w.plans.Policy() }

// currentPolicy is the rules in force: SLUICE_RULES with the tenant plans
// of the latest version loaded. A check reads it once.
func (w *Worker) currentPolicy() plans.Policy { return w.plans.Policy() }

// currentPlans is the policy in force and its version (0 before the plans
// are followed, and while no plan was ever set).
func (w *Worker) currentPlans() (plans.Policy, int64) {
	snap := w.plans.Current()
	return snap.Policy, snap.Version
}

// categoryLabel bounds the category metric label to the categories the
// rules name, the default one, and "other".
func (w *Worker) categoryLabel(n tasks.Notification) string {
	c := n.CategoryOrDefault()
	if c == tasks.DefaultCategory || w.currentPolicy().Names(c) {
		return c
	}
	return "other"
}

// Run serves until ctx is cancelled, then shuts down gracefully: in-flight
// sends get Config.ShutdownTimeout to finish; unfinished tasks go back to
// the queue. It returns an error if the worker cannot start. Its parts
// start in the order of this list and stop in reverse.
func (w *Worker) Run(ctx context.Context) error {
	w.log.Info("starting worker", "queues", w.layout.Legacy()+".{priority,standard,bulk}.0-"+strconv.Itoa(w.layout.Shards-1)+" and "+w.layout.Legacy(),
		"concurrency", w.cfg.Concurrency, "priority_concurrency", w.cfg.PriorityConcurrency, "queue_recheck", w.cfg.QueueRecheck)
	for _, e := range w.currentPolicy().Entries() {
		w.log.Info("rule", "rule", e.String())
	}
	if w.cfg.RedisWaitReplicas > 0 && w.cfg.SendSlack < 2*w.cfg.RedisWaitTimeout {
		w.log.Warn("a send begins only once replicas acknowledge its admission, and one acknowledged later than half SEND_SLACK after its slot is given back and asked again (booked a window later when the window is full); set SEND_SLACK to at least twice REDIS_WAIT_TIMEOUT",
			"send_slack", w.cfg.SendSlack, "redis_wait_timeout", w.cfg.RedisWaitTimeout)
	}
	parts := w.svc.Parts(w.cfg.Base, services.RunOptions{What: "worker", PlanInterval: w.cfg.PlanCheckInterval, OnPlanChange: w.onPlan,
		NoRedisChecks: w.noRedisChecks, WaitReplicas: w.cfg.RedisWaitReplicas, OnGuard: w.watchRedis})
	parts = append(parts,
		lifecycle.Func("worker", nil, w.closeOwn), // the senders' pools, the gate's client, the removals of what was sent
	)
	http, ln, err := w.httpPart()
	if err != nil {
		w.closeAll()
		return err
	}
	if http != nil {
		defer ln.Close() // if a part before the server failed to start
		parts = append(parts, http)
	}
	if w.gate != nil {
		parts = append(parts, lifecycle.Go("queue-gate", w.gate.Run))
	}
	if w.cfg.OrphanAfter > 0 {
		parts = append(parts, w.sweeperPart())
	}
	parts = append(parts,
		lifecycle.Func("limiter", w.loadLimiter, nil),
		lifecycle.Func("asynq", w.startServers, w.stopServers),
		// The suppression lists of Sluice before consent move into the
		// consent store once (the limiter reads both meanwhile).
		lifecycle.Go("consent-migration", w.migrateConsent),
	)
	err = lifecycle.Run(ctx, w.log, parts...)
	if err == nil {
		w.log.Info("worker stopped")
	}
	return err
}

// loadLimiter loads the limiter's functions before the first task, whose
// check would otherwise pay for it (a round trip that long can make its
// slot look past). Not loaded (Redis away, say), the first check loads it.
func (w *Worker) loadLimiter(ctx context.Context) error {
	if err := w.limiter.Load(ctx); err != nil {
		w.log.Warn("the limiter's functions were not loaded ahead of the first check; it will load them", "err", err)
	}
	return nil
}

// closeAll closes what New opened and the services, for a Run that could
// not list its parts.
func (w *Worker) closeAll() {
	_ = w.closeOwn(context.Background())
	w.svc.Close()
}

// httpPart serves /metrics, /healthz and /readyz on Options.Listener or
// HTTP_ADDR (nil: HTTP_ADDR is off). Every connection has deadlines: a
// scraper or probe that stops reading, or leaves a keep-alive connection
// open, holds nothing.
func (w *Worker) httpPart() (lifecycle.Part, net.Listener, error) {
	ln := w.listener
	if ln == nil {
		if w.cfg.HTTPAddr == "" || w.cfg.HTTPAddr == "off" {
			return nil, nil, nil
		}
		var err error
		if ln, err = net.Listen("tcp", w.cfg.HTTPAddr); err != nil {
			return nil, nil, fmt.Errorf("listen %s (SLUICE_HTTP_ADDR): %w", w.cfg.HTTPAddr, err)
		}
	}
	w.log.Info("serving /metrics, /healthz, /readyz", "addr", ln.Addr().String())
	srv := &http.Server{Handler: w.HTTPHandler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10}
	return lifecycle.Serve("http", srv, ln, 5*time.Second), ln, nil
}

// sweeperPart puts back tasks Asynq holds as active that no worker runs
// (internal/orphans).
func (w *Worker) sweeperPart() lifecycle.Part {
	var sweeper *orphans.Sweeper
	return lifecycle.Func("orphan-sweep",
		func(ctx context.Context) error {
			var err error
			sweeper, err = orphans.New(w.rdb, orphans.Options{Queues: w.layout.Queues(), After: w.cfg.OrphanAfter, Gate: w.gate,
				Logger: w.log.With("component", "orphans"), OnRequeued: func(string, string) { w.metrics.Orphans.Inc() }})
			if err != nil {
				return err
			}
			if err := sweeper.Start(context.WithoutCancel(ctx)); err != nil {
				w.log.Error("orphan sweep not started", "err", err)
			}
			return nil
		},
		func(context.Context) error { sweeper.Stop(); return nil })
}

// startServers starts the Asynq servers; if one fails, those started stop.
func (w *Worker) startServers(context.Context) error {
	for i, srv := range w.servers {
		if err := srv.Start(w.mux); err != nil {
			for _, started := range w.servers[:i] {
				started.Shutdown()
			}
			return err
		}
	}
	return nil
}

// stopServers stops taking tasks and gives the sends in flight
// ShutdownTimeout to finish; unfinished tasks go back to the queue.
func (w *Worker) stopServers(context.Context) error {
	w.log.Info("shutting down: finishing in-flight sends", "timeout", w.cfg.ShutdownTimeout)
	close(w.stopping)
	var wg sync.WaitGroup
	for _, srv := range w.servers {
		wg.Go(srv.Shutdown)
	}
	wg.Wait()
	gctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if n, err := w.fair.GiveBack(gctx); err != nil {
		w.log.Warn("tasks taken ahead not put back; they run elsewhere once their lease expires", "err", err)
	} else if n > 0 {
		w.log.Info("put back tasks taken ahead and not started", "tasks", n)
	}
	return nil
}

// migrateConsent moves the suppression lists of Sluice before consent
// into the consent store, once.
func (w *Worker) migrateConsent(ctx context.Context) {
	n, ran, err := w.consent.MigrateDeliveryOnce(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		w.log.Error("suppression lists not moved into the consent store; the next start tries again", "moved", n, "err", err)
	case ran:
		w.log.Info("suppression lists moved into the consent store", "entries", n)
	}
}

// closeOwn closes what New opened: the removals of what was sent are
// written first (before the Redis client goes), then the senders' pools
// and the gate's client.
func (w *Worker) closeOwn(context.Context) error {
	w.released.wait()
	for _, ps := range w.providers {
		for _, p := range ps {
			if c, ok := p.send.(io.Closer); ok {
				_ = c.Close()
			}
		}
	}
	if w.asynqRDB != nil && w.asynqRDB != w.rdb {
		_ = w.asynqRDB.Close()
	}
	return nil
}

// HTTPHandler serves /metrics, /healthz (the process is up), /readyz
// (Redis answers, and has not evicted keys lately nor filled its memory:
// redisguard.Status) and /queue-depth (Depth, JSON: what KEDA scales on).
func (w *Worker) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(w.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(rw http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(rw, "ok")
	})
	mux.HandleFunc("GET /queue-depth", func(rw http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		d, err := w.queues.depth(ctx)
		if err != nil {
			http.Error(rw, "redis unreachable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(d)
	})
	mux.HandleFunc("/readyz", func(rw http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := w.rdb.Ping(ctx).Err(); err != nil {
			http.Error(rw, "not ready: redis unreachable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		st := w.redisGuard.Load().Status()
		st.Warnings = append(slices.Clone(st.Warnings), w.providerWarnings()...) // providers down: degraded, still ready
		st.Write(rw)                                                             // evictions, full memory (docs/operations.md, "Metrics and health")
	})
	return mux
}

func (w *Worker) sendHandler(ch tasks.Channel) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		n, ok := notificationFrom(ctx)
		if !ok {
			return errors.New("worker: handler called without the throttle middleware")
		}
		p, ok := ctx.Value(providerKey{}).(*provider)
		if !ok || p.channel != ch {
			return &sender.SendError{Err: fmt.Errorf("%w %s", sender.ErrNoSender, ch), Permanent: true, NotSent: true}
		}
		return p.send.Send(ctx, n)
	})
}

func (w *Worker) handleError(ctx context.Context, t *asynq.Task, err error) {
	if !isFailure(err) {
		return // throttled or unavailable: logged where it happened
	}
	id, _ := asynq.GetTaskID(ctx)
	w.log.Debug("task attempt failed", "task_id", id, "type", t.Type(), "err", err)
}

type asynqLogger struct{ l *slog.Logger }

func (a asynqLogger) Debug(args ...any) { a.l.Debug(fmt.Sprint(args...)) }
func (a asynqLogger) Info(args ...any)  { a.l.Info(fmt.Sprint(args...)) }
func (a asynqLogger) Warn(args ...any)  { a.l.Warn(fmt.Sprint(args...)) }
func (a asynqLogger) Error(args ...any) { a.l.Error(fmt.Sprint(args...)) }
func (a asynqLogger) Fatal(args ...any) { a.l.Error(fmt.Sprint(args...)); os.Exit(1) }

func asynqLevel(s string) asynq.LogLevel {
	switch strings.ToLower(s) {
	case "debug":
		return asynq.DebugLevel
	case "warn":
		return asynq.WarnLevel
	case "error":
		return asynq.ErrorLevel
	}
	// Asynq's info level logs every retry ("Retry exhausted", ...); keep it at warn.
	return asynq.WarnLevel
}

// Handler returns the worker's task handler (throttle middleware and mux):
// what the Asynq server runs for each task.
func (w *Worker) Handler() asynq.Handler { return w.mux }
