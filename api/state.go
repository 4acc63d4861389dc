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
