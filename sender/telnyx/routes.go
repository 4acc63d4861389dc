package telnyx

import (
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"log/slog"
	"net/http"
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

// The patterns `sluice api` mounts the routes on.
const (
	CallbackRoute = "POST /v1/callbacks/telnyx/{tenant}/{id}"
	InboundRoute  = "POST /v1/inbound/telnyx/{tenant}"
)

// Webhooks are Telnyx's two routes: delivery reports about one SMS
// (CallbackRoute) and messages recipients send to a tenant's numbers
// (InboundRoute).
type Webhooks struct {
	key         ed25519.PublicKey // nil: the routes are off (404)
	ttl         time.Duration     // of delivery records (SLUICE_DEDUPE_TTL)
	suppressFor time.Duration
	codes       map[int]bool
	delivery    *delivery.Store
	consent     *consent.Store
	lim         *throttle.Limiter
	guard       *webhook.Guard
	inbound     *inbound.Handler
	log         *slog.Logger
	now         func() time.Time
	events      *prometheus.CounterVec
	notOwnedLog *webhook.LogEvery
}

// maxWebhookBytes bounds a webhook's body (Telnyx's are a few KiB).
const maxWebhookBytes = 64 << 10

// signed reads a webhook's body and checks its signature; ok is false
// when an answer was written.
func (h *Webhooks) signed(w http.ResponseWriter, r *http.Request, route string) (Event, bool) {
	if h.key == nil {
		problem.Write(w, http.StatusNotFound, "not-found", "Telnyx webhooks are off: set SLUICE_TELNYX_WEBHOOK_URL and SLUICE_TELNYX_PUBLIC_KEY")
		return Event{}, false
	}
	// What the head can refuse is refused before the body is read.
	err := CheckHead(r.Header.Get(SignatureHeader), r.Header.Get(TimestampHeader), h.now())
	var body []byte
	if err == nil {
		var tooBig *http.MaxBytesError
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, maxWebhookBytes))
		switch {
		case errors.As(err, &tooBig):
			problem.Write(w, http.StatusRequestEntityTooLarge, "too-large", "a Telnyx webhook is at most 64 KiB")
			return Event{}, false
		case err != nil:
			problem.Write(w, http.StatusBadRequest, "invalid-request", "the body could not be read in time (SLUICE_API_UNAUTHENTICATED_BODY_TIMEOUT) or in full")
			return Event{}, false
		}
		err = Verify(h.key, r.Header.Get(SignatureHeader), r.Header.Get(TimestampHeader), body, h.now())
	}
	if err != nil {
		reason := "forged"
		switch {
		case errors.Is(err, ErrUnsigned):
			reason = "unsigned"
		case errors.Is(err, ErrStale):
			reason = "stale"
		}
		h.events.WithLabelValues(route, reason).Inc()
		problem.Write(w, http.StatusForbidden, "bad-signature", "nothing was recorded: "+err.Error())
		return Event{}, false
	}
	e, err := ParseEvent(body)
	if err != nil {
		h.events.WithLabelValues(route, "malformed").Inc()
		problem.Write(w, http.StatusBadRequest, "invalid-request", err.Error())
		return Event{}, false
	}
	return e, true
}

// first runs the replay guard on the event id, across every tenant (one
// key signs every tenant's events: an event applied to one tenant and
// replayed to another's route is a duplicate there): false when it was
// seen (answered 200, nothing done) or Redis failed (answered 503).
func (h *Webhooks) first(w http.ResponseWriter, ctx context.Context, route string, e Event) bool {
	ok, err := h.guard.First(ctx, "telnyx", e.ID, 2*Tolerance)
	if err != nil {
		h.unavailable(w, err)
		return false
	}
	if !ok {
		h.events.WithLabelValues(route, "duplicate").Inc()
		problem.WriteJSON(w, http.StatusOK, map[string]bool{"duplicate": true})
	}
	return ok
}

func (h *Webhooks) forget(ctx context.Context, e Event) {
	_ = h.guard.Forget(context.WithoutCancel(ctx), "telnyx", e.ID)
}

// notOwned answers an authentic event that is not this tenant's (403,
// nothing done), logged at most once every 10 s: anyone holding a signed
// event can post it to every tenant's route.
func (h *Webhooks) notOwned(w http.ResponseWriter, route, tenant, why string) {
	h.events.WithLabelValues(route, "not_owned").Inc()
	h.notOwnedLog.Warn(h.log, "telnyx webhook refused: not the tenant's", "route", route, "tenant", tenant, "why", why)
	problem.Write(w, http.StatusForbidden, "forbidden", "nothing was recorded: "+why)
}

func (h *Webhooks) unavailable(w http.ResponseWriter, err error) {
	h.log.Error("telnyx webhook: redis trouble; refused, Telnyx retries", "err", err)
	w.Header().Set("Retry-After", "1")
	problem.Write(w, http.StatusServiceUnavailable, "unavailable", "Redis could not be asked; nothing was done, try again")
}

// Callback is POST /v1/callbacks/telnyx/{tenant}/{id}: a delivery report
// (message.sent, message.finalized) about the SMS the worker sent as id.
// The status is recorded forward only, as Twilio's status callbacks are;
// a final failure whose code is in SLUICE_TELNYX_SUPPRESS_CODES marks the
// number undeliverable for the tenant, when it is the number the SMS went
// to. 404 for a notification Sluice has no record of.
func (h *Webhooks) Callback(w http.ResponseWriter, r *http.Request) {
	e, ok := h.signed(w, r, "callback")
	if !ok {
		return
	}
	tenant, id := r.PathValue("tenant"), r.PathValue("id")
	if tasks.CheckTenant(tenant) != nil || tasks.CheckID(id) != nil {
		problem.Write(w, http.StatusNotFound, "not-found", "no notification with this id for this tenant")
		return
	}
	to, raw := e.Message.Recipient()
	st, known := Status(raw)
	if !known || (e.Type != "message.sent" && e.Type != "message.finalized") {
		h.events.WithLabelValues("callback", "ignored").Inc()
		w.WriteHeader(http.StatusNoContent)
		return
	}
	ctx := r.Context()
	rec, err := h.lim.Record(ctx, tenant, id)
	if err != nil {
		h.unavailable(w, err)
		return
	}
	if rec == nil {
		problem.Write(w, http.StatusNotFound, "not-found", "no notification with this id for this tenant was sent (or its record expired)")
		return
	}
	// The report is the notification's only when it names the number the
	// SMS went to (the worker noted it): one key signs every tenant's
	// reports, and the URL, which names the tenant and id, is not signed.
	if same, _, err := h.delivery.WentTo(ctx, tenant, id, tasks.NormalizePhone(to)); err != nil {
		h.unavailable(w, err)
		return
	} else if !same {
		h.notOwned(w, "callback", tenant, "the report names another recipient than the number this notification went to")
		return
	}
	if !h.first(w, ctx, "callback", e) {
		return
	}
	code := e.Message.ErrorCode()
	applied, prev, err := h.delivery.Update(ctx, tenant, id, delivery.Record{Status: st, ErrorCode: code, MessageSID: messageID(e.Message.ID)}, h.ttl)
	if err != nil {
		h.forget(ctx, e)
		h.unavailable(w, err)
		return
	}
	h.events.WithLabelValues("callback", "recorded").Inc()
	if applied && st.Final() && (prev == nil || !prev.Status.Final()) && st.Outcome() != "delivered" && h.codes[code] {
		h.suppress(ctx, tenant, id, to, code, e.Message.ID)
	}
	w.WriteHeader(http.StatusNoContent)
}

// messageID is a Telnyx message id as a delivery record keeps it ("" if
// it cannot be one).
func messageID(id string) string {
	if delivery.CheckMessageID(id) != nil {
		return ""
	}
	return id
}

// suppress marks to undeliverable for tenant when it is the number the
// SMS id went to (one key signs every tenant's webhooks).
func (h *Webhooks) suppress(ctx context.Context, tenant, id, to string, code int, ref string) {
	log := h.log.With("tenant", tenant, "id", id, "error_code", code)
	to = tasks.NormalizePhone(to)
	same, _, err := h.delivery.WentTo(ctx, tenant, id, to)
	if err != nil || !same || !tasks.IsE164(to) {
		log.Warn("delivery report names another number than the notification's recipient (or it cannot be read); not marking it undeliverable", "err", err)
		return
	}
	e := consent.Event{Action: consent.Undeliverable, Source: consent.SourceProvider, Code: code, Until: time.Now().Add(h.suppressFor)}
	if tasks.CheckID(ref) == nil {
		e.Ref = ref
	}
	if _, err := h.consent.Record(ctx, tenant, tasks.SMS, to, e); err != nil {
		log.Warn("could not mark the recipient undeliverable", "err", err)
		return
	}
	log.Info("recipient marked undeliverable for the tenant", "for", h.suppressFor)
}

// Inbound is POST /v1/inbound/telnyx/{tenant}: a message.received webhook
// (the messaging profile's webhook URL), handed to sender/inbound: STOP
// opts the sender out, START opts back in, HELP gets the help text. Other
// events are answered 200 and change nothing.
func (h *Webhooks) Inbound(w http.ResponseWriter, r *http.Request) {
	e, ok := h.signed(w, r, "inbound")
	if !ok {
		return
	}
	tenant := r.PathValue("tenant")
	if tasks.CheckTenant(tenant) != nil {
		problem.Write(w, http.StatusNotFound, "not-found", "no such tenant")
		return
	}
	if e.Type != "message.received" {
		h.events.WithLabelValues("inbound", "ignored").Inc()
		problem.WriteJSON(w, http.StatusOK, map[string]string{})
		return
	}
	to, _ := e.Message.Recipient()
	m := inbound.Message{Tenant: tenant, From: e.Message.From.PhoneNumber, To: to, Body: e.Message.Text, Profile: e.Message.MessagingProfileID}
	if tasks.CheckID(e.Message.ID) == nil {
		m.Ref = e.Message.ID
	}
	if !tasks.IsE164(tasks.NormalizePhone(m.From)) || len(m.Body) > 1600 || len(m.To) > 64 {
		problem.Write(w, http.StatusBadRequest, "invalid-request", "the message has no E.164 sender, or a body over 1600 bytes")
		return
	}
	ctx := r.Context()
	// Before the replay guard: an event posted to a tenant it is not for
	// must not spend its id, which the tenant it is for may still need.
	if err := h.inbound.Owns(m); err != nil {
		h.notOwned(w, "inbound", tenant, err.Error())
		return
	}
	if !h.first(w, ctx, "inbound", e) {
		return
	}
	out, err := h.inbound.Handle(ctx, m)
	if err != nil {
		h.forget(ctx, e)
		if errors.Is(err, inbound.ErrInvalid) {
			problem.Write(w, http.StatusBadRequest, "invalid-request", err.Error())
			return
		}
		h.unavailable(w, err)
		return
	}
	h.events.WithLabelValues("inbound", out.Intent.String()).Inc()
	problem.WriteJSON(w, http.StatusOK, map[string]string{})
}
