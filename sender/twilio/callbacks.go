package twilio

import (
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"crypto/subtle"
	"encoding/base64"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/internal/problem"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/webhook"
)

// CallbackRoute is the pattern `sluice api` mounts Callbacks on.
const CallbackRoute = "POST /v1/callbacks/sms/{tenant}/{id}"

// Callbacks is the provider's status-callback route (CallbackRoute): the
// provider's reports of each SMS's fate, recorded per notification.
type Callbacks struct {
	// OnUndelivered, if set, is called when a final status says the
	// message did not arrive (failed, undelivered): its fallback goes now
	// (delivery.Store.RunFallback). It runs in the request.
	OnUndelivered func(ctx context.Context, tenant, id string)

	authToken, baseURL string
	ttl, suppressFor   time.Duration
	codes              map[int]bool
	delivery           *delivery.Store
	consent            *consent.Store
	lim                *throttle.Limiter
	log                *slog.Logger
	outcomes           *prometheus.CounterVec
	badSignatures      prometheus.Counter
	badSigLog          *webhook.LogEvery
}

// NewCallbacks returns the route's handler; its metric
// (sluice_delivery_outcomes_total) is registered on reg.
func NewCallbacks(s Settings, base config.Base, store *delivery.Store, cs *consent.Store, lim *throttle.Limiter, log *slog.Logger, reg prometheus.Registerer) (*Callbacks, error) {
	codes := base.SMSSuppressCodes
	c := &Callbacks{authToken: s.AuthToken, baseURL: s.StatusCallbackURL, ttl: base.DedupeTTL, suppressFor: base.SMSSuppressTTL,
		codes: codes, delivery: store, consent: cs, lim: lim, log: log,
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_delivery_outcomes_total",
			Help: "Final delivery reports from SMS status callbacks, by channel, status (delivered, undelivered, failed) and code class (none, recipient, filtered, other); each notification's first final report only.",
		}, []string{"channel", "status", "code_class"}),
		badSignatures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_callback_bad_signatures_total",
			Help: "SMS status callbacks refused because their X-Twilio-Signature does not match (logged at most once every 10 s).",
		}),
		badSigLog: webhook.NewLogEvery(10 * time.Second)}
	if err := reg.Register(c.outcomes); err != nil {
		return nil, err
	}
	if err := reg.Register(c.badSignatures); err != nil {
		return nil, err
	}
	return c, nil
}

// maxCallbackBytes bounds a status callback's body: Twilio's are well
// under 2 KiB.
const maxCallbackBytes = 64 << 10

// smsCallback is POST /v1/callbacks/sms/{tenant}/{id}: a Twilio-compatible
// provider's status callback about one SMS (the URL the worker asked for
// with StatusCallback). It is authenticated by its X-Twilio-Signature, not
// by a token: a missing or wrong signature is refused (403) before anything
// is read or written. A notification Sluice has no record of is 404. The
// status is recorded only if it is further along than the one recorded; a
// first final one is counted, and an undelivered or failed one whose code
// is in SLUICE_SMS_SUPPRESS_CODES puts the recipient on the tenant's
// suppression list. The answer is 204 either way.
func (s *Callbacks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.baseURL == "" || s.authToken == "" {
		problem.Write(w, http.StatusNotFound, "not-found", "SMS status callbacks are off: set SLUICE_SMS_STATUS_CALLBACK_URL and SLUICE_SMS_AUTH_TOKEN")
		return
	}
	params, ok := readSignedForm(w, r, s.authToken, s.baseURL, "a status callback", func() {
		s.badSignatures.Inc()
		s.badSigLog.Warn(s.log, "SMS status callback refused: its signature does not match", "route", r.Pattern)
	})
	if !ok {
		return
	}
	cb, bad := parseStatusCallback(params)
	if len(bad) > 0 {
		problem.Write(w, http.StatusBadRequest, "invalid-request", "the status callback is not one Sluice can record", bad...)
		return
	}
	tenant, id := r.PathValue("tenant"), r.PathValue("id")
	if tasks.CheckTenant(tenant) != nil || tasks.CheckID(id) != nil {
		problem.Write(w, http.StatusNotFound, "not-found", "no notification with this id for this tenant")
		return
	}
	ctx := r.Context()
	rec, err := s.lim.Record(ctx, tenant, id)
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	if rec == nil {
		problem.Write(w, http.StatusNotFound, "not-found", "no notification with this id for this tenant was sent (or its record expired)")
		return
	}
	applied, prev, err := s.delivery.Update(ctx, tenant, id, delivery.Record{Status: cb.Status, ErrorCode: cb.ErrorCode, MessageSID: cb.MessageSID}, s.ttl)
	if err != nil {
		s.unavailable(w, r, err)
		return
	}
	log := s.log.With("tenant", tenant, "id", id, "status", cb.Status, "error_code", cb.ErrorCode)
	if !applied {
		log.Debug("SMS status callback older than the recorded status; nothing changed")
		w.WriteHeader(http.StatusNoContent)
		return
	}
	log.Debug("SMS status recorded")
	if cb.Status.Final() && (prev == nil || !prev.Status.Final()) {
		outcome := cb.Status.Outcome()
		s.outcomes.WithLabelValues(string(tasks.SMS), outcome, delivery.CodeClass(cb.ErrorCode)).Inc()
		sameTo := false
		if outcome != "delivered" && s.codes[cb.ErrorCode] && cb.To != "" {
			// One auth token signs every tenant's callbacks: mark only the
			// number this notification was sent to.
			same, known, err := s.delivery.WentTo(ctx, tenant, id, cb.To)
			switch {
			case err != nil:
				log.Warn("could not read the SMS's recipient; not marking the number undeliverable", "err", err)
			case !same:
				log.Warn("status callback names another number than the notification's recipient (or none is recorded); not marking it undeliverable", "recorded", known)
			default:
				sameTo = true
			}
		}
		if outcome != "delivered" && s.OnUndelivered != nil {
			s.OnUndelivered(ctx, tenant, id)
		}
		if sameTo {
			if _, err := s.consent.Record(ctx, tenant, tasks.SMS, cb.To, consent.Event{Action: consent.Undeliverable, Source: consent.SourceProvider,
				Code: cb.ErrorCode, Until: time.Now().Add(s.suppressFor), Ref: cb.MessageSID}); err != nil {
				log.Warn("could not mark the recipient undeliverable", "err", err)
			} else {
				log.Info("recipient marked undeliverable for the tenant", "for", s.suppressFor)
			}
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Callbacks) unavailable(w http.ResponseWriter, r *http.Request, err error) {
	s.log.Error("redis trouble; request refused", "route", r.Pattern, "err", err)
	w.Header().Set("Retry-After", "1")
	problem.Write(w, http.StatusServiceUnavailable, "unavailable", "Redis could not be asked; nothing was done, try again")
}

// statusCallback is what Sluice takes from a status callback.
type statusCallback struct {
	Status     delivery.Status
	ErrorCode  int
	MessageSID string
	To         string // the recipient, E.164; "" when absent or not a number
}

// parseStatusCallback reads a status callback's form: MessageStatus
// (required), ErrorCode, MessageSid and To; other fields are ignored. It
// returns every bad field.
func parseStatusCallback(form url.Values) (statusCallback, []problem.InvalidParam) {
	var cb statusCallback
	var bad []problem.InvalidParam
	one := func(name string) string {
		vs := form[name]
		if len(vs) > 1 {
			bad = append(bad, problem.InvalidParam{Name: name, Reason: "is given more than once"})
			return ""
		}
		if len(vs) == 0 {
			return ""
		}
		return vs[0]
	}
	if st := one("MessageStatus"); st != "" {
		var err error
		if cb.Status, err = delivery.ParseStatus(st); err != nil {
			bad = append(bad, problem.InvalidParam{Name: "MessageStatus", Reason: "is not a status of an outgoing message (queued, sent, delivered, undelivered, failed, ...)"})
		}
	} else if len(form["MessageStatus"]) < 2 {
		bad = append(bad, problem.InvalidParam{Name: "MessageStatus", Reason: "is required"})
	}
	if code := one("ErrorCode"); code != "" {
		n, err := strconv.Atoi(code)
		if err != nil || n < 0 || n > delivery.MaxErrorCode || len(code) > 6 || code[0] == '+' || code[0] == '-' {
			bad = append(bad, problem.InvalidParam{Name: "ErrorCode", Reason: "must be a number of up to 6 digits"})
		} else {
			cb.ErrorCode = n
		}
	}
	cb.MessageSID = one("MessageSid")
	if err := delivery.CheckSID(cb.MessageSID); err != nil {
		bad = append(bad, problem.InvalidParam{Name: "MessageSid", Reason: "must be up to 64 letters and digits"})
		cb.MessageSID = ""
	}
	if to := tasks.NormalizePhone(one("To")); tasks.IsE164(to) {
		cb.To = to // only used to find the recipient's suppression entry
	}
	return cb, bad
}

// twilioSignature is the X-Twilio-Signature of a form POST to fullURL:
// base64 of the HMAC-SHA1, keyed with the auth token, of the URL followed by
// every POST parameter sorted by name, each name followed by its value (a
// repeated name: each distinct value once, in sorted order, as Twilio's
// libraries do).
func twilioSignature(authToken, fullURL string, params url.Values) string {
	names := make([]string, 0, len(params))
	for name := range params {
		names = append(names, name)
	}
	sort.Strings(names)
	m := hmac.New(sha1.New, []byte(authToken))
	io.WriteString(m, fullURL)
	for _, name := range names {
		values := slices.Clone(params[name])
		slices.Sort(values)
		for _, v := range slices.Compact(values) {
			io.WriteString(m, name)
			io.WriteString(m, v)
		}
	}
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// validSignature reports, in constant time per candidate, whether sig
// signs params posted to fullURL. Like Twilio's libraries it also accepts
// the URL with its scheme's default port added or removed: Twilio may sign
// either form.
func validSignature(authToken, fullURL string, params url.Values, sig string) bool {
	ok := false
	for _, u := range portVariants(fullURL) {
		want := twilioSignature(authToken, u, params)
		if subtle.ConstantTimeCompare([]byte(want), []byte(sig)) == 1 {
			ok = true
		}
	}
	return ok
}

// portVariants is fullURL, and fullURL with the default port of its scheme
// added (when it has none) or removed (when it has it).
func portVariants(fullURL string) []string {
	u, err := url.Parse(fullURL)
	if err != nil || u.Host == "" {
		return []string{fullURL}
	}
	def := map[string]string{"https": "443", "http": "80"}[u.Scheme]
	if def == "" {
		return []string{fullURL}
	}
	host := u.Host
	switch u.Port() {
	case "":
		host += ":" + def
	case def:
		host = strings.TrimSuffix(host, ":"+def)
	default:
		return []string{fullURL}
	}
	// Swap the host in the string itself: re-encoding the URL could change
	// other bytes of what was signed.
	prefix := u.Scheme + "://" + u.Host
	if !strings.HasPrefix(fullURL, prefix) {
		return []string{fullURL}
	}
	return []string{fullURL, u.Scheme + "://" + host + fullURL[len(prefix):]}
}

// CallbackSettings reads the provider's settings from environ (nil: the
// process environment) and checks those the callback routes need
// (SLUICE_SMS_AUTH_TOKEN, SLUICE_SMS_STATUS_CALLBACK_URL), for the API
// process, which mounts NewCallbacks at CallbackRoute and NewInbound at
// InboundRoute (app).
func CallbackSettings(environ map[string]string) (Settings, error) {
	return sender.ReadShared[Settings](Provider, environ)
}
