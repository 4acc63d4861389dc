package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/digest"
	"github.com/sluicehq/sluice/internal/lifecycle"
	"github.com/sluicehq/sluice/internal/orphans"
	"github.com/sluicehq/sluice/internal/redisguard"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/services"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/unsubscribe"
)

// Options are what a Worker takes besides Config and the shared services.
type Options struct {
	// Providers deliver each channel's notifications, in the order they
	// are tried (app opens those Config names). Senders is the
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
// queue, checks every quota that applies, and sends. It keeps the servers
// and the lifecycle; the send path is its stages (path.go).
type Worker struct {
	core          *core
	svc           *services.Set // Redis, limiter, key ring, logger, registry, rules
	intake        *intake       // the Asynq servers and their hooks
	path          *sendPath     // the stages every task runs through
	listener      net.Listener
	registry      *prometheus.Registry
	queues        *queueCollector // the queues' depths, for /metrics and /queue-depth
	onPlan        func(int64)
	noRedisChecks bool
	redisGuard    atomic.Pointer[redisguard.Guard] // Redis's settings, watched once running
}

// New builds a worker on svc (app opens it) from cfg, which its caller
// validated (app.NewWorker does, once: Config.Validate); it does not
// connect until Run, which closes svc when it returns.
func New(cfg Config, svc *services.Set, opts Options) (*Worker, error) {
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
	co, err := newCore(cfg, svc, opts.TracerProvider)
	if err != nil {
		return nil, err
	}
	path, err := newSendPath(co, list, opts.OnDecision, svc)
	if err != nil {
		return nil, err
	}
	in, err := newIntake(co, svc.Registry, path.rec.donesBefore)
	if err != nil {
		return nil, err
	}
	path.wait.skip = in.completer.Skip
	if co.cfg.OrphanAfter > 0 && co.cfg.HeldDeadAfter > 0 {
		path.wait.holder = orphans.NewHolder(co.rdb, co.log.With("component", "holder"))
	}
	w := &Worker{core: co, svc: svc, intake: in, path: path, listener: opts.Listener, registry: svc.Registry,
		onPlan: opts.OnPlanChange, noRedisChecks: opts.NoRedisChecks}
	w.queues = newQueueCollector(co.rdb, co.layout, co.log.With("component", "queue-metrics"))
	w.registry.MustRegister(w.queues)
	in.mux.Use(in.countMiddleware, co.traceMiddleware, path.throttleMiddleware)
	for _, ch := range Channels {
		typ, _ := ch.TaskType()
		in.mux.Handle(typ, sendHandler(ch))
	}
	return w, nil
}

// newCore opens what every stage shares.
func newCore(cfg Config, svc *services.Set, tp trace.TracerProvider) (*core, error) {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	co := &core{cfg: cfg, log: svc.Log, rdb: svc.Redis, limiter: svc.Limiter, plans: svc.Plans, keys: svc.Keys,
		tracer: tp.Tracer(TracerName), metrics: NewMetrics(svc.Registry), layout: cfg.Layout(), consent: svc.Consent,
		client: asynq.NewClientFromRedisClient(svc.Redis), delivery: delivery.NewStore(svc.Redis, svc.Limiter), stopping: make(chan struct{})}
	co.suppressCodes = cfg.SMSSuppressCodes // parsed as the settings were read
	return co, nil
}

// newSendPath builds the send path's stages, each with the others it hands
// a task to.
func newSendPath(co *core, list map[tasks.Channel][]sender.Named, onDecide func(tasks.Notification, throttle.Decision), svc *services.Set) (*sendPath, error) {
	rec := &records{core: co, released: newReleaser(svc.Queued, co.log.With("component", "queued")), dones: doneRecords{m: map[string]pendingDone{}}}
	prov := &providerSet{core: co}
	prov.providers = prov.newProviders(list)
	fb := &fallbacks{core: co, inspector: asynq.NewInspectorFromRedisClient(co.rdb)}
	wait := &waiter{core: co, waiters: make(chan struct{}, co.cfg.MaxWaiters), rec: rec}
	dig := &digester{core: co, digests: digest.New(co.rdb, co.limiter), templates: digest.NewTemplates(co.rdb), rec: rec}
	adm := &admission{core: co, planner: co.cfg.Planner(), onDecide: onDecide, prov: prov, dig: dig, wait: wait, rec: rec, fb: fb}
	adm.fromDomains = co.cfg.EmailFromDomains
	if co.cfg.UnsubscribeURL != "" {
		var err error
		if adm.unsubscribe, err = unsubscribe.NewSigner(co.cfg.SubjectSecret); err != nil {
			return nil, err
		}
	}
	disp := &dispatcher{core: co, adm: adm, wait: wait, prov: prov, rec: rec, fb: fb}
	return &sendPath{core: co, adm: adm, wait: wait, disp: disp, prov: prov, rec: rec, dig: dig, fb: fb}, nil
}

// Handler returns the worker's task handler (throttle middleware and mux):
// what the Asynq server runs for each task.
func (w *Worker) Handler() asynq.Handler { return w.intake.mux }

// sendHandler sends a notification of channel ch through the provider
// the send path picked (its context carries both).
func sendHandler(ch tasks.Channel) asynq.Handler {
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
		if err := w.core.rdb.Ping(ctx).Err(); err != nil {
			http.Error(rw, "not ready: redis unreachable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		st := w.redisGuard.Load().Status()
		st.Warnings = append(slices.Clone(st.Warnings), w.path.prov.providerWarnings()...) // providers down: degraded, still ready
		st.Write(rw)                                                                       // evictions, full memory (docs/operations.md, "Metrics and health")
	})
	return mux
}

// closeOwn closes what New opened: the send path's (the removals of what
// was sent are written first, before the Redis client goes; then the
// senders' pools), then the servers' client.
func (w *Worker) closeOwn(context.Context) error {
	w.path.close()
	w.intake.close()
	return nil
}

// migrateConsent moves the suppression lists of Sluice before consent
// into the consent store, once.
func (w *Worker) migrateConsent(ctx context.Context) {
	n, ran, err := w.core.consent.MigrateDeliveryOnce(ctx)
	switch {
	case err != nil && ctx.Err() == nil:
		w.core.log.Error("suppression lists not moved into the consent store; the next start tries again", "moved", n, "err", err)
	case ran:
		w.core.log.Info("suppression lists moved into the consent store", "entries", n)
	}
}

// sweeperPart puts back tasks Asynq holds as active that no worker runs
// (internal/orphans).
func (w *Worker) sweeperPart() lifecycle.Part {
	var sweeper *orphans.Sweeper
	return lifecycle.Func("orphan-sweep",
		func(ctx context.Context) error {
			var err error
			opts := orphans.Options{Queues: w.core.layout.Queues(), After: w.core.cfg.OrphanAfter, Gate: w.intake.gate,
				Logger: w.core.log.With("component", "orphans"), OnRequeued: func(string, string) { w.core.metrics.Orphans.Inc() }}
			if w.path.wait.holder != nil {
				opts.Held = &orphans.HeldOptions{DeadAfter: w.core.cfg.HeldDeadAfter, TakeOver: w.path.wait.takeOver}
			}
			sweeper, err = orphans.New(w.core.rdb, opts)
			if err != nil {
				return err
			}
			w.intake.sweeper.Store(sweeper)
			if err := sweeper.Start(context.WithoutCancel(ctx)); err != nil {
				w.core.log.Error("orphan sweep not started", "err", err)
			}
			return nil
		},
		func(context.Context) error { sweeper.Stop(); return nil })
}

// httpPart serves /metrics, /healthz and /readyz on Options.Listener or
// HTTP_ADDR (nil: HTTP_ADDR is off). Every connection has deadlines: a
// scraper or probe that stops reading, or leaves a keep-alive connection
// open, holds nothing.
func (w *Worker) httpPart() (lifecycle.Part, net.Listener, error) {
	ln := w.listener
	if ln == nil {
		if w.core.cfg.HTTPAddr == "" || w.core.cfg.HTTPAddr == "off" {
			return nil, nil, nil
		}
		var err error
		if ln, err = net.Listen("tcp", w.core.cfg.HTTPAddr); err != nil {
			return nil, nil, fmt.Errorf("listen %s (SLUICE_HTTP_ADDR): %w", w.core.cfg.HTTPAddr, err)
		}
	}
	w.core.log.Info("serving /metrics, /healthz, /readyz", "addr", ln.Addr().String())
	srv := &http.Server{Handler: w.HTTPHandler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: 30 * time.Second, MaxHeaderBytes: 16 << 10}
	return lifecycle.Serve("http", srv, ln, 5*time.Second), ln, nil
}

// closeAll closes what New opened and the services, for a Run that could
// not list its parts.
func (w *Worker) closeAll() {
	_ = w.closeOwn(context.Background())
	w.svc.Close()
}

// loadLimiter loads the limiter's functions before the first task, whose
// check would otherwise pay for it (a round trip that long can make its
// slot look past). Not loaded (Redis away, say), the first check loads it.
func (w *Worker) loadLimiter(ctx context.Context) error {
	if err := w.core.limiter.Load(ctx); err != nil {
		w.core.log.Warn("the limiter's functions were not loaded ahead of the first check; it will load them", "err", err)
	}
	return nil
}

// Run serves until ctx is cancelled, then shuts down gracefully: in-flight
// sends get Config.ShutdownTimeout to finish; unfinished tasks go back to
// the queue. It returns an error if the worker cannot start. Its parts
// start in the order of this list and stop in reverse.
func (w *Worker) Run(ctx context.Context) error {
	w.core.log.Info("starting worker", "queues", w.core.layout.Legacy()+".{priority,standard,bulk}.0-"+strconv.Itoa(w.core.layout.Shards-1)+" and "+w.core.layout.Legacy(),
		"concurrency", w.core.cfg.Concurrency, "priority_concurrency", w.core.cfg.PriorityConcurrency, "queue_recheck", w.core.cfg.QueueRecheck)
	for _, e := range w.core.currentPolicy().Entries() {
		w.core.log.Info("rule", "rule", e.String())
	}
	if w.core.cfg.RedisWaitReplicas > 0 && w.core.cfg.SendSlack < 2*w.core.cfg.RedisWaitTimeout {
		w.core.log.Warn("a send begins only once replicas acknowledge its admission, and one acknowledged later than half SEND_SLACK after its slot is given back and asked again (booked a window later when the window is full); set SEND_SLACK to at least twice REDIS_WAIT_TIMEOUT",
			"send_slack", w.core.cfg.SendSlack, "redis_wait_timeout", w.core.cfg.RedisWaitTimeout)
	}
	parts := w.svc.Parts(w.core.cfg.Base, services.RunOptions{What: "worker", PlanInterval: w.core.cfg.PlanCheckInterval, OnPlanChange: w.onPlan,
		NoRedisChecks: w.noRedisChecks, WaitReplicas: w.core.cfg.RedisWaitReplicas, OnGuard: w.watchRedis})
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
	if w.intake.gate != nil {
		parts = append(parts, lifecycle.Go("queue-gate", w.intake.gate.Run))
	}
	if w.core.cfg.OrphanAfter > 0 {
		parts = append(parts, w.sweeperPart())
	}
	if h := w.path.wait.holder; h != nil {
		// Stamps this worker while it holds sends for their slots; stopped
		// after the servers (the holds end as their sends do).
		parts = append(parts, lifecycle.Go("held-stamps", h.Run))
	}
	parts = append(parts,
		lifecycle.Func("limiter", w.loadLimiter, nil),
		// Done records no completion carried; stopped after the servers, it
		// writes those their last sends left.
		lifecycle.Go("done-records", w.path.rec.flushDone),
		// Every provider's state as Redis holds it, the same on every
		// worker (sluice_provider_up, /readyz), and its changes to the
		// sends waiting on one.
		lifecycle.Go("provider-states", w.path.prov.watch),
		// On a Cluster, the provider holds every check names are read
		// from memory, emptied at each hold's announcement (issue 52):
		// the master of the {hold} slot no longer carries every send.
		lifecycle.Go("hold-cache", w.core.limiter.WatchHolds),
		lifecycle.Func("asynq", w.intake.startServers, w.intake.stopServers),
		// The suppression lists of Sluice before consent move into the
		// consent store once (the limiter reads both meanwhile).
		lifecycle.Go("consent-migration", w.migrateConsent),
	)
	err = lifecycle.Run(ctx, w.core.log, parts...)
	if err == nil {
		w.core.log.Info("worker stopped")
	}
	return err
}

// Policy returns the rules in force.
func (w *Worker) Policy() plans.Policy { return w.core.plans.Policy() }

// Limiter returns the worker's limiter (for tools sharing its configuration).
func (w *Worker) Limiter() *throttle.Limiter { return w.core.limiter }

// Keys returns the payload key ring.
func (w *Worker) Keys() *tasks.Keyring { return w.core.keys }

// WakeTime is when a task whose slot d lies ahead runs again: its slot, or
// a little before a far one (the rest is waited in process).
func (w *Worker) WakeTime(d throttle.Decision) time.Time { return w.path.rec.wakeTime(d) }

type ctxKey struct{}

// notificationFrom returns the notification the throttle middleware decoded.
func notificationFrom(ctx context.Context) (tasks.Notification, bool) {
	n, ok := ctx.Value(ctxKey{}).(tasks.Notification)
	return n, ok
}
