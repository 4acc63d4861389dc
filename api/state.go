package api

import (
	"errors"
	"strconv"
	"strings"
	"time"
)

// The states of a notification, as GET /v1/notifications/{id} reports them.
const (
	StateQueued   = "queued"   // waiting for a worker, nothing in its way
	StateWaiting  = "waiting"  // held back: a quota's slot, quiet hours, a retry, Redis away
	StateSending  = "sending"  // a worker has it
	StateSent     = "sent"     // the provider took it
	StateArchived = "archived" // will not be sent; Reason says why
	StateUnknown  = "unknown"  // admitted for sending but no record of the outcome

	// What the provider reported later (SMS status callbacks).
	StateDelivered   = "delivered"   // the recipient's handset has it
	StateUndelivered = "undelivered" // the carrier could not deliver it; ErrorCode says why
	StateFailed      = "failed"      // the provider could not send it; ErrorCode says why
)

// stateRecord is the limiter's per-notification record (throttle's state
// key): "b<attempt>:<slot ms>:<nonce>" booked, "a<attempt>:<ms>:<nonce>"
// admitted, "d<attempt>:<ms>" done.
type stateRecord struct {
	Kind    byte // 'b', 'a' or 'd'
	Attempt int
	At      time.Time // the slot (b, a) or when the send was recorded (d); zero if unknown
}

var errBadRecord = errors.New("unreadable state record")

// parseStateRecord reads a limiter state record.
func parseStateRecord(s string) (stateRecord, error) {
	if len(s) < 2 || (s[0] != 'b' && s[0] != 'a' && s[0] != 'd') {
		return stateRecord{}, errBadRecord
	}
	rest := s[1:]
	att, rest, ok := strings.Cut(rest, ":")
	if !ok {
		return stateRecord{}, errBadRecord
	}
	n, err := strconv.Atoi(att)
	if err != nil || n < 0 || len(att) > 9 {
		return stateRecord{}, errBadRecord
	}
	ms, _, _ := strings.Cut(rest, ":")
	t, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || t < 0 || t > 1<<50 {
		return stateRecord{}, errBadRecord
	}
	r := stateRecord{Kind: s[0], Attempt: n}
	if t > 0 {
		r.At = time.UnixMilli(t).UTC()
	}
	return r, nil
}

// lastErr is what Asynq's LastErr of a Sluice task says.
type lastErr struct {
	Reason string    // throttled, quiet_hours, shutdown, unavailable, retry; expired, dropped, outcome_unknown, invalid, unreadable, permanent, retry_budget, suppressed
	Rule   string    // the rule that set the slot ("sms:recipient 1/1m"), for throttled
	Until  time.Time // the slot the worker was told, for throttled
}

// parseLastErr classifies a worker's task error message. waiting is true
// for a task Asynq holds for another attempt, false for an archived one.
func parseLastErr(msg string, waiting bool) lastErr {
	if rest, ok := strings.CutPrefix(msg, "throttled by "); ok {
		i := strings.LastIndex(rest, " until ")
		if i < 0 {
			return lastErr{Reason: "throttled", Rule: rest}
		}
		le := lastErr{Reason: "throttled", Rule: rest[:i]}
		if t, err := time.Parse(time.RFC3339Nano, rest[i+len(" until "):]); err == nil {
			le.Until = t.UTC()
		}
		switch le.Rule {
		case "quiet hours":
			le.Reason, le.Rule = "quiet_hours", ""
		case "shutdown":
			le.Reason, le.Rule = "shutdown", ""
		}
		return le
	}
	switch {
	case strings.HasPrefix(msg, "quota check unavailable"):
		return lastErr{Reason: "unavailable"}
	case strings.HasPrefix(msg, "expired:"):
		return lastErr{Reason: "expired"}
	case strings.HasPrefix(msg, "throttled:"):
		return lastErr{Reason: "dropped"}
	case strings.HasPrefix(msg, "outcome of an earlier attempt unknown"):
		return lastErr{Reason: "outcome_unknown"}
	case strings.Contains(msg, "sealed payload does not open"), strings.Contains(msg, "payload is not sealed"):
		return lastErr{Reason: "unreadable"}
	case strings.HasPrefix(msg, "suppressed:"):
		return lastErr{Reason: "suppressed"}
	case strings.HasPrefix(msg, "invalid notification"):
		return lastErr{Reason: "invalid"}
	case strings.Contains(msg, "retry budget of"):
		return lastErr{Reason: "retry_budget"}
	}
	if waiting {
		return lastErr{Reason: "retry"}
	}
	return lastErr{Reason: "permanent"}
}
