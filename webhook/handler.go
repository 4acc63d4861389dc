package webhook

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/internal/problem"
	"github.com/sluicehq/sluice/tasks"
)

// Route is the pattern of a provider's route: POST /v1/webhooks/NAME/{tenant}.
func Route(p Provider) string { return "POST " + Path(p.Name(), "{tenant}") }

// Path is the path of a provider's route for tenant.
func Path(provider, tenant string) string { return "/v1/webhooks/" + provider + "/" + tenant }

// MaxBodyBytes bounds a delivery's body: SendGrid, whose batches are the
// largest, posts at most 768 KB; an SNS message is at most 256 KB.
const MaxBodyBytes = 1 << 20

// HeadChecker is a Provider that can refuse a delivery from its head alone
// (its credentials, signature headers, timestamp): the handler asks it
// before it reads the body. in has no Body yet.
type HeadChecker interface {
	CheckHead(in Inbound) error
}

// Config is what the handlers share.
type Config struct {
	Consent *consent.Store
	Store   *Store
	Guard   *Guard
	Log     *slog.Logger
	// UndeliverableFor is how long a bounce keeps an address undeliverable
	// (SLUICE_EMAIL_SUPPRESS_TTL).
	UndeliverableFor time.Duration
	// ClientIP reads a request's client address (default: the peer's).
	ClientIP func(*http.Request) netip.Addr
	// Now is the clock signed timestamps are compared with (default
	// time.Now; tests only).
	Now func() time.Time
}

// Metrics are the handlers' counters.
type Metrics struct {
	events  *prometheus.CounterVec
	refused *prometheus.CounterVec
}

// NewMetrics registers sluice_webhook_events_total and
// sluice_webhook_refused_total on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_webhook_events_total",
			Help: "Events of verified provider webhooks, by provider and outcome (recorded, ignored: not a bounce, complaint or unsubscribe, or no valid address).",
		}, []string{"provider", "outcome"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_webhook_refused_total",
			Help: "Provider webhook deliveries refused or recorded nothing, by provider and reason (unsigned, forged, stale, not_allowed, malformed, not_configured, duplicate, unavailable: the check could not be made now, e.g. a signing certificate that could not be fetched).",
		}, []string{"provider", "reason"}),
	}
	for _, c := range []prometheus.Collector{m.events, m.refused} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Handler is one provider's route.
type Handler struct {
	p              Provider
	cfg            Config
	m              *Metrics
	warnLog        *LogEvery
	unavailableLog *LogEvery
}

// NewHandler returns p's route over cfg, counting in m.
func NewHandler(p Provider, cfg Config, m *Metrics) *Handler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ClientIP == nil {
		cfg.ClientIP = PeerIP
	}
	return &Handler{p: p, cfg: cfg, m: m, warnLog: NewLogEvery(10 * time.Second), unavailableLog: NewLogEvery(10 * time.Second)}
}

// Answer is a recorded delivery's answer.
type Answer struct {
	Recorded  int  `json:"recorded"`
	Ignored   int  `json:"ignored"`
	Duplicate bool `json:"duplicate,omitempty"`
}

// ServeHTTP is POST /v1/webhooks/NAME/{tenant}.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name, tenant := h.p.Name(), r.PathValue("tenant")
	if tasks.CheckTenant(tenant) != nil {
		problem.Write(w, http.StatusNotFound, "not-found", "no such tenant")
		return
	}
	creds, err := h.cfg.Store.Get(r.Context(), tenant, name)
	switch {
	case errors.Is(err, ErrNotConfigured):
		h.m.refused.WithLabelValues(name, "not_configured").Inc()
		problem.Write(w, http.StatusNotFound, "not-found", "no "+name+" webhook is configured for this tenant: sluice webhook set "+tenant+" "+name)
		return
	case errors.Is(err, tasks.ErrSealed):
		h.cfg.Log.Error("webhook credentials do not open with SLUICE_PAYLOAD_KEYS; set them again", "provider", name, "tenant", tenant, "err", err)
		problem.Write(w, http.StatusInternalServerError, "unreadable", "the tenant's "+name+" credentials cannot be read by this version (SLUICE_PAYLOAD_KEYS); nothing was recorded")
		return
	case err != nil:
		h.unavailable(w, err)
		return
	}
	in := Inbound{Request: r, Creds: creds, Now: h.cfg.Now(), ClientIP: h.cfg.ClientIP(r)}
	// What the head can refuse is refused before the body is read: an
	// unauthenticated client holds its connection no longer than its head.
	if hc, ok := h.p.(HeadChecker); ok {
		if err := hc.CheckHead(in); err != nil {
			h.refuse(w, tenant, err)
			return
		}
	}
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	in.Body = body
	b, err := h.p.Verify(r.Context(), in)
	if err != nil {
		h.refuse(w, tenant, err)
		return
	}
	h.apply(w, r.Context(), tenant, b)
}

// apply runs the replay guard, the handshake and the events of a verified
// delivery.
func (h *Handler) apply(w http.ResponseWriter, ctx context.Context, tenant string, b Batch) {
	name := h.p.Name()
	if b.ReplayID != "" {
		first, err := h.cfg.Guard.First(ctx, name, b.ReplayID, b.ReplayTTL)
		if err != nil {
			h.unavailable(w, err)
			return
		}
		if !first {
			h.m.refused.WithLabelValues(name, "duplicate").Inc()
			problem.WriteJSON(w, http.StatusOK, Answer{Duplicate: true})
			return
		}
	}
	forget := func() {
		if b.ReplayID != "" {
			_ = h.cfg.Guard.Forget(context.WithoutCancel(ctx), name, b.ReplayID)
		}
	}
	if b.Confirm != nil {
		if err := b.Confirm(ctx); err != nil {
			forget()
			h.cfg.Log.Warn("webhook handshake failed; the provider retries", "provider", name, "tenant", tenant, "err", err)
			w.Header().Set("Retry-After", "1")
			problem.Write(w, http.StatusServiceUnavailable, "unavailable", "the subscription could not be confirmed now; nothing was recorded, try again")
			return
		}
		h.cfg.Log.Info("webhook subscription confirmed", "provider", name, "tenant", tenant)
	}
	ans := Answer{Ignored: b.Ignored}
	now := h.cfg.Now()
	for _, it := range b.Items {
		e, _, err := it.Report.Event(h.cfg.UndeliverableFor, now)
		if err != nil || tasks.CheckRecipient(tasks.Email, it.Recipient) != nil {
			ans.Ignored++
			continue
		}
		if _, err := h.cfg.Consent.Record(ctx, tenant, tasks.Email, it.Recipient, e); err != nil {
			forget()
			h.m.events.WithLabelValues(name, "recorded").Add(float64(ans.Recorded))
			h.unavailable(w, err)
			return
		}
		ans.Recorded++
	}
	h.m.events.WithLabelValues(name, "recorded").Add(float64(ans.Recorded))
	h.m.events.WithLabelValues(name, "ignored").Add(float64(ans.Ignored))
	if ans.Recorded > 0 {
		h.cfg.Log.Info("webhook events recorded", "provider", name, "tenant", tenant, "recorded", ans.Recorded, "ignored", ans.Ignored)
	}
	problem.WriteJSON(w, http.StatusOK, ans)
}

// refuse answers a delivery Verify refused; nothing was recorded.
func (h *Handler) refuse(w http.ResponseWriter, tenant string, err error) {
	name := h.p.Name()
	reason, status, kind := "malformed", http.StatusBadRequest, "invalid-request"
	switch {
	case errors.Is(err, ErrUnsigned):
		reason, status, kind = "unsigned", http.StatusForbidden, "bad-signature"
	case errors.Is(err, ErrForged):
		reason, status, kind = "forged", http.StatusForbidden, "bad-signature"
	case errors.Is(err, ErrStale):
		reason, status, kind = "stale", http.StatusForbidden, "bad-signature"
	case errors.Is(err, ErrNotAllowed):
		reason, status, kind = "not_allowed", http.StatusForbidden, "bad-signature"
	case errors.Is(err, ErrUnavailable):
		// Sampled like every refusal: anyone can post a delivery naming a
		// certificate that cannot be fetched.
		h.m.refused.WithLabelValues(name, "unavailable").Inc()
		h.unavailableLog.Warn(h.cfg.Log, "webhook could not be checked now; the provider retries", "provider", name, "tenant", tenant, "err", err)
		w.Header().Set("Retry-After", "5")
		problem.Write(w, http.StatusServiceUnavailable, "check-unavailable", "nothing was recorded: "+err.Error())
		return
	}
	h.m.refused.WithLabelValues(name, reason).Inc()
	if status == http.StatusForbidden {
		h.warnLog.Warn(h.cfg.Log, "webhook delivery refused", "provider", name, "tenant", tenant, "reason", reason)
	}
	problem.Write(w, status, kind, "nothing was recorded: "+err.Error())
}

func (h *Handler) unavailable(w http.ResponseWriter, err error) {
	h.cfg.Log.Error("webhook: redis trouble; delivery refused, the provider retries", "provider", h.p.Name(), "err", err)
	w.Header().Set("Retry-After", "1")
	problem.Write(w, http.StatusServiceUnavailable, "unavailable", "Redis could not be asked; nothing more was recorded, try again")
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			problem.Write(w, http.StatusRequestEntityTooLarge, "too-large", "a webhook delivery is at most 1 MiB")
			return nil, false
		}
		problem.Write(w, http.StatusBadRequest, "invalid-request", "the body could not be read in time (SLUICE_API_UNAUTHENTICATED_BODY_TIMEOUT) or in full")
		return nil, false
	}
	return body, true
}

// PeerIP is the request's peer address.
func PeerIP(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// HeaderIP returns a ClientIP reading header, set by a trusted proxy
// (X-Forwarded-For: its last entry, the one the proxy appended), else the
// peer's address — as the API counts failed authentications
// (SLUICE_API_CLIENT_IP_HEADER).
func HeaderIP(header string) func(*http.Request) netip.Addr {
	if header == "" {
		return PeerIP
	}
	return func(r *http.Request) netip.Addr {
		vs := r.Header.Values(header)
		if len(vs) == 0 {
			return PeerIP(r)
		}
		last := vs[len(vs)-1]
		if i := strings.LastIndexByte(last, ','); i >= 0 {
			last = last[i+1:]
		}
		a, err := netip.ParseAddr(strings.TrimSpace(last))
		if err != nil {
			return netip.Addr{}
		}
		return a.Unmap()
	}
}

// LogEvery logs one WARN per interval for a repeated event (a refused
// delivery or signature: anyone can send them, and one line each would let
// them fill the log), naming how many were not logged since the last line.
type LogEvery struct {
	interval time.Duration
	mu       sync.Mutex
	last     time.Time
	skipped  int
}

// NewLogEvery returns a LogEvery of interval.
func NewLogEvery(interval time.Duration) *LogEvery { return &LogEvery{interval: interval} }

// Warn logs msg unless another was logged within the interval.
func (s *LogEvery) Warn(log *slog.Logger, msg string, args ...any) {
	s.mu.Lock()
	now := time.Now()
	if !s.last.IsZero() && now.Sub(s.last) < s.interval {
		s.skipped++
		s.mu.Unlock()
		return
	}
	skipped := s.skipped
	s.last, s.skipped = now, 0
	s.mu.Unlock()
	log.Warn(msg, append(args, "not_logged_since_last", skipped, "logged_at_most_every", s.interval)...)
}
