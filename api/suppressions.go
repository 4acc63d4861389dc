package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/tasks"
)

// MaxEvents bounds the events of one POST /v1/events/{channel}.
const MaxEvents = 1000

// markJSON is a suppression mark as the API writes it.
type markJSON struct {
	At     time.Time  `json:"at"`
	Until  *time.Time `json:"until,omitempty"`
	Source string     `json:"source"`
	Code   int        `json:"code,omitempty"`
}

func markOf(m *consent.Mark) *markJSON {
	if m == nil {
		return nil
	}
	j := &markJSON{At: m.At, Source: string(m.Source), Code: m.Code}
	if !m.Until.IsZero() {
		u := m.Until
		j.Until = &u
	}
	return j
}

// eventJSON is a ledger event as the API writes it.
type eventJSON struct {
	At      time.Time  `json:"at"`
	Action  string     `json:"action"`
	Source  string     `json:"source"`
	Scope   string     `json:"scope"`
	Until   *time.Time `json:"until,omitempty"`
	Code    int        `json:"code,omitempty"`
	Ref     string     `json:"ref,omitempty"`
	Keyword string     `json:"keyword,omitempty"`
}

func eventOf(e consent.Event) eventJSON {
	j := eventJSON{At: e.At, Action: string(e.Action), Source: string(e.Source), Scope: e.Scope.String(), Code: e.Code, Ref: e.Ref, Keyword: e.Keyword}
	if !e.Until.IsZero() {
		u := e.Until
		j.Until = &u
	}
	return j
}

// suppressionJSON is GET /v1/suppressions/{channel}/{recipient}'s answer:
// the recipient's suppressions now and its ledger. The recipient is
// masked: the caller knows it, and answers end up in logs.
type suppressionJSON struct {
	Tenant        string               `json:"tenant"`
	Channel       tasks.Channel        `json:"channel"`
	Recipient     string               `json:"recipient"`
	Subject       string               `json:"subject"`
	Suppressed    bool                 `json:"suppressed"`
	Undeliverable *markJSON            `json:"undeliverable,omitempty"`
	OptedOutAll   *markJSON            `json:"opted_out_all,omitempty"`
	OptedOut      map[string]*markJSON `json:"opted_out"`
	OptedIn       map[string]*markJSON `json:"opted_in"`
	Ledger        []eventJSON          `json:"ledger"`
}

// target is the recipient of a /v1/suppressions/{channel}/{recipient}
// request: by address or number, or by its keyed hash ("~" + the subject
// an earlier answer gave), so that no recipient need be in a URL.
type target struct {
	tenant  string
	ch      tasks.Channel
	to      string // "" when known by subject only
	subject string
}

func (tg target) masked() string {
	if tg.to == "" {
		return "~" + tg.subject
	}
	return tasks.Mask(tg.to)
}

func (s *Server) state(r *http.Request, tg target) (consent.State, error) {
	if tg.to == "" {
		return s.deps.Consent.StateHashed(r.Context(), tg.tenant, tg.ch, tg.subject)
	}
	return s.deps.Consent.State(r.Context(), tg.tenant, tg.ch, tg.to)
}

func (s *Server) ledgerOf(r *http.Request, tg target) ([]consent.Event, error) {
	if tg.to == "" {
		return s.deps.Consent.LedgerHashed(r.Context(), tg.tenant, tg.ch, tg.subject)
	}
	return s.deps.Consent.Ledger(r.Context(), tg.tenant, tg.ch, tg.to)
}

func (s *Server) record(r *http.Request, tg target, e consent.Event) (consent.Event, error) {
	if tg.to == "" {
		return s.deps.Consent.RecordHashed(r.Context(), tg.tenant, tg.ch, tg.subject, e)
	}
	return s.deps.Consent.Record(r.Context(), tg.tenant, tg.ch, tg.to, e)
}

// suppressionTarget reads the tenant, channel and recipient of a
// /v1/suppressions/{channel}/{recipient} request.
func (s *Server) suppressionTarget(w http.ResponseWriter, r *http.Request) (target, bool) {
	tenant, ok := s.tenantOf(w, r, identityOf(r))
	if !ok {
		return target{}, false
	}
	ch, ok := channelOf(w, r)
	if !ok {
		return target{}, false
	}
	for name := range r.URL.Query() {
		if name != "tenant" {
			writeProblem(w, http.StatusBadRequest, "invalid-request", "bad query parameters", InvalidParam{Name: name, Reason: "is not a parameter here (tenant)"})
			return target{}, false
		}
	}
	tg := target{tenant: tenant, ch: ch}
	if p := r.PathValue("recipient"); strings.HasPrefix(p, "~") {
		if tg.subject = p[1:]; !consent.ValidSubject(tg.subject) {
			writeProblem(w, http.StatusBadRequest, "invalid-request", "bad recipient", InvalidParam{Name: "recipient", Reason: "~ is followed by the 22-character subject an answer gave"})
			return target{}, false
		}
		return tg, true
	}
	tg.to = r.PathValue("recipient")
	if !consentRecipient(ch, tg.to) {
		writeProblem(w, http.StatusBadRequest, "invalid-request", "bad recipient", InvalidParam{Name: "recipient", Reason: recipientReason(ch)})
		return target{}, false
	}
	sub, err := s.deps.Consent.Subject(tenant, ch, tg.to)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "invalid-request", "bad recipient", InvalidParam{Name: "recipient", Reason: recipientReason(ch)})
		return target{}, false
	}
	tg.subject = sub
	return tg, true
}

func channelOf(w http.ResponseWriter, r *http.Request) (tasks.Channel, bool) {
	ch := tasks.Channel(r.PathValue("channel"))
	if ch != tasks.Email && ch != tasks.SMS && ch != tasks.WhatsApp {
		writeProblem(w, http.StatusNotFound, "not-found", "no such channel: email, sms or whatsapp")
		return "", false
	}
	return ch, true
}

func recipientReason(ch tasks.Channel) string {
	if ch == tasks.SMS || ch == tasks.WhatsApp {
		return "must be an E.164 number, + and 7 to 15 digits with no spaces (+14155550100; in a path, '+' as is or %2B)"
	}
	return "must be a bare email address (name@example.com)"
}

// getSuppression is GET /v1/suppressions/{channel}/{recipient}.
func (s *Server) getSuppression(w http.ResponseWriter, r *http.Request) {
	tg, ok := s.suppressionTarget(w, r)
	if !ok {
		return
	}
	s.writeSuppression(w, r, http.StatusOK, tg)
}

func (s *Server) writeSuppression(w http.ResponseWriter, r *http.Request, status int, tg target) {
	st, err := s.state(r, tg)
	if err != nil && !errors.Is(err, consent.ErrUnreadable) {
		s.unavailable(w, r, err)
		return
	}
	unreadable := err != nil
	ledger, err := s.ledgerOf(r, tg)
	if err != nil && !errors.Is(err, consent.ErrUnreadable) {
		s.unavailable(w, r, err)
		return
	}
	if unreadable {
		writeProblem(w, http.StatusInternalServerError, "unreadable", "the recipient's suppressions cannot be read by this version; its sends are blocked (fail closed)")
		return
	}
	out := suppressionJSON{Tenant: tg.tenant, Channel: tg.ch, Recipient: tg.masked(), Subject: tg.subject, Suppressed: !st.Empty(),
		Undeliverable: markOf(st.Undeliverable), OptedOutAll: markOf(st.All),
		OptedOut: map[string]*markJSON{}, OptedIn: map[string]*markJSON{}, Ledger: []eventJSON{}}
	for c, m := range st.OptedOut {
		out.OptedOut[c] = markOf(&m)
	}
	for c, m := range st.OptedIn {
		out.OptedIn[c] = markOf(&m)
	}
	for _, e := range ledger {
		out.Ledger = append(out.Ledger, eventOf(e))
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, status, out)
}

// eventInput is one event of POST /v1/suppressions/{channel}/{recipient}
// (without recipient) or of POST /v1/events/{channel}.
type eventInput struct {
	Recipient string `json:"recipient,omitempty"`
	// Type is what happened: out, in, undeliverable (POST
	// /v1/suppressions), or a provider's word: bounce, complaint,
	// unsubscribe, resubscribe.
	Type     string     `json:"type"`
	Scope    string     `json:"scope,omitempty"`
	Category string     `json:"category,omitempty"`
	Until    *time.Time `json:"until,omitempty"`
	Code     int        `json:"code,omitempty"`
	Ref      string     `json:"ref,omitempty"`
}

// event turns an input into the event to record (consent.Report's
// mapping, shared with the providers' webhooks); undeliverableFor is the
// channel's suppression TTL (the default Until of a bounce). Errors name
// the field, for InvalidParam.
func (in eventInput) event(undeliverableFor time.Duration, now time.Time) (consent.Event, string, error) {
	return consent.Report{Type: in.Type, Scope: in.Scope, Category: in.Category, Until: in.Until, Code: in.Code, Ref: in.Ref}.Event(undeliverableFor, now)
}

// decodeJSON reads a JSON body into v, refusing unknown fields and
// trailing data.
func (s *Server) decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeProblem(w, http.StatusUnsupportedMediaType, "unsupported-media", "send Content-Type: application/json")
		return false
	}
	body, ok := s.readBody(w, r)
	if !ok {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeProblem(w, http.StatusBadRequest, "invalid-request", "the body is not the JSON expected: "+err.Error())
		return false
	}
	if dec.More() {
		writeProblem(w, http.StatusBadRequest, "invalid-request", "the body holds more than one JSON value")
		return false
	}
	return !refuseAmbiguous(w, body)
}

func (s *Server) suppressFor(ch tasks.Channel) time.Duration {
	if ch == tasks.Email {
		return s.cfg.EmailSuppressTTL
	}
	return s.cfg.SMSSuppressTTL
}

// postSuppression is POST /v1/suppressions/{channel}/{recipient}: records
// one event (source api) and answers the recipient's suppressions as they
// now stand.
func (s *Server) postSuppression(w http.ResponseWriter, r *http.Request) {
	tg, ok := s.suppressionTarget(w, r)
	if !ok {
		return
	}
	var in eventInput
	if !s.decodeJSON(w, r, &in) {
		return
	}
	if in.Recipient != "" {
		writeProblem(w, http.StatusUnprocessableEntity, "invalid-event", "the recipient is the path's", bodyParam("recipient", "is not a field here: the path names the recipient", "/recipient"))
		return
	}
	e, field, err := in.event(s.suppressFor(tg.ch), time.Now())
	if err != nil {
		writeProblem(w, http.StatusUnprocessableEntity, "invalid-event", "the event cannot be recorded", bodyParam(field, err.Error(), "/"+field))
		return
	}
	if _, err := s.record(r, tg, e); err != nil {
		s.unavailable(w, r, err)
		return
	}
	s.log.Info("suppression recorded", "tenant", tg.tenant, "channel", tg.ch, "action", e.Action, "source", e.Source, "scope", e.Scope.String())
	s.writeSuppression(w, r, http.StatusOK, tg)
}

// deleteSuppression is DELETE /v1/suppressions/{channel}/{recipient}: an
// opt-in of every category (source api), which lifts every mark,
// undeliverable included; the ledger keeps what was.
func (s *Server) deleteSuppression(w http.ResponseWriter, r *http.Request) {
	tg, ok := s.suppressionTarget(w, r)
	if !ok {
		return
	}
	e := consent.Event{Action: consent.OptIn, Source: consent.SourceAPI, Scope: consent.AllCategories()}
	if _, err := s.record(r, tg, e); err != nil {
		s.unavailable(w, r, err)
		return
	}
	s.log.Info("suppressions lifted", "tenant", tg.tenant, "channel", tg.ch)
	s.writeSuppression(w, r, http.StatusOK, tg)
}

// postEvents is POST /v1/events/{channel}: {"events": [...]}, up to
// MaxEvents, each with its recipient — a provider's bounce, complaint and
// unsubscribe webhooks mapped onto it, or a bulk import of another
// system's suppression list. Every event is checked before any is
// recorded; a bad one refuses the request (422, each bad field by its
// pointer). Events are recorded in order; on Redis trouble the answer
// (503) says how many were, so a retry can send the rest.
func (s *Server) postEvents(w http.ResponseWriter, r *http.Request) {
	tenant, ok := s.tenantOf(w, r, identityOf(r))
	if !ok {
		return
	}
	ch, ok := channelOf(w, r)
	if !ok {
		return
	}
	var body struct {
		Events []eventInput `json:"events"`
	}
	if !s.decodeJSON(w, r, &body) {
		return
	}
	if len(body.Events) == 0 || len(body.Events) > MaxEvents {
		writeProblem(w, http.StatusUnprocessableEntity, "invalid-event", "the events cannot be recorded",
			bodyParam("events", fmt.Sprintf("must hold 1 to %d events, not %d", MaxEvents, len(body.Events)), "/events"))
		return
	}
	now := time.Now()
	events := make([]consent.Event, len(body.Events))
	var bad []InvalidParam
	for i, in := range body.Events {
		at := "/events/" + strconv.Itoa(i)
		if !consentRecipient(ch, in.Recipient) {
			bad = append(bad, bodyParam(fmt.Sprintf("events[%d].recipient", i), recipientReason(ch), at+"/recipient"))
			continue
		}
		e, field, err := in.event(s.suppressFor(ch), now)
		if err != nil {
			bad = append(bad, bodyParam(fmt.Sprintf("events[%d].%s", i, field), err.Error(), at+"/"+field))
			continue
		}
		events[i] = e
	}
	if len(bad) > 0 {
		writeProblem(w, http.StatusUnprocessableEntity, "invalid-event", "the events cannot be recorded; none was", bad...)
		return
	}
	for i, e := range events {
		if _, err := s.deps.Consent.Record(r.Context(), tenant, ch, body.Events[i].Recipient, e); err != nil {
			s.log.Error("events: redis trouble", "recorded", i, "of", len(events), "err", err)
			w.Header().Set("Retry-After", "1")
			writeProblem(w, http.StatusServiceUnavailable, "unavailable",
				fmt.Sprintf("Redis could not be asked: the first %d of %d events were recorded, in order; send the rest again", i, len(events)))
			return
		}
	}
	s.log.Info("events recorded", "tenant", tenant, "channel", ch, "events", len(events))
	writeJSON(w, http.StatusOK, map[string]int{"recorded": len(events)})
}
