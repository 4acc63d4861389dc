package twilio

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/internal/problem"
	"github.com/sluicehq/sluice/sender/inbound"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/webhook"
)

// InboundRoute is the pattern `sluice api` mounts Inbound on: the URL to
// give the provider as the number's (or Messaging Service's) incoming
// message webhook, per tenant: SLUICE_SMS_STATUS_CALLBACK_URL +
// /v1/inbound/sms/TENANT.
const InboundRoute = "POST /v1/inbound/sms/{tenant}"

// emptyTwiML answers an incoming message without a reply of the
// provider's own (Sluice's replies go through its queues).
const emptyTwiML = `<?xml version="1.0" encoding="UTF-8"?><Response></Response>`

// Inbound is the provider's incoming-message webhook: each SMS a
// recipient sends to a tenant's number, authenticated by its
// X-Twilio-Signature like the status callbacks, handed to sender/inbound.
type Inbound struct {
	authToken, baseURL string
	handler            *inbound.Handler
	guard              *webhook.Guard
	log                *slog.Logger
	received           *prometheus.CounterVec
	badSigLog          *webhook.LogEvery // anyone can send bad signatures: one WARN per 10 s
}

// InboundReplayTTL is how long a message's MessageSid is remembered: the
// provider's signature has no timestamp, so a captured webhook (a START
// after a STOP) could otherwise be replayed at any time later.
const InboundReplayTTL = 30 * 24 * time.Hour

// NewInbound returns the route's handler, its replay guard on guard;
// sluice_inbound_sms_total is registered on reg.
func NewInbound(s Settings, h *inbound.Handler, guard *webhook.Guard, log *slog.Logger, reg prometheus.Registerer) (*Inbound, error) {
	in := &Inbound{authToken: s.AuthToken, baseURL: s.StatusCallbackURL, handler: h, guard: guard, log: log, badSigLog: webhook.NewLogEvery(10 * time.Second),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_inbound_sms_total",
			Help: "SMS recipients sent to tenants' numbers, by what they were read as (opt_out, opt_in, help, review, none), and refused webhooks (bad_signature; not_owned: sent to a number or Messaging Service the tenant does not own; duplicate: a MessageSid seen before).",
		}, []string{"intent"})}
	if err := reg.Register(in.received); err != nil {
		return nil, err
	}
	return in, nil
}

// inboundMessage is what Sluice takes from an incoming-message webhook.
type inboundMessage struct {
	From, To, Body, MessageSID, ServiceSID string
}

// parseInbound reads an incoming-message webhook's form: From (required,
// E.164), To, Body and MessageSid; other fields are ignored. It returns
// every bad field.
func parseInbound(form url.Values) (inboundMessage, []problem.InvalidParam) {
	var m inboundMessage
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
	m.From = tasks.NormalizePhone(one("From"))
	if !tasks.IsE164(m.From) {
		bad = append(bad, problem.InvalidParam{Name: "From", Reason: "is required: the sender's E.164 number"})
	}
	m.To = one("To")
	if len(m.To) > 64 {
		bad = append(bad, problem.InvalidParam{Name: "To", Reason: "is over 64 bytes"})
	}
	m.Body = one("Body")
	if len(m.Body) > 1600 { // ten segments: the most an SMS can be
		bad = append(bad, problem.InvalidParam{Name: "Body", Reason: "is over 1600 bytes"})
	}
	m.MessageSID = one("MessageSid")
	if err := delivery.CheckSID(m.MessageSID); err != nil {
		bad = append(bad, problem.InvalidParam{Name: "MessageSid", Reason: "must be up to 64 letters and digits"})
	}
	m.ServiceSID = one("MessagingServiceSid")
	if err := delivery.CheckSID(m.ServiceSID); err != nil {
		bad = append(bad, problem.InvalidParam{Name: "MessagingServiceSid", Reason: "must be up to 64 letters and digits"})
	}
	return m, bad
}

// ServeHTTP is POST /v1/inbound/sms/{tenant}: a missing or wrong signature
// is refused (403) before anything is read into the store; a message that
// is no keyword is answered 200 and changes nothing. The answer is empty
// TwiML: the provider sends no reply of its own.
func (in *Inbound) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if in.baseURL == "" || in.authToken == "" {
		problem.Write(w, http.StatusNotFound, "not-found", "inbound SMS is off: set SLUICE_SMS_STATUS_CALLBACK_URL (the API's base URL the provider calls) and SLUICE_SMS_AUTH_TOKEN")
		return
	}
	params, ok := readSignedForm(w, r, in.authToken, in.baseURL, "an incoming-message webhook", func() {
		in.received.WithLabelValues("bad_signature").Inc()
		in.badSigLog.Warn(in.log, "inbound SMS refused: its signature does not match", "route", r.Pattern)
	})
	if !ok {
		return
	}
	m, bad := parseInbound(params)
	if len(bad) > 0 {
		problem.Write(w, http.StatusBadRequest, "invalid-request", "the incoming message is not one Sluice can read", bad...)
		return
	}
	tenant := r.PathValue("tenant")
	if tasks.CheckTenant(tenant) != nil {
		problem.Write(w, http.StatusNotFound, "not-found", "no such tenant")
		return
	}
	msg := inbound.Message{Tenant: tenant, From: m.From, To: m.To, Body: m.Body, Ref: m.MessageSID, Profile: m.ServiceSID}
	// The signature covers the URL, which names the tenant; the number (or
	// Messaging Service) must be the tenant's too, checked before the
	// replay guard spends the MessageSid.
	if err := in.handler.Owns(msg); err != nil {
		in.received.WithLabelValues("not_owned").Inc()
		in.badSigLog.Warn(in.log, "inbound SMS refused: not sent to one of the tenant's numbers", "tenant", tenant, "why", err.Error())
		problem.Write(w, http.StatusForbidden, "forbidden", "nothing was recorded: "+err.Error())
		return
	}
	if m.MessageSID != "" {
		first, err := in.guard.First(r.Context(), "twilio", m.MessageSID, InboundReplayTTL)
		if err != nil {
			in.log.Error("inbound SMS not recorded: redis trouble; the provider retries", "err", err)
			w.Header().Set("Retry-After", "1")
			problem.Write(w, http.StatusServiceUnavailable, "unavailable", "Redis could not be asked; nothing was recorded, try again")
			return
		}
		if !first {
			in.received.WithLabelValues("duplicate").Inc()
			w.Header().Set("Content-Type", "text/xml; charset=utf-8")
			io.WriteString(w, emptyTwiML)
			return
		}
	}
	out, err := in.handler.Handle(r.Context(), msg)
	if err != nil {
		if m.MessageSID != "" {
			_ = in.guard.Forget(context.WithoutCancel(r.Context()), "twilio", m.MessageSID)
		}
		if errors.Is(err, inbound.ErrInvalid) {
			problem.Write(w, http.StatusBadRequest, "invalid-request", err.Error())
			return
		}
		in.log.Error("inbound SMS not recorded: redis trouble; the provider retries", "err", err)
		w.Header().Set("Retry-After", "1")
		problem.Write(w, http.StatusServiceUnavailable, "unavailable", "Redis could not be asked; nothing was recorded, try again")
		return
	}
	in.received.WithLabelValues(intentLabel(out)).Inc()
	w.Header().Set("Content-Type", "text/xml; charset=utf-8")
	io.WriteString(w, emptyTwiML)
}

func intentLabel(out inbound.Outcome) string {
	return strings.ReplaceAll(out.Intent.String(), "-", "_")
}
