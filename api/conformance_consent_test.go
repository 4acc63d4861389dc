package api_test

import (
	"encoding/json"
	"net/url"
	"strings"
	"time"
)

// The consent routes in the conformance run: suppressions read, recorded
// and lifted by number, address or ~subject, and events in bulk, per
// channel; a quarter mutated to break the document (a recipient of the
// other channel's form, one with spaces, an unknown type or field).

// consentOps are the operations of the consent routes, and GET
// /v1/quotas: for them a request the document refuses must be refused
// (the server is as strict as the document).
var strictOps = map[string]bool{"getQuotas": true, "suppression": true, "events": true}

func (c *conformance) consentRequest(req *request, invalid bool) {
	g := c.g
	ch := []string{"sms", "email"}[g.r.IntN(2)]
	recipient := func() string {
		if ch == "sms" {
			return "+1415555" + string(rune('0'+g.r.IntN(10))) + string(rune('0'+g.r.IntN(10))) + "0" + string(rune('0'+g.r.IntN(10)))
		}
		return g.regex(`^[a-z]{1,8}(\.[a-z0-9+_-]{1,6})?@(example|acme)\.(com|org)$`)
	}
	schemas := c.doc.Components.Schemas
	if g.r.IntN(4) == 0 {
		req.op, req.method, req.path = "events", "POST", "/v1/events/"+ch
		item := schemas["SMSEvent"].Value
		if ch == "email" {
			item = schemas["EmailEvent"].Value
		}
		events := make([]any, 1+g.r.IntN(3))
		for i := range events {
			events[i] = g.object(item)
		}
		if invalid {
			e := events[0].(map[string]any)
			req.mutation = c.mutateEvent(e, ch)
		}
		req.body, _ = json.Marshal(map[string]any{"events": events})
		req.header.Set("Content-Type", "application/json")
		return
	}
	req.op = "suppression"
	to := recipient()
	if g.r.IntN(5) == 0 {
		to = "~" + g.regex(`^[A-Za-z0-9_-]{22}$`)
	}
	if invalid && g.r.IntN(2) == 0 {
		to = []string{"nope", "+1 415 555 0100", "4155550100", "a@b", "+14155550100@example.com"}[g.r.IntN(5)]
		if ch == "sms" && g.r.IntN(2) == 0 {
			to = "ann@example.com"
		} else if ch == "email" && g.r.IntN(2) == 0 {
			to = "+14155550100"
		}
		req.mutation = "bad recipient"
	}
	req.path = "/v1/suppressions/" + ch + "/" + url.PathEscape(to)
	req.method = []string{"GET", "POST", "PUT", "DELETE"}[g.r.IntN(4)]
	if req.method == "POST" || req.method == "PUT" {
		e := g.object(schemas["EventInput"].Value)
		if invalid && req.mutation == "" {
			req.mutation = c.mutateEvent(e, ch)
			delete(e, "recipient")
			if req.mutation == "recipient of the other channel" {
				e["colour"], req.mutation = "red", "unknown field"
			}
		}
		req.body, _ = json.Marshal(e)
		req.header.Set("Content-Type", "application/json")
	} else if invalid && req.mutation == "" {
		req.query.Set("colour", "red")
		req.mutation = "unknown parameter"
	}
}

// mutateEvent breaks one event against the document.
func (c *conformance) mutateEvent(e map[string]any, ch string) string {
	switch c.g.r.IntN(4) {
	case 0:
		e["type"] = "maybe"
		return "unknown type"
	case 1:
		e["colour"] = "red"
		return "unknown field"
	case 2:
		e["code"] = -1
		return "negative code"
	}
	e["recipient"] = map[string]string{"sms": "ann@example.com", "email": "+14155550100"}[ch]
	return "recipient of the other channel"
}

// eventRefused reports whether a valid event breaks one of the rules
// EventInput states in words (422 invalid-event), computed here.
func eventRefused(e map[string]any) bool {
	_, scope := e["scope"]
	_, cat := e["category"]
	typ, _ := e["type"].(string)
	if scope && cat {
		return true
	}
	if u, ok := e["until"].(string); ok {
		if t, err := time.Parse(time.RFC3339Nano, u); err == nil && !t.After(time.Now().Add(time.Second)) {
			return true
		}
		if typ == "in" || typ == "resubscribe" {
			return true
		}
	}
	return (typ == "undeliverable" || typ == "bounce") && (scope || cat)
}

// checkEvent422 accepts invalid-event for a valid consent request only when
// an event breaks a stated rule.
func (c *conformance) checkEvent422(req request, fail func(string, ...any)) {
	var one map[string]any
	var many struct {
		Events []map[string]any `json:"events"`
	}
	if req.op == "events" {
		_ = json.Unmarshal(req.body, &many)
	} else if json.Unmarshal(req.body, &one) == nil {
		many.Events = append(many.Events, one)
	}
	for _, e := range many.Events {
		if eventRefused(e) {
			return
		}
	}
	fail("invalid-event for events that break none of the rules EventInput states: %s", strings.TrimSpace(string(req.body)))
}
