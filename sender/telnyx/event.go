package telnyx

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/delivery"
)

// The headers of a signed webhook.
const (
	SignatureHeader = "telnyx-signature-ed25519"
	TimestampHeader = "telnyx-timestamp"
)

// Tolerance is how far a webhook's telnyx-timestamp may be from now.
const Tolerance = 5 * time.Minute

// The refusals of Verify.
var (
	ErrUnsigned = errors.New("telnyx: webhook not signed")
	ErrForged   = errors.New("telnyx: webhook signature does not match")
	ErrStale    = errors.New("telnyx: webhook timestamp outside the tolerance")
)

// CheckHead refuses a webhook its head refuses: no signature or timestamp
// header, or a timestamp that is not Unix seconds within Tolerance of now
// (before its body is read).
func CheckHead(sigB64, ts string, now time.Time) error {
	if sigB64 == "" || ts == "" {
		return fmt.Errorf("%w: no %s or %s", ErrUnsigned, SignatureHeader, TimestampHeader)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(ts) > 12 {
		return fmt.Errorf("%w: %s is not Unix seconds", ErrForged, TimestampHeader)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > Tolerance || d < -Tolerance {
		return fmt.Errorf("%w: %s is not within %v of now", ErrStale, TimestampHeader, Tolerance)
	}
	return nil
}

// Verify checks a webhook's Ed25519 signature over timestamp + "|" + body
// under key, and that the timestamp is within Tolerance of now.
func Verify(key ed25519.PublicKey, sigB64, ts string, body []byte, now time.Time) error {
	if sigB64 == "" || ts == "" {
		return fmt.Errorf("%w: no %s or %s", ErrUnsigned, SignatureHeader, TimestampHeader)
	}
	sig, err := base64.StdEncoding.DecodeString(sigB64)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return fmt.Errorf("%w: %s is not a base64 Ed25519 signature", ErrForged, SignatureHeader)
	}
	msg := make([]byte, 0, len(ts)+1+len(body))
	msg = append(append(append(msg, ts...), '|'), body...)
	if !ed25519.Verify(key, msg, sig) {
		return ErrForged
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || len(ts) > 12 {
		return fmt.Errorf("%w: %s is not Unix seconds", ErrForged, TimestampHeader)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > Tolerance || d < -Tolerance {
		return fmt.Errorf("%w: %s is not within %v of now", ErrStale, TimestampHeader, Tolerance)
	}
	return nil
}

// Event is what Sluice reads of a Telnyx webhook.
type Event struct {
	Type    string // data.event_type: message.sent, message.finalized, message.received
	ID      string // data.id: the event's id
	Message MessagePayload
}

// MessagePayload is data.payload of a message event.
type MessagePayload struct {
	ID                 string `json:"id"`
	Text               string `json:"text"`
	MessagingProfileID string `json:"messaging_profile_id"`
	From               struct {
		PhoneNumber string `json:"phone_number"`
	} `json:"from"`
	To []struct {
		PhoneNumber string `json:"phone_number"`
		Status      string `json:"status"`
	} `json:"to"`
	Errors []struct {
		Code json.RawMessage `json:"code"`
	} `json:"errors"`
}

// ErrMalformed reports a webhook that is not a Telnyx message event.
var ErrMalformed = errors.New("telnyx: malformed webhook")

// ParseEvent reads a webhook's body.
func ParseEvent(body []byte) (Event, error) {
	var w struct {
		Data struct {
			EventType string         `json:"event_type"`
			ID        string         `json:"id"`
			Payload   MessagePayload `json:"payload"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &w); err != nil {
		return Event{}, fmt.Errorf("%w: not JSON", ErrMalformed)
	}
	if w.Data.EventType == "" || w.Data.ID == "" || len(w.Data.ID) > 64 {
		return Event{}, fmt.Errorf("%w: no data.event_type or data.id", ErrMalformed)
	}
	return Event{Type: w.Data.EventType, ID: w.Data.ID, Message: w.Data.Payload}, nil
}

// Recipient is the message's first recipient (Sluice sends to one).
func (m MessagePayload) Recipient() (number, status string) {
	if len(m.To) == 0 {
		return "", ""
	}
	return m.To[0].PhoneNumber, m.To[0].Status
}

// ErrorCode is the code of the message's first error; 0 for none.
func (m MessagePayload) ErrorCode() int {
	if len(m.Errors) == 0 {
		return 0
	}
	n, err := strconv.Atoi(strings.Trim(string(m.Errors[0].Code), `"`))
	if err != nil || n < 0 || n > delivery.MaxErrorCode {
		return 0
	}
	return n
}

// statuses maps Telnyx's recipient statuses to delivery's.
// delivery_unconfirmed is final at Telnyx but says nothing of the
// recipient: it stays sent.
var statuses = map[string]delivery.Status{
	"queued": delivery.Queued, "sending": delivery.Sending, "sent": delivery.Sent,
	"delivered": delivery.Delivered, "delivery_failed": delivery.Undelivered, "sending_failed": delivery.Failed,
	"delivery_unconfirmed": delivery.Sent,
}

// Status is the delivery status of a Telnyx recipient status; ok is false
// for one Sluice does not know.
func Status(s string) (delivery.Status, bool) {
	st, ok := statuses[s]
	return st, ok
}
