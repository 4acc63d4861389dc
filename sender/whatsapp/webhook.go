package whatsapp

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/internal/problem"
	"github.com/sluicehq/sluice/sender/inbound"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/webhook"
)

// The routes `sluice api` mounts for a tenant's WhatsApp webhook: Meta's
// verification of the URL, and the deliveries (inbound messages and the
// statuses of the messages sent).
const (
	VerifyRoute  = "GET /v1/webhooks/whatsapp/{tenant}"
	WebhookRoute = "POST /v1/webhooks/whatsapp/{tenant}"
	// SignatureHeader carries "sha256=" and the hex HMAC-SHA256 of the raw
	// body under the Meta app's secret.
	SignatureHeader = "X-Hub-Signature-256"
	// ReplayTTL is how long an event's id is remembered: Meta retries an
	// unanswered delivery for up to 7 days; an event older than this is
	// refused as stale, so no replay outlives the guard.
	ReplayTTL = 7 * 24 * time.Hour
	// StopPromotions is the text of the quick-reply button WhatsApp puts on
	// marketing templates for the user to opt out of them.
	StopPromotions = "Stop promotions"
	// maxBody bounds a delivery (Meta batches up to 1,000 events).
	maxBody = 1 << 20
)

// Sign is the X-Hub-Signature-256 value of body under secret.
func Sign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

// VerifySignature checks header against body under secret, in constant time.
func VerifySignature(secret, header string, body []byte) error {
	if header == "" {
		return webhook.ErrUnsigned
	}
	if subtle.ConstantTimeCompare([]byte(Sign(secret, body)), []byte(strings.TrimSpace(header))) != 1 {
		return webhook.ErrForged
	}
	return nil
}

// Payload is a webhook delivery of the "messages" field.
type Payload struct {
	Object string `json:"object"`
	Entry  []struct {
		ID      string `json:"id"`
		Changes []struct {
			Field string `json:"field"`
			Value Value  `json:"value"`
		} `json:"changes"`
	} `json:"entry"`
}

// Value is one change: the messages and statuses of one business number.
type Value struct {
	Metadata struct {
		PhoneNumberID string `json:"phone_number_id"`
	} `json:"metadata"`
	Messages []InMessage   `json:"messages"`
	Statuses []StatusEvent `json:"statuses"`
}

// InMessage is a message a user sent to the business number.
type InMessage struct {
	From      string `json:"from"`
	ID        string `json:"id"`
	Timestamp string `json:"timestamp"`
	Type      string `json:"type"`
	Text      struct {
		Body string `json:"body"`
	} `json:"text"`
	Button struct {
		Payload string `json:"payload"`
		Text    string `json:"text"`
	} `json:"button"`
	Interactive struct {
		ButtonReply struct {
			Title string `json:"title"`
		} `json:"button_reply"`
	} `json:"interactive"`
}

// StatusEvent is the status of a message the business sent.
type StatusEvent struct {
	ID        string `json:"id"`
	Status    string `json:"status"`
	Timestamp string `json:"timestamp"`
	// Opaque is the biz_opaque_callback_data the message was sent with:
	// the notification id (NewMessage).
	Opaque string `json:"biz_opaque_callback_data"`
	Errors []struct {
		Code int `json:"code"`
	} `json:"errors"`
}

// ParsePayload reads a delivery; every error wraps webhook.ErrMalformed.
func ParsePayload(body []byte) (Payload, error) {
	var p Payload
	if err := json.Unmarshal(body, &p); err != nil {
		return p, fmt.Errorf("%w: %v", webhook.ErrMalformed, err)
	}
	if p.Object != "whatsapp_business_account" {
		return p, fmt.Errorf("%w: object %q, want whatsapp_business_account", webhook.ErrMalformed, p.Object)
	}
	return p, nil
}

// numbers are the business numbers a delivery is about.
func (p Payload) numbers() []string {
	var out []string
	for _, e := range p.Entry {
		for _, c := range e.Changes {
			out = append(out, c.Value.Metadata.PhoneNumberID)
		}
	}
	return out
}

// unixTime reads a webhook timestamp (Unix seconds).
func unixTime(s string) (time.Time, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || len(s) > 12 {
		return time.Time{}, false
	}
	return time.Unix(n, 0), true
}

// CredentialsChecker is the WhatsApp entry of `sluice webhook set`: it
// checks a tenant's credentials (the app secret as Key, the phone-number
// ids it owns, the verify token). Its deliveries are served by Webhooks,
// not by webhook.Handler.
type CredentialsChecker struct{}

var _ webhook.Provider = CredentialsChecker{}

// Name is the route's segment.
func (CredentialsChecker) Name() string { return "whatsapp" }

// Check reports why c cannot verify a tenant's WhatsApp deliveries.
func (CredentialsChecker) Check(c webhook.Credentials) error {
	if len(c.Key) < 16 || len(c.Key) > 256 {
		return fmt.Errorf("%w: whatsapp needs the Meta app's secret as its key (16–256 characters)", webhook.ErrCredentials)
	}
	if len(c.PhoneNumberIDs) == 0 || len(c.PhoneNumberIDs) > 64 {
		return fmt.Errorf("%w: whatsapp needs the tenant's phone-number ids (1–64): webhooks about other numbers are refused", webhook.ErrCredentials)
	}
	for _, id := range c.PhoneNumberIDs {
		if id == "" || len(id) > 32 || strings.Trim(id, "0123456789") != "" {
			return fmt.Errorf("%w: phone-number id %q is not digits", webhook.ErrCredentials, id)
		}
	}
	if len(c.VerifyToken) > 256 || c.User != "" || c.Password != "" || len(c.Topics) > 0 || len(c.AllowIPs) > 0 {
		return fmt.Errorf("%w: whatsapp takes a key, phone-number ids and a verify token (up to 256 characters) only", webhook.ErrCredentials)
	}
	return nil
}

// Verify is not used: Webhooks serves WhatsApp's deliveries.
func (CredentialsChecker) Verify(context.Context, webhook.Inbound) (webhook.Batch, error) {
	return webhook.Batch{}, fmt.Errorf("%w: WhatsApp deliveries are served by sender/whatsapp", webhook.ErrMalformed)
}

// Deps are what the webhook routes work with, from the API process.
type Deps struct {
	Creds    *webhook.Store
	Guard    *webhook.Guard
	Consent  *consent.Store
	Inbound  *inbound.Handler
	Delivery *delivery.Store
	Limiter  *throttle.Limiter
	Log      *slog.Logger
	Registry prometheus.Registerer
	// RecordTTL is how long a status is kept (SLUICE_DEDUPE_TTL).
	RecordTTL time.Duration
	Now       func() time.Time
	// OnFailed, when set, runs for a notification whose message failed
	// (its fallback goes now, if it has one).
	OnFailed func(ctx context.Context, tenant, id string)
}

// Webhooks serves VerifyRoute and WebhookRoute.
type Webhooks struct {
	d      Deps
	events *prometheus.CounterVec
}

// NewWebhooks builds the routes' handlers.
func NewWebhooks(d Deps) (*Webhooks, error) {
	if d.Now == nil {
		d.Now = time.Now
	}
	h := &Webhooks{d: d, events: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_whatsapp_webhooks_total",
		Help: "WhatsApp webhook events by kind (delivery, message, status) and outcome: recorded, duplicate, stale, ignored, unsigned, forged, not_allowed, malformed, or an inbound message's intent.",
	}, []string{"kind", "outcome"})}
	if err := d.Registry.Register(h.events); err != nil {
		return nil, err
	}
	return h, nil
}

// credentials reads the tenant's; false when an answer was written.
func (h *Webhooks) credentials(w http.ResponseWriter, r *http.Request) (string, webhook.Credentials, bool) {
	tenant := r.PathValue("tenant")
	if tasks.CheckTenant(tenant) != nil {
		problem.Write(w, http.StatusNotFound, "not-found", "no such tenant")
		return "", webhook.Credentials{}, false
	}
	c, err := h.d.Creds.Get(r.Context(), tenant, "whatsapp")
	if errors.Is(err, webhook.ErrNotConfigured) {
		problem.Write(w, http.StatusNotFound, "not-found", "the tenant has no WhatsApp webhook (sluice webhook set TENANT whatsapp)")
		return "", c, false
	}
	if err != nil {
		h.unavailable(w, err)
		return "", c, false
	}
	return tenant, c, true
}

// Verify is VerifyRoute: Meta's check of the URL (hub.mode=subscribe, the
// tenant's verify token): answered with hub.challenge.
func (h *Webhooks) Verify(w http.ResponseWriter, r *http.Request) {
	_, c, ok := h.credentials(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	token, challenge := q.Get("hub.verify_token"), q.Get("hub.challenge")
	if q.Get("hub.mode") != "subscribe" || c.VerifyToken == "" || subtle.ConstantTimeCompare([]byte(token), []byte(c.VerifyToken)) != 1 {
		problem.Write(w, http.StatusForbidden, "bad-signature", "the verify token does not match the tenant's")
		return
	}
	if challenge == "" || len(challenge) > 128 || strings.Trim(challenge, "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_-") != "" {
		problem.Write(w, http.StatusBadRequest, "invalid-request", "hub.challenge must be up to 128 letters and digits")
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, challenge)
}

// ServeHTTP is WebhookRoute: a signed delivery about the tenant's numbers.
// Nothing is recorded from a delivery that is unsigned, forged, malformed
// or about a number the tenant does not own. Each event is taken once
// (its id, ReplayTTL); an event older than ReplayTTL is left out.
func (h *Webhooks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant, c, ok := h.credentials(w, r)
	if !ok {
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		problem.Write(w, http.StatusRequestEntityTooLarge, "too-large", "a WhatsApp webhook delivery is at most 1 MiB")
		return
	}
	if err := VerifySignature(c.Key, r.Header.Get(SignatureHeader), body); err != nil {
		reason := "forged"
		if errors.Is(err, webhook.ErrUnsigned) {
			reason = "unsigned"
		}
		h.events.WithLabelValues("delivery", reason).Inc()
		problem.Write(w, http.StatusForbidden, "bad-signature", "nothing was recorded: "+err.Error())
		return
	}
	p, err := ParsePayload(body)
	if err != nil {
		h.events.WithLabelValues("delivery", "malformed").Inc()
		problem.Write(w, http.StatusBadRequest, "invalid-request", err.Error())
		return
	}
	for _, id := range p.numbers() {
		if !slices.Contains(c.PhoneNumberIDs, id) {
			h.events.WithLabelValues("delivery", "not_allowed").Inc()
			problem.Write(w, http.StatusForbidden, "not-allowed", "nothing was recorded: the delivery is about a business number this tenant does not own")
			return
		}
	}
	taken, seen, err := h.apply(r.Context(), tenant, p)
	if err != nil {
		h.unavailable(w, err)
		return
	}
	if taken == 0 && seen > 0 {
		problem.WriteJSON(w, http.StatusOK, map[string]bool{"duplicate": true})
		return
	}
	problem.WriteJSON(w, http.StatusOK, map[string]int{"recorded": taken})
}

// apply takes every event of p once: the messages (the service window,
// then consent), the statuses (the delivery record). It returns how many
// it took and how many it had seen before.
func (h *Webhooks) apply(ctx context.Context, tenant string, p Payload) (taken, seen int, err error) {
	for _, e := range p.Entry {
		for _, c := range e.Changes {
			if c.Field != "messages" {
				continue
			}
			to := c.Value.Metadata.PhoneNumberID
			for _, m := range c.Value.Messages {
				t, s, err := h.message(ctx, tenant, to, m)
				if err != nil {
					return taken, seen, err
				}
				taken, seen = taken+t, seen+s
			}
			for _, st := range c.Value.Statuses {
				t, s, err := h.status(ctx, tenant, st)
				if err != nil {
					return taken, seen, err
				}
				taken, seen = taken+t, seen+s
			}
		}
	}
	return taken, seen, nil
}

// first runs the replay guard on an event: (taken, seen) as 1/0 counts;
// an event without a usable time or older than ReplayTTL is neither.
func (h *Webhooks) first(ctx context.Context, tenant, kind, id, ts string) (bool, int, error) {
	at, ok := unixTime(ts)
	if !ok || id == "" || len(id) > 256 {
		h.events.WithLabelValues(kind, "malformed").Inc()
		return false, 0, nil
	}
	if h.d.Now().Sub(at) > ReplayTTL {
		h.events.WithLabelValues(kind, "stale").Inc()
		return false, 0, nil
	}
	ok, err := h.d.Guard.First(ctx, "whatsapp", kind+":"+id, ReplayTTL)
	if err != nil {
		return false, 0, err
	}
	if !ok {
		h.events.WithLabelValues(kind, "duplicate").Inc()
		return false, 1, nil
	}
	return true, 0, nil
}

// message records an inbound message: the sender's customer-service
// window, then its consent meaning (STOP and the other keywords, "Stop
// promotions").
func (h *Webhooks) message(ctx context.Context, tenant, number string, m InMessage) (int, int, error) {
	ok, seen, err := h.first(ctx, tenant, "message", m.ID, m.Timestamp)
	if !ok {
		return 0, seen, err
	}
	from := "+" + strings.TrimPrefix(m.From, "+")
	if !tasks.IsE164(from) {
		h.events.WithLabelValues("message", "malformed").Inc()
		return 0, 0, nil
	}
	at, _ := unixTime(m.Timestamp)
	if err := h.d.Consent.RecordInbound(ctx, tenant, tasks.WhatsApp, from, at); err != nil {
		_ = h.d.Guard.Forget(context.WithoutCancel(ctx), "whatsapp", "message:"+m.ID)
		return 0, 0, err
	}
	in := inbound.Message{Tenant: tenant, Channel: tasks.WhatsApp, From: from, To: number, Ref: webhook.Ref("wa", m.ID)}
	switch m.Type {
	case "text":
		in.Body = m.Text.Body
	case "button":
		in.Body = m.Button.Text
		in.StopPromotions = strings.EqualFold(strings.TrimSpace(m.Button.Text), StopPromotions) ||
			strings.EqualFold(strings.TrimSpace(m.Button.Payload), StopPromotions)
	case "interactive":
		in.Body = m.Interactive.ButtonReply.Title
	}
	if len(in.Body) > 4096 {
		in.Body = in.Body[:4096]
	}
	out, err := h.d.Inbound.Handle(ctx, in)
	if err != nil {
		_ = h.d.Guard.Forget(context.WithoutCancel(ctx), "whatsapp", "message:"+m.ID)
		return 0, 0, err
	}
	h.events.WithLabelValues("message", out.Intent.String()).Inc()
	return 1, 0, nil
}

// statuses maps Meta's message statuses to delivery's.
var statuses = map[string]delivery.Status{"sent": delivery.Sent, "delivered": delivery.Delivered, "read": delivery.Read, "failed": delivery.Failed}

// status records a sent message's status on its notification (the
// biz_opaque_callback_data it was sent with), forward only.
func (h *Webhooks) status(ctx context.Context, tenant string, st StatusEvent) (int, int, error) {
	s, known := statuses[st.Status]
	if !known || tasks.CheckID(st.Opaque) != nil {
		h.events.WithLabelValues("status", "ignored").Inc()
		return 0, 0, nil
	}
	rec, err := h.d.Limiter.Record(ctx, tenant, st.Opaque)
	if err != nil {
		return 0, 0, err
	}
	if rec == nil { // not a notification of this tenant that was sent
		h.events.WithLabelValues("status", "ignored").Inc()
		return 0, 0, nil
	}
	ok, seen, err := h.first(ctx, tenant, "status", st.ID+":"+st.Status, st.Timestamp)
	if !ok {
		return 0, seen, err
	}
	r := delivery.Record{Status: s}
	if len(st.Errors) > 0 {
		r.ErrorCode = st.Errors[0].Code
	}
	applied, _, err := h.d.Delivery.Update(ctx, tenant, st.Opaque, r, h.d.RecordTTL)
	if err != nil {
		_ = h.d.Guard.Forget(context.WithoutCancel(ctx), "whatsapp", "status:"+st.ID+":"+st.Status)
		return 0, 0, err
	}
	if applied && s == delivery.Failed && h.d.OnFailed != nil {
		h.d.OnFailed(ctx, tenant, st.Opaque)
	}
	h.events.WithLabelValues("status", "recorded").Inc()
	return 1, 0, nil
}

func (h *Webhooks) unavailable(w http.ResponseWriter, err error) {
	h.d.Log.Error("whatsapp webhook: redis trouble; refused, Meta retries", "err", err)
	w.Header().Set("Retry-After", "1")
	problem.Write(w, http.StatusServiceUnavailable, "unavailable", "Redis could not be asked; nothing more was done, try again")
}
