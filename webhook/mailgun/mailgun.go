// Package mailgun reads Mailgun's signed webhooks into the consent store
// (webhook.Provider "mailgun"): a permanent failure marks the address
// undeliverable, a complaint opts it out (source complaint), an
// unsubscribe opts it out of every category.
//
// # Signature
//
// Each POST is a JSON object {"signature": {"timestamp", "token",
// "signature"}, "event-data": {...}}: the signature is the hex HMAC-SHA256,
// keyed with the domain's HTTP webhook signing key, of the timestamp
// followed by the token — checked with mailgun-go's
// VerifyWebhookSignature. The timestamp must be within webhook.Tolerance;
// the token is the replay guard's key, as Mailgun advises.
//
// # Events
//
// failed with severity permanent is a hard bounce (its delivery-status
// code kept); failed with severity temporary is not one and is ignored;
// complained is a complaint; unsubscribed an unsubscribe; every other
// event (delivered, opened, clicked, accepted, ...) is ignored. Mailgun's
// legacy form-encoded webhooks are not taken.
package mailgun

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/mailgun/mailgun-go/v4"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/webhook"
)

// Name is the provider's name: /v1/webhooks/mailgun/{tenant}.
const Name = "mailgun"

// Provider is Mailgun's webhooks.
type Provider struct{}

var _ webhook.Provider = Provider{}

// Name implements webhook.Provider.
func (Provider) Name() string { return Name }

// Check needs Key: the domain's HTTP webhook signing key.
func (Provider) Check(c webhook.Credentials) error {
	if len(c.Key) < 16 {
		return fmt.Errorf("%w: key: want Mailgun's HTTP webhook signing key (Sending → Webhooks), at least 16 characters", webhook.ErrCredentials)
	}
	if c.User != "" || c.Password != "" || len(c.Topics) > 0 || len(c.AllowIPs) > 0 {
		return fmt.Errorf("%w: mailgun takes a key only", webhook.ErrCredentials)
	}
	return nil
}

// Payload is a delivery's body as Sluice reads it.
type Payload struct {
	Signature mailgun.Signature `json:"signature"`
	EventData EventData         `json:"event-data"`
}

// EventData is what Sluice reads of the event.
type EventData struct {
	ID             string `json:"id"`
	Event          string `json:"event"`
	Severity       string `json:"severity"`
	Recipient      string `json:"recipient"`
	DeliveryStatus struct {
		Code int `json:"code"`
	} `json:"delivery-status"`
	Message struct {
		Headers struct {
			MessageID string `json:"message-id"`
		} `json:"headers"`
	} `json:"message"`
}

// Verify implements webhook.Provider.
func (Provider) Verify(_ context.Context, in webhook.Inbound) (webhook.Batch, error) {
	var p Payload
	if err := json.Unmarshal(in.Body, &p); err != nil {
		return webhook.Batch{}, fmt.Errorf("%w: not a JSON webhook (signature and event-data)", webhook.ErrUnsigned)
	}
	sig := p.Signature
	if sig.Signature == "" || sig.Token == "" || sig.TimeStamp == "" {
		return webhook.Batch{}, fmt.Errorf("%w: no signature, token or timestamp", webhook.ErrUnsigned)
	}
	mg := mailgun.NewMailgun("", "")
	mg.SetWebhookSigningKey(in.Creds.Key)
	if ok, err := mg.VerifyWebhookSignature(sig); err != nil || !ok || in.Creds.Key == "" {
		return webhook.Batch{}, fmt.Errorf("%w: signature", webhook.ErrForged)
	}
	if err := webhook.Fresh(sig.TimeStamp, in.Now, webhook.Tolerance); err != nil {
		return webhook.Batch{}, fmt.Errorf("%w: timestamp is not within %v of now", err, webhook.Tolerance)
	}
	b := Map(p.EventData)
	b.ReplayID, b.ReplayTTL = sig.Token, 2*webhook.Tolerance
	return b, nil
}

// Parse reads a delivery's body without checking its signature.
func Parse(body []byte) (Payload, error) {
	var p Payload
	if err := json.Unmarshal(body, &p); err != nil {
		return Payload{}, fmt.Errorf("%w: not a JSON webhook", webhook.ErrMalformed)
	}
	return p, nil
}

// Map turns an event into the batch to record (one item, or none).
func Map(e EventData) webhook.Batch {
	id := e.Message.Headers.MessageID
	if id == "" {
		id = e.ID
	}
	r := consent.Report{Ref: webhook.Ref(Name, id)}
	switch e.Event {
	case "failed":
		if e.Severity != "permanent" {
			return webhook.Batch{Ignored: 1}
		}
		r.Type = consent.TypeBounce
		if c := e.DeliveryStatus.Code; c >= 400 && c <= 599 {
			r.Code = c
		}
	case "complained":
		r.Type = consent.TypeComplaint
	case "unsubscribed":
		r.Type = consent.TypeUnsubscribe
	default:
		return webhook.Batch{Ignored: 1}
	}
	return webhook.Batch{Items: []webhook.Item{{Recipient: e.Recipient, Report: r}}}
}
