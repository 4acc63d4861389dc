package worker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/internal/pollgate"
	"github.com/sluicehq/sluice/internal/redisguard"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// Options are what a Worker takes besides Config. All optional.
type Options struct {
	// Logger; default: built from Config.LogLevel and LogFormat on stderr.
	Logger *slog.Logger
	// Redis replaces the client built from Config.RedisURL (dev mode, tests).
	// The caller closes it.
	Redis redis.UniversalClient
	// Senders replaces the senders built from Config, by channel.
	Senders map[tasks.Channel]Sender
	// Registry for the metrics; default a new registry with Go and process collectors.
	Registry *prometheus.Registry
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
	// durability; README, "Redis requirements"): for dev mode's embedded
	// miniredis, which has none to read and never evicts.
	NoRedisChecks bool
}

// Worker is a throttled Asynq server: it takes notification tasks from the
// queue, checks every quota that applies, and sends.
type Worker struct {
	cfg           Config
	log           *slog.Logger
	rdb           redis.UniversalClient
	ownRedis      bool
	limiter       *throttle.Limiter
	defaults      plans.Policy                  // SLUICE_RULES
	watcher       atomic.Pointer[plans.Watcher] // tenant plans in Redis, once running
	onPlan        func(int64)
	defaultZone   *time.Location
	client        *asynq.Client
	layout        tasks.Layout
	servers       []*asynq.Server       // the priority lane's, then standard and bulk's
	asynqRDB      redis.UniversalClient // the servers' client, through the gate
	gate          *pollgate.Gate        // nil: QUEUE_RECHECK=0, every queue polled
	mux           *asynq.ServeMux
	metrics       *Metrics
	registry      *prometheus.Registry
	senders       map[tasks.Channel]Sender
	listener      net.Listener
	onDecide      func(tasks.Notification, throttle.Decision)
	tracer        trace.Tracer
	keys          *tasks.Keyring
	delivery      *delivery.Store
	suppressCodes map[int]bool  // SMS_SUPPRESS_CODES; nil: no suppression list
	waiters       chan struct{} // tokens of tasks waiting in process for their slot
	stopping      chan struct{} // closed when shutdown starts
	noRedisChecks bool
	redisGuard    atomic.Pointer[redisguard.Guard] // Redis's settings, watched once running
}

// New builds a worker; it does not connect until Run.
func New(cfg Config, opts Options) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	policy, err := plans.Parse(cfg.Rules)
	if err != nil {
		return nil, fmt.Errorf("%w: %sRULES: %w", ErrConfig, EnvPrefix, err)
	}
	zones, err := plans.Zones(cfg.DefaultTZ, "", nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %sDEFAULT_TZ: %w", ErrConfig, EnvPrefix, err)
	}
	w := &Worker{cfg: cfg, defaultZone: zones[0], log: opts.Logger, rdb: opts.Redis, registry: opts.Registry, listener: opts.Listener, onDecide: opts.OnDecision, noRedisChecks: opts.NoRedisChecks}
	if w.log == nil {
		w.log = NewLogger(os.Stderr, cfg)
	}
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	w.tracer = tp.Tracer(TracerName)
	if w.rdb == nil {
		if w.rdb, err = NewRedisClient(cfg); err != nil {
			return nil, err
		}
		w.ownRedis = true
	}
	if w.registry == nil {
		w.registry = prometheus.NewRegistry()
		w.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	w.metrics = NewMetrics(w.registry)
	if w.keys, err = tasks.ParseKeyring(cfg.PayloadKeys); err != nil {
		return nil, fmt.Errorf("%w: %sPAYLOAD_KEYS: %w", ErrConfig, EnvPrefix, err)
	}
	w.defaults, w.onPlan = policy, opts.OnPlanChange
	w.waiters = make(chan struct{}, cfg.MaxWaiters)
	w.stopping = make(chan struct{})
	if w.limiter, err = throttle.New(w.rdb, throttle.Options{Secret: []byte(cfg.SubjectSecret), CompactMembers: cfg.CompactMembers,
		WaitReplicas: cfg.RedisWaitReplicas, WaitTimeout: cfg.RedisWaitTimeout}); err != nil {
		return nil, err
	}
	w.delivery = delivery.NewStore(w.rdb, w.limiter)
	if w.suppressCodes, err = cfg.SuppressCodes(); err != nil {
		return nil, fmt.Errorf("%w: %sSMS_SUPPRESS_CODES %w", ErrConfig, EnvPrefix, err)
	}
	w.senders = opts.Senders
	if w.senders == nil {
		if w.senders, err = buildSenders(cfg, w.log); err != nil {
			return nil, err
		}
	}
	w.client = asynq.NewClientFromRedisClient(w.rdb)
	w.layout = cfg.Layout()
	w.asynqRDB = w.rdb
	if cfg.QueueRecheck > 0 {
		w.gate = pollgate.New(w.rdb, w.layout.Queues(), pollgate.Options{Recheck: cfg.QueueRecheck, Prefixes: []string{w.layout.KeyPrefix()},
			Logger: w.log.With("component", "queue-gate")})
		if w.asynqRDB, err = w.gate.Client(); err != nil {
			return nil, fmt.Errorf("%w: %sQUEUE_RECHECK: %w (set it to 0)", ErrConfig, EnvPrefix, err)
		}
		registerGateMetrics(w.registry, w.gate)
	}
	w.registry.MustRegister(newQueueCollector(w.rdb, w.layout, w.log.With("component", "queue-metrics")))
	w.servers = w.newServers()
	w.mux = asynq.NewServeMux()
	w.mux.Use(w.traceMiddleware, w.throttleMiddleware)
	w.mux.Handle(tasks.TypeEmail, w.sendHandler(tasks.Email))
	w.mux.Handle(tasks.TypeSMS, w.sendHandler(tasks.SMS))
	return w, nil
}

// newServers builds the Asynq servers: one for the priority lane, with its
// own dequeuer and slots, so no standard or bulk task is ever ahead of a
// priority one; one for the standard and bulk lanes and the legacy queue,
// picking among the shards that hold work at random by weight (standard 4,
// bulk BULK_WEIGHT), so one tenant's shard never starves another's and bulk
// never starves standard.
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
	std.Concurrency = cfg.Concurrency + cfg.MaxWaiters
	std.Queues = map[string]int{w.layout.Legacy(): standardWeight}
	for _, q := range w.layout.LaneQueues(tasks.LaneStandard) {
		std.Queues[q] = standardWeight
	}
	for _, q := range w.layout.LaneQueues(tasks.LaneBulk) {
		std.Queues[q] = cfg.BulkWeight
	}
	return []*asynq.Server{asynq.NewServerFromRedisClient(w.asynqRDB, prio), asynq.NewServerFromRedisClient(w.asynqRDB, std)}
}

// standardWeight is each standard shard's weight in its dequeuer (bulk's is BULK_WEIGHT).
const standardWeight = 4

// Keys returns the payload key ring.
func (w *Worker) Keys() *tasks.Keyring { return w.keys }

// Limiter returns the worker's limiter (for tools sharing its configuration).
func (w *Worker) Limiter() *throttle.Limiter { return w.limiter }

// Policy returns the rules in force.
func (w *Worker) Policy() plans.Policy { return w.currentPolicy() }

// currentPolicy is the rules in force: SLUICE_RULES with the tenant plans
// of the latest version the watcher loaded. A check reads it once.
func (w *Worker) currentPolicy() plans.Policy {
	p, _ := w.currentPlans()
	return p
}

// currentPlans is the policy in force and its version (0 before the
// watcher starts, and while no plan was ever set).
func (w *Worker) currentPlans() (plans.Policy, int64) {
	if pw := w.watcher.Load(); pw != nil {
		snap := pw.Current()
		return snap.Policy, snap.Version
	}
	return w.defaults, 0
}

// watchPlans starts following the tenant plans in Redis.
func (w *Worker) watchPlans(ctx context.Context) error {
	store := plans.NewStore(w.rdb, w.defaults)
	pw, err := store.Watch(ctx, w.cfg.PlanCheckInterval, w.log, func(old, cur plans.Snapshot, changes []plans.Change) {
		for _, c := range changes {
			w.log.Info("tenant plan changed; applied", "tenant", c.Tenant, "action", c.Action, "version", c.Version, "by", c.By, "at", c.At, "rules", c.Rules)
		}
		w.log.Info("tenant plans in force", "version", cur.Version, "previous", old.Version, "tenants_with_plans", len(cur.Plans))
		if w.onPlan != nil {
			w.onPlan(cur.Version)
		}
	})
	if err != nil {
		return fmt.Errorf("start worker: tenant plans: %w", err)
	}
	w.watcher.Store(pw)
	snap := pw.Current()
	w.log.Info("tenant plans in force", "version", snap.Version, "tenants_with_plans", len(snap.Plans))
	return nil
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
// the queue. It returns an error if the worker cannot start.
func (w *Worker) Run(ctx context.Context) error {
	w.log.Info("starting worker", "queues", w.layout.Legacy()+".{priority,standard,bulk}.0-"+strconv.Itoa(w.layout.Shards-1)+" and "+w.layout.Legacy(),
		"concurrency", w.cfg.Concurrency, "priority_concurrency", w.cfg.PriorityConcurrency, "queue_recheck", w.cfg.QueueRecheck)
	// Fail at start, clearly, on a Redis that cannot be used (wrong
	// password, nothing listening); once running, outages are ridden out.
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := w.rdb.Ping(pctx).Err()
	cancel()
	if err != nil {
		w.close()
		var certErr *tls.CertificateVerificationError
		if errors.As(err, &certErr) {
			trusted := EnvPrefix + "REDIS_CA_FILE is empty: the system roots"
			if w.cfg.RedisCAFile != "" {
				trusted = "the CAs in " + EnvPrefix + "REDIS_CA_FILE=" + w.cfg.RedisCAFile
			}
			return fmt.Errorf("start worker: redis (%sREDIS_URL): its TLS certificate is not trusted by %s: %w", EnvPrefix, trusted, err)
		}
		return fmt.Errorf("start worker: redis (%sREDIS_URL): %w", EnvPrefix, err)
	}
	for _, e := range w.currentPolicy().Entries() {
		w.log.Info("rule", "rule", e.String())
	}
	stopGuard, err := w.startRedisGuard(ctx)
	if err != nil {
		w.close()
		return err
	}
	defer stopGuard()
	var httpSrv *http.Server
	if w.listener != nil || (w.cfg.HTTPAddr != "" && w.cfg.HTTPAddr != "off") {
		ln := w.listener
		if ln == nil {
			var err error
			if ln, err = net.Listen("tcp", w.cfg.HTTPAddr); err != nil {
				return fmt.Errorf("listen %s (SLUICE_HTTP_ADDR): %w", w.cfg.HTTPAddr, err)
			}
		}
		httpSrv = &http.Server{Handler: w.HTTPHandler(), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				w.log.Error("http server", "err", err)
			}
		}()
		w.log.Info("serving /metrics, /healthz, /readyz", "addr", ln.Addr().String())
	}
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWatch()
	if err := w.watchPlans(watchCtx); err != nil {
		if httpSrv != nil {
			httpSrv.Close()
		}
		w.close()
		return err
	}
	if w.gate != nil {
		gateCtx, stopGate := context.WithCancel(context.WithoutCancel(ctx))
		gateDone := make(chan struct{})
		go func() { defer close(gateDone); w.gate.Run(gateCtx) }()
		defer func() { stopGate(); <-gateDone }()
	}
	for i, srv := range w.servers {
		if err := srv.Start(w.mux); err != nil {
			for _, started := range w.servers[:i] {
				started.Shutdown()
			}
			if httpSrv != nil {
				httpSrv.Close()
			}
			w.close()
			return fmt.Errorf("start worker: %w", err)
		}
	}
	if w.cfg.OrphanAfter > 0 {
		sw := newOrphanSweeper(w.rdb, w.layout.Queues(), w.cfg.OrphanAfter, w.gate, w.log.With("component", "orphans"), func(string) { w.metrics.Orphans.Inc() })
		sweepDone := make(chan struct{})
		sweepCtx, stopSweep := context.WithCancel(ctx)
		go func() { defer close(sweepDone); sw.run(sweepCtx) }()
		defer func() { stopSweep(); <-sweepDone }()
	}
	<-ctx.Done()
	w.log.Info("shutting down: finishing in-flight sends", "timeout", w.cfg.ShutdownTimeout)
	close(w.stopping)
	var wg sync.WaitGroup
	for _, srv := range w.servers {
		wg.Add(1)
		go func() { defer wg.Done(); srv.Shutdown() }()
	}
	wg.Wait()
	if httpSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = httpSrv.Shutdown(sctx)
		cancel()
	}
	stopWatch()
	<-w.watcher.Load().Done()
	w.close()
	w.log.Info("worker stopped")
	return nil
}

func (w *Worker) close() {
	_ = w.limiter.Close()
	for _, s := range w.senders {
		if c, ok := s.(io.Closer); ok {
			_ = c.Close()
		}
	}
	if w.asynqRDB != w.rdb {
		_ = w.asynqRDB.Close()
	}
	if w.ownRedis {
		_ = w.rdb.Close()
	}
}

// HTTPHandler serves /metrics, /healthz (the process is up) and /readyz
// (Redis answers, and has not evicted keys lately nor filled its memory:
// redisguard.Status).
func (w *Worker) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(w.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(rw http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(rw, "ok")
	})
	mux.HandleFunc("/readyz", func(rw http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		if err := w.rdb.Ping(ctx).Err(); err != nil {
			http.Error(rw, "not ready: redis unreachable: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.redisGuard.Load().Status().Write(rw) // evictions, full memory (README, "Metrics and health")
	})
	return mux
}

func (w *Worker) sendHandler(ch tasks.Channel) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		n, ok := notificationFrom(ctx)
		if !ok {
			return errors.New("worker: handler called without the throttle middleware")
		}
		s, ok := w.senders[ch]
		if !ok {
			return &SendError{Err: fmt.Errorf("%w %s", ErrNoSender, ch), Permanent: true, NotSent: true}
		}
		return s.Send(ctx, n)
	})
}

func (w *Worker) handleError(ctx context.Context, t *asynq.Task, err error) {
	if !isFailure(err) {
		return // throttled or unavailable: logged where it happened
	}
	id, _ := asynq.GetTaskID(ctx)
	w.log.Debug("task attempt failed", "task_id", id, "type", t.Type(), "err", err)
}

func buildSenders(cfg Config, log *slog.Logger) (map[tasks.Channel]Sender, error) {
	out := map[tasks.Channel]Sender{}
	switch cfg.EmailSender {
	case "smtp":
		dkimCfg, err := cfg.dkimConfig()
		if err != nil {
			return nil, err
		}
		if dkimCfg != nil {
			log.Info("signing email with DKIM", "domain", dkimCfg.Domain, "selector", dkimCfg.Selector, "headers", strings.Join(dkimCfg.Headers, ":"))
			if !dkimAligned(cfg.SMTPFrom, dkimCfg.Domain) {
				log.Warn("the DKIM domain is not SMTP_FROM's domain nor a parent or subdomain of it: DMARC will not count the signature for mail from it",
					"dkim_domain", dkimCfg.Domain, "smtp_from", cfg.SMTPFrom)
			}
		}
		s, err := NewSMTPSender(SMTPConfig{Host: cfg.SMTPHost, Port: cfg.SMTPPort, TLS: cfg.SMTPTLS, CAFile: cfg.SMTPCAFile,
			Username: cfg.SMTPUser, Password: cfg.SMTPPass, AllowPlainAuth: cfg.SMTPAllowPlainAuth,
			From: cfg.SMTPFrom, Conns: cfg.SMTPConns, Timeout: cfg.SMTPTimeout, DKIM: dkimCfg})
		if err != nil {
			return nil, err
		}
		out[tasks.Email] = s
	default:
		out[tasks.Email] = LogSender{Logger: log}
	}
	switch cfg.SMSSender {
	case "http":
		s, err := NewHTTPSMSSender(HTTPSMSConfig{BaseURL: cfg.SMSBaseURL, AccountSID: cfg.SMSAccountSID,
			AuthToken: cfg.SMSAuthToken, From: cfg.SMSFrom, MessagingServiceSID: cfg.SMSMessagingServiceSID,
			StatusCallback: cfg.SMSStatusCallbackURL, Timeout: cfg.SMSTimeout})
		if err != nil {
			return nil, err
		}
		out[tasks.SMS] = s
	default:
		out[tasks.SMS] = LogSender{Logger: log}
	}
	return out, nil
}

// NewRedisClient builds the Redis client of cfg: a Cluster client when
// RedisClusterAddrs is set, else a single-node client from RedisURL. A
// rediss:// URL turns TLS on, verified against RedisCAFile when set (else the
// system roots).
func NewRedisClient(cfg Config) (redis.UniversalClient, error) {
	opt, err := redis.ParseURL(cfg.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %sREDIS_URL: %w", ErrConfig, EnvPrefix, err)
	}
	if cfg.RedisCAFile != "" {
		if opt.TLSConfig == nil {
			return nil, fmt.Errorf("%w: %sREDIS_CA_FILE is set but %sREDIS_URL is not a rediss:// URL", ErrConfig, EnvPrefix, EnvPrefix)
		}
		if opt.TLSConfig.RootCAs, err = loadCAFile(cfg.RedisCAFile); err != nil {
			return nil, fmt.Errorf("%w: %sREDIS_CA_FILE %w", ErrConfig, EnvPrefix, err)
		}
	}
	// ParseURL set ServerName to the URL's host: right for a single node.
	if len(cfg.RedisClusterAddrs) == 0 {
		return redis.NewClient(opt), nil
	}
	var tlsCfg *tls.Config
	if opt.TLSConfig != nil {
		// A Cluster's nodes are dialed at the addresses they announce, not at
		// the URL's host. With ServerName empty, crypto/tls takes it from the
		// address each dial goes to, so every node's certificate is checked
		// against its own host.
		tlsCfg = opt.TLSConfig.Clone()
		tlsCfg.ServerName = ""
	}
	return redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: cfg.RedisClusterAddrs, Username: opt.Username, Password: opt.Password, TLSConfig: tlsCfg,
	}), nil
}

// NewLogger returns the slog logger Config asks for.
func NewLogger(out io.Writer, cfg Config) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	o := &slog.HandlerOptions{Level: lvl}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(out, o))
	}
	return slog.New(slog.NewTextHandler(out, o))
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
