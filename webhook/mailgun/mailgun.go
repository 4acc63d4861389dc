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
// followed by the token. An event of a subaccount also carries
// "parent-signature", the same HMAC under the primary account's key
// (Mailgun, "Securing Webhooks"): a tenant that configures the primary key
// (--parent-key) names its subaccount (--account), and only events whose
// account.id is that subaccount's are taken with it. The timestamp must be within webhook.Tolerance;
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

// Check needs Key (the domain's HTTP webhook signing key), or ParentKey
// (the primary account's, for a subaccount) with Account (the
// subaccount's id), or both.
func (Provider) Check(c webhook.Credentials) error {
	if c.Key == "" && c.ParentKey == "" {
		return fmt.Errorf("%w: key: want Mailgun's HTTP webhook signing key (Sending → Webhooks), or a subaccount's primary key with --parent-key and --account", webhook.ErrCredentials)
	}
	if c.Key != "" && len(c.Key) < 16 {
		return fmt.Errorf("%w: key: want Mailgun's HTTP webhook signing key (Sending → Webhooks), at least 16 characters", webhook.ErrCredentials)
	}
	if c.ParentKey != "" && (len(c.ParentKey) < 16 || !accountID(c.Account)) {
		return fmt.Errorf("%w: parent-key: the primary account's signing key (at least 16 characters), with --account: the subaccount's id (letters and digits, the account.id of its events)", webhook.ErrCredentials)
	}
	if c.ParentKey == "" && c.Account != "" {
		return fmt.Errorf("%w: account: only with --parent-key", webhook.ErrCredentials)
	}
	if c.User != "" || c.Password != "" || len(c.Topics) > 0 || len(c.AllowIPs) > 0 {
		return fmt.Errorf("%w: mailgun takes a key, a parent key and an account only", webhook.ErrCredentials)
	}
	return nil
}

func accountID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// Payload is a delivery's body as Sluice reads it.
type Payload struct {
	Signature Signature `json:"signature"`
	EventData EventData `json:"event-data"`
}

// Signature is a delivery's signature: Mailgun's, and for an event of a
// subaccount the primary account's (parent-signature).
type Signature struct {
	TimeStamp string `json:"timestamp"`
	Token     string `json:"token"`
	Signature string `json:"signature"`
	Parent    string `json:"parent-signature"`
}

// EventData is what Sluice reads of the event.
type EventData struct {
	Account struct {
		ID string `json:"id"`
	} `json:"account"`
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
	if (sig.Signature == "" && sig.Parent == "") || sig.Token == "" || sig.TimeStamp == "" {
		return webhook.Batch{}, fmt.Errorf("%w: no signature, token or timestamp", webhook.ErrUnsigned)
	}
	if err := verify(in.Creds, sig, p.EventData); err != nil {
		return webhook.Batch{}, err
	}
	if err := webhook.Fresh(sig.TimeStamp, in.Now, webhook.Tolerance); err != nil {
		return webhook.Batch{}, fmt.Errorf("%w: timestamp is not within %v of now", err, webhook.Tolerance)
	}
	b := Map(p.EventData)
	b.ReplayID, b.ReplayTTL = sig.Token, 2*webhook.Tolerance
	return b, nil
}

// verify accepts a delivery signed with the tenant's own key, or — for a
// subaccount — with its primary account's key as parent-signature when the
// event is the tenant's subaccount's (the primary key signs every one).
func verify(c webhook.Credentials, sig Signature, e EventData) error {
	if c.Key != "" && sig.Signature != "" && validMAC(c.Key, sig.TimeStamp, sig.Token, sig.Signature) {
		return nil
	}
	if c.ParentKey != "" && sig.Parent != "" && validMAC(c.ParentKey, sig.TimeStamp, sig.Token, sig.Parent) {
		if e.Account.ID != c.Account {
			return fmt.Errorf("%w: parent-signature of another subaccount's event (account.id)", webhook.ErrNotAllowed)
		}
		return nil
	}
	return fmt.Errorf("%w: signature", webhook.ErrForged)
}

// validMAC checks a hex HMAC-SHA256 of timestamp + token under key with
// mailgun-go's VerifyWebhookSignature (a parent-signature is the same
// HMAC under the primary account's key).
func validMAC(key, ts, token, sig string) bool {
	mg := mailgun.NewMailgun("", "")
	mg.SetWebhookSigningKey(key)
	ok, err := mg.VerifyWebhookSignature(mailgun.Signature{TimeStamp: ts, Token: token, Signature: sig})
	return err == nil && ok
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
