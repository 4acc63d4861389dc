package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/tasks"
)

// MaxTTL bounds the ttl field.
const MaxTTL = 400 * 24 * time.Hour

// MinExpiry is how far ahead expires_at (or ttl) must be: a notification
// must still be unexpired when it is enqueued.
const MinExpiry = time.Second

// decoded is one notification of a request as the API read it.
type decoded struct {
	N   tasks.Notification
	Bad []InvalidParam // every bad field; Pointer relative to the notification ("/to")
	// keys maps each field's JSON name (lowercase) to the member name the
	// body used for it: encoding/json matches names case-insensitively, so
	// {"To": …} sets "to", and a pointer must name "/To".
	keys map[string]string
	// expiryField is the member that set ExpiresAt ("ttl" or "expires_at"), or "".
	expiryField string
}

// pointer is the JSON Pointer, relative to the notification, of field (a
// payload's JSON name) and, for an object field, of its entry key: the
// member as the body spelled it, or "" (the notification itself) for a
// field the body does not have.
func (d *decoded) pointer(field, key string) string {
	k, ok := d.keys[strings.ToLower(field)]
	if !ok {
		return ""
	}
	p := "/" + pointerToken(k)
	if key != "" {
		p += "/" + pointerToken(key)
	}
	return p
}

// readExpiresAt reads expires_at: an RFC 3339 date-time at least
// MinExpiry ahead of now, before the year 10000; else why not.
func readExpiresAt(v json.RawMessage, now time.Time) (time.Time, string) {
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return time.Time{}, "must be an RFC 3339 date-time string"
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	switch {
	case err != nil:
		return time.Time{}, fmt.Sprintf("%q is not an RFC 3339 date-time like 2026-01-02T15:04:05Z", s)
	case !t.After(now):
		return time.Time{}, "is already past"
	case t.Before(now.Add(MinExpiry)):
		return time.Time{}, fmt.Sprintf("is less than %v ahead", MinExpiry)
	case t.UTC().Year() > 9999:
		return time.Time{}, "is after the year 9999"
	}
	return t.UTC(), ""
}

// readTTL reads ttl: a Go duration from MinExpiry to MaxTTL; else why not.
func readTTL(v json.RawMessage) (time.Duration, string) {
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return 0, "must be a duration string like \"10m\" or \"1h30m\""
	}
	dur, err := time.ParseDuration(s)
	if err != nil || dur < MinExpiry || dur > MaxTTL {
		return 0, fmt.Sprintf("%q is not a duration between %v and %v (e.g. \"10m\", \"1h30m\")", s, MinExpiry, MaxTTL)
	}
	return dur, ""
}

// decodeNotification reads one notification of a request: the payload's
// fields (without id and enqueued_at, which the API sets), and ttl as an
// alternative to expires_at. It returns every bad field, not just the
// first.
func decodeNotification(raw json.RawMessage, now time.Time) *decoded {
	return decodeOne(raw, now, true)
}

// decodeOne is decodeNotification, with all: false field by field only
// (as it was before decodeAll; the fuzz test compares the two).
func decodeOne(raw json.RawMessage, now time.Time, all bool) *decoded {
	d := &decoded{keys: map[string]string{}}
	n := &d.N
	add := func(member, reason string) {
		d.Bad = append(d.Bad, bodyParam(member, reason, "/"+pointerToken(member)))
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		d.Bad = []InvalidParam{bodyParam("notification", "is not a JSON object", "")}
		return d
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	fast := all && decodeAll(raw, keys, n)
	var ttl time.Duration
	hasTTL, hasExpiry := false, false
	for _, k := range keys {
		v := m[k]
		d.keys[strings.ToLower(k)] = k // of two spellings, the last decoded wins, as below
		switch strings.ToLower(k) {    // encoding/json matches names case-insensitively
		case "expires_at":
			t, reason := readExpiresAt(v, now)
			if reason != "" {
				n.ExpiresAt = time.Time{}
				add(k, reason)
				continue
			}
			n.ExpiresAt, hasExpiry = t, true
		case "ttl":
			dur, reason := readTTL(v)
			if reason != "" {
				add(k, reason)
				continue
			}
			ttl, hasTTL = dur, true
		case "id":
			add(k, "is set by the API; send an Idempotency-Key header to make retries safe")
		case "enqueued_at":
			add(k, "is set by the API")
		default:
			// Every other field of the payload, by its JSON name: fields
			// added to tasks.Notification are taken without a change here.
			if fast {
				continue // decoded already
			}
			if reason := decodeField(n, k, v); reason != "" {
				add(k, reason)
			}
		}
	}
	switch {
	case hasTTL && hasExpiry:
		d.Bad = append(d.Bad, bodyParam("ttl", "give expires_at or ttl, not both", d.pointer("ttl", "")))
	case hasTTL:
		n.ExpiresAt, d.expiryField = now.Add(ttl).UTC().Truncate(time.Millisecond), d.keys["ttl"]
	case hasExpiry:
		d.expiryField = d.keys["expires_at"]
	}
	*n = n.Normalized()
	d.Bad = append(d.Bad, d.fieldErrors()...)
	return d
}

// wire is a notification as a request spells it: ttl besides the payload's
// fields.
type wire struct {
	tasks.Notification
	TTL json.RawMessage `json:"ttl"`
}

// decodeAll decodes every field of raw into n at once, as decodeField
// would one by one in keys' order, and says whether it did: when no two
// members differ only in case (encoding/json's order would then pick
// another winner than keys' order), none is one the API sets (id,
// enqueued_at), and every one is a field that reads. Otherwise n is left
// as it was and each field goes through decodeField, which says what is
// wrong with it. (A batch of 500 decoded field by field spent 14 µs a
// notification here, most of the API's own CPU.)
func decodeAll(raw json.RawMessage, keys []string, n *tasks.Notification) bool {
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		l := strings.ToLower(k)
		if seen[l] || l == "id" || l == "enqueued_at" {
			return false
		}
		seen[l] = true
	}
	var w wire
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&w); err != nil || dec.More() {
		return false
	}
	*n = w.Notification
	return true
}

// decodeField sets the field of n whose JSON name is name; it returns why
// it cannot, or "".
func decodeField(n *tasks.Notification, name string, v json.RawMessage) string {
	one, _ := json.Marshal(map[string]json.RawMessage{name: v})
	dec := json.NewDecoder(bytes.NewReader(one))
	dec.DisallowUnknownFields()
	err := dec.Decode(n)
	var ute *json.UnmarshalTypeError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &ute):
		if f, ok := fieldByName(name); ok {
			return "must be " + jsonKind(f.Type)
		}
		return "must be " + jsonKind(ute.Type)
	case strings.Contains(err.Error(), "unknown field"):
		return "is not a field of a notification"
	}
	return "does not read: " + err.Error()
}

// jsonKind names the JSON a Go type is read from.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Float64:
		return "a number"
	case reflect.Map:
		return "an object of " + strings.TrimPrefix(jsonKind(t.Elem()), "a ") + " values"
	case reflect.Slice:
		return "an array"
	case reflect.Struct:
		if t == reflect.TypeFor[time.Time]() {
			return "an RFC 3339 date-time string"
		}
	}
	return "an object"
}

// fieldErrors validates the notification field by field: after each bad
// field it puts a valid stand-in in its place and validates again, so that
// every bad field is named, not only the first. Fields already reported are
// skipped.
func (d *decoded) fieldErrors() []InvalidParam {
	reported := map[string]bool{}
	for _, b := range d.Bad {
		reported[strings.ToLower(b.Name)] = true
	}
	n := d.N
	n.ID, n.EnqueuedAt = "x", time.Time{}
	if n.Tenant == "" {
		n.Tenant = "x" // the request's tenant; checked by the caller
	}
	var out []InvalidParam
	for range 64 {
		err := n.Validate()
		if err == nil {
			break
		}
		if errors.Is(err, tasks.ErrUnknownChannel) {
			reason := "must be email, sms or whatsapp"
			if n.Channel == "" {
				reason = "is required: email, sms or whatsapp"
			}
			if !reported["channel"] {
				out = append(out, bodyParam("channel", reason, d.pointer("channel", "")))
			}
			break // the other fields' rules depend on the channel
		}
		var fe *tasks.FieldError
		if !errors.As(err, &fe) {
			out = append(out, bodyParam("notification", err.Error(), ""))
			break
		}
		if name := strings.ToLower(fe.Name()); !reported[name] && !reported[fe.Field] {
			out = append(out, bodyParam(fe.Name(), fe.Reason, d.pointer(fe.Field, fe.Key)))
			reported[name] = true
		}
		if !standIn(&n, fe) {
			break
		}
	}
	return out
}

// standIn replaces the field fe names with a value that passes validation.
func standIn(n *tasks.Notification, fe *tasks.FieldError) bool {
	switch fe.Field {
	case "body":
		n.Body = "x"
		if n.Channel == tasks.WhatsApp && n.Template != nil {
			n.Body = "" // a template is the whole message
		}
	case "template.name", "template.language", "template.params":
		t := *n.Template
		switch fe.Field {
		case "template.name":
			t.Name = "x"
		case "template.language":
			t.Language = ""
		default:
			t.Params = nil
		}
		n.Template = &t
	case "to":
		n.To = "+14155550100"
		if n.Channel == tasks.Email {
			n.To = "x@example.com"
		}
	case "subject":
		n.Subject = ""
		if n.Channel == tasks.Email {
			n.Subject = "x"
		}
	case "tenant":
		n.Tenant = "x"
	case "headers", "metadata":
		if fe.Key == "" {
			return zeroField(n, fe.Field)
		}
		// Drop only the bad entry: the others are checked too.
		m := n.Headers
		if fe.Field == "metadata" {
			m = n.Metadata
		}
		m = maps.Clone(m)
		delete(m, fe.Key)
		if fe.Field == "metadata" {
			n.Metadata = m
		} else {
			n.Headers = m
		}
	default:
		// An optional field: leave it out.
		return zeroField(n, fe.Field)
	}
	return true
}

// zeroField zeroes the field of n whose JSON name is name.
func zeroField(n *tasks.Notification, name string) bool {
	f, ok := fieldByName(name)
	if ok {
		reflect.ValueOf(n).Elem().FieldByIndex(f.Index).SetZero()
	}
	return ok
}

// fieldByName finds the field of tasks.Notification with this JSON name
// (case-insensitively, as encoding/json matches).
func fieldByName(name string) (reflect.StructField, bool) {
	t := reflect.TypeFor[tasks.Notification]()
	for i := 0; i < t.NumField(); i++ {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if strings.EqualFold(tag, name) {
			return t.Field(i), true
		}
	}
	return reflect.StructField{}, false
}

// fieldReason is the reason of a validation error, without its field name.
func fieldReason(err error) string {
	var fe *tasks.FieldError
	if errors.As(err, &fe) {
		return fe.Reason
	}
	return err.Error()
}

// checkWindow refuses a free-form WhatsApp message whose recipient's
// customer-service window is closed (consent.Store.CheckWindow): the
// producer learns it now, not from an archived task. Redis trouble lets
// it through: the worker checks again before it sends.
func (s *Server) checkWindow(ctx context.Context, d *decoded, n *tasks.Notification) []InvalidParam {
	err := s.deps.Consent.CheckWindow(ctx, *n, time.Now())
	if !errors.Is(err, consent.ErrWindowClosed) {
		return nil
	}
	return []InvalidParam{bodyParam("body", "is a free-form WhatsApp message, and the recipient has not written to this tenant in the last 24 hours (its customer-service window is closed): send a template", d.pointer("body", ""))}
}

// checkPlan checks a decoded notification, with its id and enqueue time
// set, against what the request alone does not show: the rules in force
// (bulk mail needs a List-Unsubscribe, its own or the plan's default) and
// the size of the payload it encodes to, which escaping can push past
// tasks.MaxPayloadBytes. Pointers are relative to the notification.
func (s *Server) checkPlan(d *decoded, n *tasks.Notification) []InvalidParam {
	if n.Channel == tasks.Email && n.From != "" && !s.fromDomains.Allows(n.Tenant, n.From, s.cfg.SMTPFrom) {
		return []InvalidParam{bodyParam("from", "is not at a domain this tenant may send from (SLUICE_EMAIL_FROM_DOMAINS)", d.pointer("from", ""))}
	}
	m := s.policy().Match(n.Tenant, n.Channel, n.Category)
	var fe *tasks.FieldError
	if err := m.CheckNotification(*n); errors.As(err, &fe) {
		return []InvalidParam{bodyParam(fe.Name(), fe.Reason, d.pointer(fe.Field, ""))}
	}
	if _, err := n.Encode(); err != nil {
		return []InvalidParam{bodyParam("notification", fieldReason(err), "")}
	}
	return nil
}
