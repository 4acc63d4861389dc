package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/tasks"
)

// MaxTTL bounds the ttl field.
const MaxTTL = 400 * 24 * time.Hour

// decodeNotification reads one notification of a request: the payload's
// fields (without id and enqueued_at, which the API sets), and ttl as an
// alternative to expires_at. It returns every bad field, not just the
// first; Pointer is relative to the notification ("/to").
func decodeNotification(raw json.RawMessage, now time.Time) (tasks.Notification, []InvalidParam) {
	var n tasks.Notification
	var bad []InvalidParam
	add := func(field, reason string) {
		bad = append(bad, InvalidParam{Name: field, Reason: reason, Pointer: "/" + field})
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return n, []InvalidParam{{Name: "notification", Reason: "is not a JSON object"}}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var ttl time.Duration
	hasTTL, hasExpiry := false, false
	for _, k := range keys {
		v := m[k]
		switch strings.ToLower(k) { // encoding/json matches names case-insensitively
		case "expires_at":
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				add(k, "must be an RFC 3339 date-time string")
				continue
			}
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				add(k, fmt.Sprintf("%q is not an RFC 3339 date-time like 2026-01-02T15:04:05Z", s))
				continue
			}
			if !t.After(now) {
				add(k, "is already past")
				continue
			}
			n.ExpiresAt, hasExpiry = t.UTC(), true
		case "ttl":
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				add(k, "must be a duration string like \"10m\" or \"1h30m\"")
				continue
			}
			d, err := time.ParseDuration(s)
			if err != nil || d <= 0 || d > MaxTTL {
				add(k, fmt.Sprintf("%q is not a duration between 1ms and %v (e.g. \"10m\", \"1h30m\")", s, MaxTTL))
				continue
			}
			ttl, hasTTL = d, true
		case "id":
			add(k, "is set by the API; send an Idempotency-Key header to make retries safe")
		case "enqueued_at":
			add(k, "is set by the API")
		default:
			// Every other field of the payload, by its JSON name: fields
			// added to tasks.Notification are taken without a change here.
			if reason := decodeField(&n, k, v); reason != "" {
				add(k, reason)
			}
		}
	}
	if hasTTL && hasExpiry {
		add("ttl", "give expires_at or ttl, not both")
	} else if hasTTL {
		n.ExpiresAt = now.Add(ttl).UTC().Truncate(time.Millisecond)
	}
	n = n.Normalized()
	bad = append(bad, fieldErrors(n, bad)...)
	return n, bad
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

// fieldErrors validates n field by field: after each bad field it puts a
// valid stand-in in its place and validates again, so that every bad field
// is named, not only the first. Fields already reported are skipped.
func fieldErrors(n tasks.Notification, already []InvalidParam) []InvalidParam {
	reported := map[string]bool{}
	for _, b := range already {
		reported[b.Name] = true
	}
	n.ID, n.EnqueuedAt = "x", time.Time{}
	if n.Tenant == "" {
		n.Tenant = "x" // the request's tenant; checked by the caller
	}
	var out []InvalidParam
	for range 32 {
		err := n.Validate()
		if err == nil {
			break
		}
		if errors.Is(err, tasks.ErrUnknownChannel) {
			reason := "must be email or sms"
			if n.Channel == "" {
				reason = "is required: email or sms"
			}
			if !reported["channel"] {
				out = append(out, InvalidParam{Name: "channel", Reason: reason, Pointer: "/channel"})
			}
			break // the other fields' rules depend on the channel
		}
		var fe *tasks.FieldError
		if !errors.As(err, &fe) {
			out = append(out, InvalidParam{Name: "notification", Reason: err.Error()})
			break
		}
		if !reported[fe.Field] {
			out = append(out, InvalidParam{Name: fe.Field, Reason: fe.Reason, Pointer: "/" + fe.Field})
			reported[fe.Field] = true
		}
		if !standIn(&n, fe.Field) {
			break
		}
	}
	return out
}

// standIn replaces field with a value that passes validation.
func standIn(n *tasks.Notification, field string) bool {
	switch field {
	case "body":
		n.Body = "x"
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
	default:
		// An optional field: leave it out.
		return zeroField(n, field)
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
