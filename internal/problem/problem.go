// Package problem writes RFC 9457 problem details (application/problem+json):
// the one shape of every error Sluice's HTTP endpoints answer — the API, the
// dashboard's JSON routes, a provider's callback routes.
package problem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// Problem is an RFC 9457 problem detail: every error the API answers is one,
// as application/problem+json.
type Problem struct {
	// Type is a URI naming the kind of problem; see TypeBase.
	Type string `json:"type"`
	// Title is the short, fixed summary of the type.
	Title string `json:"title"`
	// Status repeats the HTTP status code.
	Status int `json:"status"`
	// Detail explains this occurrence.
	Detail string `json:"detail,omitempty"`
	// InvalidParams names each bad field (and, in a batch, its index).
	InvalidParams []InvalidParam `json:"invalid-params,omitempty"`
	// RetryAfter is set on 429: seconds until a request will be taken.
	RetryAfter int `json:"retry_after,omitempty"`
}

// InvalidParam is one bad field of a request.
type InvalidParam struct {
	// Name is the field ("to", "expires_at"), query parameter or header.
	Name string `json:"name"`
	// Reason says what is wrong with it.
	Reason string `json:"reason"`
	// Index is the notification's position in a batch (absent for a single one).
	Index *int `json:"index,omitempty"`
	// Pointer is the JSON Pointer (RFC 6901) of the field in the request
	// body: "/notifications/3/headers/X-Campaign", with "~" and "/" in a
	// name escaped as "~0" and "~1". A field that is missing points at the
	// object that should hold it ("" is the whole body). Absent for query
	// parameters and headers, which are not in the body.
	Pointer string `json:"pointer,omitempty"`
	// inBody: the field is in the body, so Pointer is written even when it
	// is "" (the whole body).
	inBody bool
}

// BodyParam is an InvalidParam about the body member at pointer.
func BodyParam(name, reason, pointer string) InvalidParam {
	return InvalidParam{Name: name, Reason: reason, Pointer: pointer, inBody: true}
}

// MarshalJSON writes the pointer of a body member even when it is "" (the
// whole body), which omitempty would drop.
func (p InvalidParam) MarshalJSON() ([]byte, error) {
	type plain InvalidParam
	out := struct {
		plain
		Pointer *string `json:"pointer,omitempty"`
	}{plain: plain(p)}
	if p.inBody || p.Pointer != "" {
		out.Pointer = &p.Pointer
	}
	return json.Marshal(out)
}

// PointerToken escapes one reference token of a JSON Pointer (RFC 6901
// section 3): "~" as "~0", then "/" as "~1".
func PointerToken(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// TypeBase prefixes every problem type: a URN, since no page is served
// for them; the OpenAPI document lists them.
const TypeBase = "urn:sluice:problem:"

// Titles are the kinds of problems, by the last segment of their type URI.
var Titles = map[string]string{
	"unauthorized":          "Missing or unknown bearer token",
	"forbidden":             "Not allowed for this token",
	"bad-signature":         "Missing, wrong or stale signature",
	"not-found":             "Not found",
	"method-not-allowed":    "Method not allowed",
	"invalid-request":       "The request is malformed",
	"invalid-notification":  "The request holds invalid notifications",
	"invalid-event":         "The request holds consent events that cannot be recorded",
	"duplicate-member":      "A member name appears twice in one JSON object",
	"invalid-text":          "A JSON string is not valid UTF-8 text",
	"connection-limit":      "This address holds its share of connections",
	"unreadable":            "A stored record this version cannot read",
	"unsupported-media":     "Unsupported Content-Type",
	"too-large":             "Request body too large",
	"idempotency-mismatch":  "Idempotency-Key reused with another request",
	"idempotency-in-flight": "A request with this Idempotency-Key is still being processed",
	"rate-limited":          "Too many requests for this token",
	"queue-full":            "The tenant's queued work is at its cap",
	"auth-limited":          "Too many failed authentications from this client",
	"no-rules":              "No quota rules apply",
	"tenant-required":       "An admin token must name the tenant",
	"unavailable":           "Redis cannot be reached; nothing was done",
	"check-unavailable":     "The request could not be checked now; nothing was done",
	"internal":              "Internal error",
}

// Write is the one place that writes an error response. kind is a key of
// Titles.
func Write(w http.ResponseWriter, status int, kind, detail string, params ...InvalidParam) {
	p := Problem{Type: TypeBase + kind, Title: Titles[kind], Status: status, Detail: detail, InvalidParams: params}
	if status == http.StatusTooManyRequests {
		p.RetryAfter, _ = strconv.Atoi(w.Header().Get("Retry-After"))
	}
	body, _ := json.Marshal(p)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// WriteJSON writes a successful response.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	body, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
