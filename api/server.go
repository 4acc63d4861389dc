package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/digest"
	"github.com/sluicehq/sluice/internal/connlimit"
	"github.com/sluicehq/sluice/internal/lifecycle"
	"github.com/sluicehq/sluice/internal/redisguard"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/services"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// Options are what a Server takes besides its configuration and the
// shared services. All optional.
type Options struct {
	// Listener serves the API instead of listening on Config.Addr.
	Listener net.Listener
	// TracerProvider makes each request's server span, continuing the
	// trace of a W3C traceparent the client sent; the span context travels
	// into the tasks enqueued. Default: the global provider (cmd/sluice
	// installs one when OTEL_TRACES_EXPORTER asks).
	TracerProvider trace.TracerProvider
	// Routes are mounted beside the API's own, instrumented like them but
	// without its token authentication: a provider's callback route
	// (sender/twilio's status callbacks), the dashboard.
	Routes []Route
}

// Route is one more handler of the server, at a net/http mux pattern.
type Route struct {
	Pattern string
	Handler http.Handler
	// Bare routes are served as is: no access log, no metrics (static files).
	Bare bool
}

// Server is the HTTP ingest API: handlers are its methods.
type Server struct {
	cfg         Config
	deps        *services.Set
	log         *slog.Logger
	rdb         redis.UniversalClient
	client      *asynq.Client
	producer    *tasks.Producer // into the tenants' waiting rooms, in order to the microsecond
	insp        *asynq.Inspector
	keys        *tasks.Keyring
	lim         *throttle.Limiter
	delivery    *delivery.Store
	digests     *digest.Store
	tokens      *Tokens
	idem        *idemStore
	fail        *failures // failed authentications per client
	rate        throttle.Rule
	notifRate   throttle.Rule      // SLUICE_API_NOTIFICATION_RATE
	fromDomains config.FromDomains // SLUICE_EMAIL_FROM_DOMAINS
	plans       *plans.Live
	routes      []Route
	metrics     *metrics
	registry    *prometheus.Registry
	listener    net.Listener
	stopping    atomic.Bool
	redisGuard  atomic.Pointer[redisguard.Guard] // Redis's settings, watched once running
	tracing     trace.TracerProvider
}

// New builds the API server from its configuration, which its caller
// validated (app.NewAPI does, once: Config.Validate), on svc
// (app opens it). It does not connect until Run (or WatchPlans);
// Run closes svc when it returns, Close when it will not run.
func New(cfg Config, svc *services.Set, opts Options) (*Server, error) {
	rate, err := cfg.RateRule()
	if err != nil {
		return nil, fmt.Errorf("%w: %sAPI_RATE: %w", ErrConfig, config.EnvPrefix, err)
	}
	s := &Server{cfg: cfg, deps: svc, log: svc.Log, rdb: svc.Redis, keys: svc.Keys, lim: svc.Limiter, plans: svc.Plans,
		registry: svc.Registry, listener: opts.Listener, rate: rate, routes: opts.Routes, tracing: opts.TracerProvider}
	if s.tracing == nil {
		s.tracing = otel.GetTracerProvider()
	}
	s.metrics = newMetrics(s.registry)
	s.delivery = delivery.NewStore(s.rdb, s.lim)
	s.digests = digest.New(s.rdb, s.lim)
	if s.tokens, err = NewTokens(s.rdb, cfg.TokenKey); err != nil {
		return nil, err
	}
	s.fail = cfg.failures(s.lim)
	s.notifRate, _ = cfg.NotificationRule()
	s.fromDomains = cfg.EmailFromDomains
	s.idem = &idemStore{rdb: s.rdb, ttl: cfg.IdempotencyTTL, lockTTL: cfg.lockTTL()}
	s.client = asynq.NewClientFromRedisClient(s.rdb)
	s.producer = tasks.NewProducer(s.rdb, s.keys)
	s.insp = asynq.NewInspectorFromRedisClient(s.rdb)
	return s, nil
}

// Mount adds a route beside the API's own (before Handler or Run), mounted
// as Options.Routes are.
func (s *Server) Mount(pattern string, h http.Handler) {
	s.routes = append(s.routes, Route{Pattern: pattern, Handler: h})
}

// Services are what the server runs on (Redis, the limiter, the key ring,
// the logger, the registry, the rules in force): for routes mounted beside it.
func (s *Server) Services() *services.Set { return s.deps }

// Tokens returns the server's token store.
func (s *Server) Tokens() *Tokens { return s.tokens }

// WatchPlans starts following the tenant plans in Redis until ctx ends, so
// quotas answer under the rules in force. Run calls it.
func (s *Server) WatchPlans(ctx context.Context) error {
	return s.deps.Follow(ctx, s.cfg.PlanCheckInterval, nil)
}

// policy is the rules in force: SLUICE_RULES with the tenant plans.
func (s *Server) policy() plans.Policy { return s.plans.Policy() }

// Handler returns the API's routes.
func (s *Server) Handler() http.Handler { return s.mux().ServeMux }

// Patterns lists the net/http pattern of every route Handler serves, the
// mounted ones included, in the order they are registered: what the
// endpoint lists of api/doc.go and dashboard/doc.go are checked against.
func (s *Server) Patterns() []string { return s.mux().patterns }

// patternMux is a ServeMux that remembers the patterns registered on it.
type patternMux struct {
	*http.ServeMux
	patterns []string
}

func (m *patternMux) Handle(pattern string, h http.Handler) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

func (m *patternMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// allowed is the Allow header for path: the methods of every registered
// pattern whose path matches it, in the order registered, HEAD after GET
// (net/http serves HEAD with a GET route); "" when none does.
func (m *patternMux) allowed(path string) string {
	var methods []string
	add := func(method string) {
		if !slices.Contains(methods, method) {
			methods = append(methods, method)
		}
	}
	for _, p := range m.patterns {
		method, pat, ok := strings.Cut(p, " ")
		if !ok || !matchPath(strings.TrimSpace(pat), path) {
			continue
		}
		add(method)
		if method == http.MethodGet {
			add(http.MethodHead)
		}
	}
	return strings.Join(methods, ", ")
}

// matchPath reports whether path matches a ServeMux pattern's path:
// literal segments, {name} for one non-empty segment, {name...} for the
// rest, a trailing slash for a subtree.
func matchPath(pattern, path string) bool {
	ps, xs := strings.Split(pattern, "/"), strings.Split(path, "/")
	for i, seg := range ps {
		switch {
		case strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "...}"):
			return i <= len(xs)
		case i == len(ps)-1 && seg == "" && i > 0:
			return i <= len(xs) // a subtree: "/prefix/"
		case i >= len(xs):
			return false
		case strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}"):
			if xs[i] == "" {
				return false
			}
		case seg != xs[i]:
			return false
		}
	}
	return len(ps) == len(xs)
}

// mux builds the API's routes: its own (behind instrument, authenticate
// and rateLimit), the mounted ones, the answers for everything else under
// /v1/, and the document and probes.
func (s *Server) mux() *patternMux {
	mux := &patternMux{ServeMux: http.NewServeMux()}
	api := func(pattern string, h http.HandlerFunc) {
		mux.Handle(pattern, s.instrument(s.authenticate(s.rateLimit(h))))
	}
	api("POST /v1/notifications", s.createNotifications)
	api("GET /v1/notifications/{id}", s.getNotification)
	api("GET /v1/quotas", s.getQuotas)
	api("GET /v1/suppressions/{channel}/{recipient}", s.getSuppression)
	api("POST /v1/suppressions/{channel}/{recipient}", s.postSuppression)
	api("PUT /v1/suppressions/{channel}/{recipient}", s.postSuppression)
	api("DELETE /v1/suppressions/{channel}/{recipient}", s.deleteSuppression)
	api("POST /v1/events/{channel}", s.postEvents)
	// Routes mounted beside the API's (a provider's callbacks are signed by
	// the provider instead of carrying a token, nor a token's rate).
	for _, rt := range s.routes {
		if rt.Bare {
			mux.Handle(rt.Pattern, rt.Handler)
			continue
		}
		mux.Handle(rt.Pattern, s.instrument(bodyDeadline(s.cfg.BodyTimeout, rt.Handler)))
	}
	mux.Handle("/v1/", s.instrument(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The catch-all under /v1/ hides net/http's own 405: the Allow
		// header is made here from every route registered, the mounted
		// ones included, so a route cannot be left out.
		if allow := mux.allowed(r.URL.Path); allow != "" {
			w.Header().Set("Allow", allow)
			writeProblem(w, http.StatusMethodNotAllowed, "method-not-allowed", r.Method+" is not served here; see /openapi.yaml")
			return
		}
		writeProblem(w, http.StatusNotFound, "not-found", "no such endpoint; see /openapi.yaml")
	})))
	mux.Handle("GET /openapi.yaml", s.instrument(http.HandlerFunc(serveOpenAPI)))
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", s.readyz)
	return mux
}

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.stopping.Load() {
		http.Error(w, "not ready: shutting down", http.StatusServiceUnavailable)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		http.Error(w, "not ready: redis unreachable: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	s.redisGuard.Load().Status().Write(w) // evictions, full memory (docs/operations.md, "Metrics and health")
}

// Run serves until ctx ends, then shuts down gracefully: /readyz turns
// 503, new connections are refused, requests in flight get
// Config.ShutdownTimeout to finish. Its parts start in the order of this
// list and stop in reverse.
func (s *Server) Run(ctx context.Context) error {
	parts := s.deps.Parts(s.cfg.Base, services.RunOptions{What: "api", PlanInterval: s.cfg.PlanCheckInterval,
		// The API admits no sends: it waits for no replica.
		OnGuard: func(g *redisguard.Guard, _ redisguard.Report) { s.redisGuard.Store(g) }})
	http, ln, err := s.httpPart()
	if err != nil {
		s.Close()
		return err
	}
	defer ln.Close() // if a part before the server failed to start
	err = lifecycle.Run(ctx, s.log, append(parts,
		lifecycle.Func("stopping", nil, func(context.Context) error { // before the server: /readyz turns 503 first
			s.stopping.Store(true)
			s.log.Info("shutting down: finishing requests in flight", "timeout", s.cfg.ShutdownTimeout)
			return nil
		}),
		http)...)
	if err == nil {
		s.log.Info("api stopped")
	}
	return err
}

// httpPart serves the API on Options.Listener or API_ADDR, behind the
// connection limits (internal/connlimit) and every deadline.
func (s *Server) httpPart() (lifecycle.Part, net.Listener, error) {
	ln := s.listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", s.cfg.Addr); err != nil {
			return nil, nil, fmt.Errorf("listen %s (%sAPI_ADDR): %w", s.cfg.Addr, config.EnvPrefix, err)
		}
	}
	limited := connlimit.New(ln, connlimit.Options{Max: s.cfg.MaxConns, PerClient: s.cfg.MaxConnsPerClient,
		Logger: s.log.With("component", "connections")})
	srv := &http.Server{
		Handler:           s.Handler(),
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes - headerSlack,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      s.cfg.ReadTimeout + time.Minute,
		IdleTimeout:       s.cfg.IdleTimeout,
		ConnState:         limited.ConnState,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	s.registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_api_connections_open",
			Help: "Client connections the API holds open (at most SLUICE_API_MAX_CONNS)."},
			func() float64 { return float64(limited.Stats().Open) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_api_connections_closed_for_room_total",
			Help: "Idle keep-alive connections closed to make room for a new one."},
			func() float64 { return float64(limited.Stats().Evicted) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sluice_api_connections_refused_total",
			Help: "Connections answered 503 connection-limit: their address held SLUICE_API_MAX_CONNS_PER_CLIENT already."},
			func() float64 { return float64(limited.Stats().Refused) }))
	s.log.Info("serving the API", "addr", ln.Addr().String(), "rate_per_token", s.rate.String(), "admin_token", s.cfg.AdminToken != "")
	return lifecycle.Serve("http", srv, limited, s.cfg.ShutdownTimeout), limited, nil
}

// Close releases the services (Redis, the limiter) of a Server that will
// not Run; Run closes them itself when it returns.
func (s *Server) Close() { s.deps.Close() }

// identity is who a request acts as.
type identity struct {
	Tenant  string // "" for the admin
	Admin   bool
	TokenID string // "admin" for the admin token
}

type identityKey struct{}

func identityOf(r *http.Request) identity {
	id, _ := r.Context().Value(identityKey{}).(identity)
	return id
}

// authenticate resolves the bearer token to a tenant (or the admin).
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Refusals are answered without reading the body, and the
		// connection closed: an unauthenticated upload holds nothing.
		w.Header().Set("Connection", "close")
		client := s.fail.client(r)
		if wait, locked, err := s.fail.locked(r.Context(), client); err != nil {
			s.unavailable(w, r, err)
			return
		} else if locked {
			s.authLimited(w, wait)
			return
		}
		scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		token = strings.TrimSpace(token)
		if !strings.EqualFold(scheme, "Bearer") || token == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
			writeProblem(w, http.StatusUnauthorized, "unauthorized", "send Authorization: Bearer <token> (sluice tenant token create TENANT)")
			return
		}
		var id identity
		if s.cfg.AdminToken != "" && sameSecret(token, s.cfg.AdminToken) {
			id = identity{Admin: true, TokenID: "admin"}
		} else {
			info, err := s.tokens.Lookup(r.Context(), token)
			if errors.Is(err, ErrUnknownToken) {
				if err := s.fail.failed(r.Context(), client); err != nil {
					s.unavailable(w, r, err)
					return
				}
				w.Header().Set("WWW-Authenticate", `Bearer realm="sluice", error="invalid_token"`)
				writeProblem(w, http.StatusUnauthorized, "unauthorized", "the token is unknown or revoked")
				return
			}
			if err != nil {
				s.unavailable(w, r, err)
				return
			}
			id = identity{Tenant: info.Tenant, TokenID: info.ID}
		}
		w.Header().Del("Connection") // authenticated: keep-alive as usual
		if rec, ok := w.(*recorder); ok {
			rec.id = id
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), identityKey{}, id)))
	})
}

// rateLimit admits at most SLUICE_API_RATE requests per token, counted by
// Sluice's own limiter: exact across API replicas.
func (s *Server) rateLimit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := identityOf(r)
		wait, ok, err := s.tokenRate(r.Context(), id.TokenID)
		if err != nil {
			s.unavailable(w, r, err)
			return
		}
		if !ok {
			secs := int((wait + time.Second - 1) / time.Second)
			w.Header().Set("Retry-After", strconv.Itoa(max(1, secs)))
			writeProblem(w, http.StatusTooManyRequests, "rate-limited", fmt.Sprintf("this token may make %s requests; try again in %v", s.rate, wait.Round(time.Millisecond)))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// authLimited answers a client past SLUICE_API_AUTH_FAILURES.
func (s *Server) authLimited(w http.ResponseWriter, wait time.Duration) {
	s.metrics.authLimited.Inc()
	w.Header().Set("Retry-After", retryAfter(wait))
	writeProblem(w, http.StatusTooManyRequests, "auth-limited", fmt.Sprintf("too many failed authentications from this address (%s); try again in %v", s.fail.rule, wait.Round(time.Second)))
}

// tokenRate counts one request of tokenID against SLUICE_API_RATE (the
// API's and the dashboard's requests share it).
func (s *Server) tokenRate(ctx context.Context, tokenID string) (time.Duration, bool, error) {
	d, err := s.lim.Allow(ctx, "api/"+tokenID, tasks.NewID(), throttle.Limit{Scope: "api:requests", Rule: s.rate})
	if err != nil {
		return 0, false, err
	}
	if !d.Allowed {
		s.metrics.rateLimited.Inc()
	}
	return d.RetryAfter, d.Allowed, nil
}

// unavailable answers a request that Redis could not serve.
func (s *Server) unavailable(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil && errors.Is(err, r.Context().Err()) {
		// The client went away while Redis was asked: its own doing, not
		// trouble (and a client must not be able to fill the error log).
		s.log.Debug("client went away; request dropped", "route", r.Pattern, "err", err)
	} else {
		s.log.Error("redis trouble; request refused", "route", r.Pattern, "err", err)
	}
	w.Header().Set("Retry-After", "1")
	writeProblem(w, http.StatusServiceUnavailable, "unavailable", "Redis could not be asked; nothing was done, try again")
}

// recorder keeps the status for the access log and the metrics.
type recorder struct {
	http.ResponseWriter
	status int
	id     identity
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// instrument traces, logs and counts each request by its route pattern.
// The query string is never logged: it may hold a recipient (GET
// /v1/quotas). The span (otelhttp) continues a traceparent the client
// sent, and its context is the request's, so enqueued tasks carry it.
func (s *Server) instrument(next http.Handler) http.Handler {
	// The span is outside the access log's recorder, so a handler still
	// finds the recorder's SetIdentity on its ResponseWriter.
	return otelhttp.NewHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &recorder{ResponseWriter: w}
		next.ServeHTTP(rec, r)
		route := r.Pattern
		if route == "" {
			route = "other"
		}
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		s.metrics.requests.WithLabelValues(route, strconv.Itoa(rec.status)).Inc()
		s.metrics.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
		s.log.Log(r.Context(), accessLevel(r, rec.status), "request", "method", r.Method, "route", route, "status", rec.status,
			"duration", time.Since(start).Round(time.Microsecond), "tenant", rec.id.Tenant, "token_id", rec.id.TokenID)
	}), "sluice-api", otelhttp.WithTracerProvider(s.tracing), otelhttp.WithPropagators(tasks.Propagator()),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			if r.Pattern != "" {
				return r.Pattern
			}
			return r.Method + " other"
		}))
}

// accessLevel is the level of a request's access-log line: info, but
// error for a server fault (5xx) the client did not cause. A 503 is a
// refusal the server chose (Redis out of reach, streams all taken: each
// logged where it happened, sampled where a client could repeat it), and
// a client that went away ends its own request: neither is an error line
// a client could fill the log with.
func accessLevel(r *http.Request, status int) slog.Level {
	if status < 500 || status == http.StatusServiceUnavailable || r.Context().Err() != nil {
		return slog.LevelInfo
	}
	return slog.LevelError
}

type metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	enqueued    *prometheus.CounterVec
	replays     prometheus.Counter
	rateLimited prometheus.Counter
	queueFull   *prometheus.CounterVec
	authLimited prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_api_requests_total",
			Help: "API requests by route pattern and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_api_request_duration_seconds",
			Help:    "Time to answer an API request, by route pattern.",
			Buckets: prometheus.DefBuckets,
		}, []string{"route"}),
		enqueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_api_enqueued_total",
			Help: "Notifications enqueued through the API, by channel.",
		}, []string{"channel"}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_api_idempotent_replays_total",
			Help: "Responses replayed for a retried Idempotency-Key.",
		}),
		rateLimited: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_api_rate_limited_total",
			Help: "Requests refused with 429 by the per-token rate limit.",
		}),
	}
	m.queueFull = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_api_queue_full_total",
		Help: "Requests refused with 429 queue-full, by the cap that refused (notifications or bytes): the tenant is at its cap of queued work (SLUICE_TENANT_MAX_QUEUED*).",
	}, []string{"cap"})
	m.authLimited = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sluice_api_auth_limited_total",
		Help: "Requests refused with 429 auth-limited: their client failed authentication more than SLUICE_API_AUTH_FAILURES.",
	})
	reg.MustRegister(m.requests, m.duration, m.enqueued, m.replays, m.rateLimited, m.queueFull, m.authLimited)
	return m
}

// bodyDeadline gives a request to a route no bearer token authenticates
// (a provider's webhook, a link, a form) d from its start to send its body:
// an unauthenticated client dribbling a body holds its connection that
// long, not SLUICE_API_READ_TIMEOUT. Once the body is read the deadline is
// lifted (net/http reads on in the background to notice a client that goes
// away, which a lapsed deadline would take for one). A request without a
// body (a live stream) is left alone.
func bodyDeadline(d time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r)
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(d)); err != nil {
			next.ServeHTTP(w, r)
			return
		}
		r.Body = &liftOnEOF{ReadCloser: r.Body, lift: func() { _ = rc.SetReadDeadline(time.Time{}) }}
		next.ServeHTTP(w, r)
	})
}

// liftOnEOF calls lift once, when the body has been read to its end.
type liftOnEOF struct {
	io.ReadCloser
	lift func()
	done bool
}

func (b *liftOnEOF) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) && !b.done {
		b.done = true
		b.lift()
	}
	return n, err
}
