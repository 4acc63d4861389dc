// Package sendgrid reads SendGrid's signed Event Webhook into the consent
// store (webhook.Provider "sendgrid"): a bounce marks the address
// undeliverable, a spam report opts it out (source complaint), an
// unsubscribe opts it out of every category.
//
// # Signature
//
// SendGrid signs each POST with ECDSA P-256 over SHA-256 of the
// X-Twilio-Email-Event-Webhook-Timestamp header's value followed by the raw
// body; the signature (base64 ASN.1 DER) is in
// X-Twilio-Email-Event-Webhook-Signature. The tenant's verification key is
// the base64 public key SendGrid shows when signing is turned on
// (Mail Settings → Event Webhook → Signature Verification). The check is
// sendgrid-go's eventwebhook.VerifySignature; the timestamp must be within
// webhook.Tolerance; the replay guard keys a delivery by the digest of its
// timestamp and body (an ECDSA signature can be re-encoded; the signed
// bytes cannot).
//
// # Events
//
// The body is a JSON array of events. bounce (type bounce, or none) is a
// hard bounce — SendGrid's type "blocked" is not one and is ignored;
// spamreport is a complaint; unsubscribe and group_unsubscribe (what
// senders using SendGrid's unsubscribe groups get instead) are an
// unsubscribe from every category (those a plan marks consent=exempt still
// go: a group cannot be mapped to Sluice's categories); dropped with reason
// "Bounced Address", "Unsubscribed Address" or "Spam Reporting Address" is
// a hard bounce, an unsubscribe or a complaint (SendGrid drops a message to
// an address on its own lists, which may predate the webhook); any other
// drop, group_resubscribe (Sluice's opt-outs are lifted by the recipient or
// the API, not a provider's list), processed, deferred, delivered, open
// and click are ignored.
package sendgrid

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/sendgrid/sendgrid-go/helpers/eventwebhook"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/webhook"
)

// Name is the provider's name: /v1/webhooks/sendgrid/{tenant}.
const Name = "sendgrid"

// The headers of a signed delivery.
const (
	SignatureHeader = eventwebhook.VerificationHTTPHeader
	TimestampHeader = eventwebhook.TimestampHTTPHeader
)

// Provider is SendGrid's Event Webhook.
type Provider struct{}

var _ webhook.Provider = Provider{}

// Name implements webhook.Provider.
func (Provider) Name() string { return Name }

// Check needs Key: the base64 ECDSA P-256 public key SendGrid shows.
func (Provider) Check(c webhook.Credentials) error {
	if _, err := PublicKey(c.Key); err != nil {
		return err
	}
	if c.User != "" || c.Password != "" || len(c.Topics) > 0 || len(c.AllowIPs) > 0 {
		return fmt.Errorf("%w: sendgrid takes a key only", webhook.ErrCredentials)
	}
	return nil
}

// PublicKey reads SendGrid's verification key: base64 of a PKIX ECDSA
// P-256 public key. (eventwebhook.ConvertPublicKeyBase64ToECDSA would
// panic on a key of another type.)
func PublicKey(b64 string) (*ecdsa.PublicKey, error) {
	der, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("%w: key: not base64: %w", webhook.ErrCredentials, err)
	}
	k, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("%w: key: not a public key: %w", webhook.ErrCredentials, err)
	}
	ek, ok := k.(*ecdsa.PublicKey)
	if !ok || ek.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%w: key: want an ECDSA P-256 key (SendGrid's verification key)", webhook.ErrCredentials)
	}
	return ek, nil
}

var _ webhook.HeadChecker = Provider{}

// CheckHead implements webhook.HeadChecker: the signature and timestamp
// headers are there and the timestamp fresh, before the body is read.
func (Provider) CheckHead(in webhook.Inbound) error {
	sig, ts := in.Request.Header.Get(SignatureHeader), in.Request.Header.Get(TimestampHeader)
	if sig == "" || ts == "" {
		return fmt.Errorf("%w: no %s or %s", webhook.ErrUnsigned, SignatureHeader, TimestampHeader)
	}
	if err := webhook.Fresh(ts, in.Now, webhook.Tolerance); err != nil {
		return fmt.Errorf("%w: %s is not within %v of now", err, TimestampHeader, webhook.Tolerance)
	}
	return nil
}

// Verify implements webhook.Provider.
func (p Provider) Verify(_ context.Context, in webhook.Inbound) (webhook.Batch, error) {
	if err := p.CheckHead(in); err != nil {
		return webhook.Batch{}, err
	}
	sig, ts := in.Request.Header.Get(SignatureHeader), in.Request.Header.Get(TimestampHeader)
	key, err := PublicKey(in.Creds.Key)
	if err != nil {
		return webhook.Batch{}, err
	}
	if ok, err := eventwebhook.VerifySignature(key, in.Body, sig, ts); err != nil || !ok {
		return webhook.Batch{}, fmt.Errorf("%w: %s", webhook.ErrForged, SignatureHeader)
	}
	if err := webhook.Fresh(ts, in.Now, webhook.Tolerance); err != nil {
		return webhook.Batch{}, fmt.Errorf("%w: %s is not within %v of now", err, TimestampHeader, webhook.Tolerance)
	}
	b, err := Parse(in.Body)
	if err != nil {
		return webhook.Batch{}, err
	}
	sum := sha256.Sum256(append([]byte(ts+"\x00"), in.Body...))
	b.ReplayID, b.ReplayTTL = string(sum[:]), 2*webhook.Tolerance
	return b, nil
}

// event is what Sluice reads of one SendGrid event.
type event struct {
	Email     string `json:"email"`
	Event     string `json:"event"`
	Type      string `json:"type"`
	Status    string `json:"status"`
	Reason    string `json:"reason"`
	MessageID string `json:"sg_message_id"`
	EventID   string `json:"sg_event_id"`
}

// MaxEvents bounds the events of one delivery.
const MaxEvents = 10000

// Parse reads a delivery's body: a JSON array of events.
func Parse(body []byte) (webhook.Batch, error) {
	var events []event
	if err := json.Unmarshal(body, &events); err != nil {
		return webhook.Batch{}, fmt.Errorf("%w: not a JSON array of events", webhook.ErrMalformed)
	}
	if len(events) > MaxEvents {
		return webhook.Batch{}, fmt.Errorf("%w: %d events, at most %d", webhook.ErrMalformed, len(events), MaxEvents)
	}
	var b webhook.Batch
	for _, e := range events {
		r, ok := report(e)
		if !ok {
			b.Ignored++
			continue
		}
		b.Items = append(b.Items, webhook.Item{Recipient: e.Email, Report: r})
	}
	return b, nil
}

// report maps one event; ok is false for one Sluice does not record.
func report(e event) (consent.Report, bool) {
	id := e.MessageID
	if id == "" {
		id = e.EventID
	}
	r := consent.Report{Ref: webhook.Ref(Name, id)}
	switch e.Event {
	case "bounce":
		if e.Type != "" && e.Type != "bounce" {
			return r, false // "blocked": a soft block, not a bounce
		}
		r.Type = consent.TypeBounce
		r.Code = webhook.SMTPCode(e.Reason)
		if r.Code == 0 {
			r.Code, _ = strconv.Atoi(e.Status) // "550" when SendGrid gives the reply code alone
			if r.Code < 400 || r.Code > 599 {
				r.Code = 0
			}
		}
	case "spamreport":
		r.Type = consent.TypeComplaint
	case "unsubscribe", "group_unsubscribe":
		r.Type = consent.TypeUnsubscribe
	case "dropped":
		// SendGrid drops a message to an address on one of its own
		// suppression lists: the bounce, unsubscribe or spam report that put
		// it there may predate the webhook, so the drop is the first Sluice
		// hears of it.
		switch e.Reason {
		case "Bounced Address":
			r.Type = consent.TypeBounce
		case "Unsubscribed Address":
			r.Type = consent.TypeUnsubscribe
		case "Spam Reporting Address":
			r.Type = consent.TypeComplaint
		default:
			return r, false // invalid, spam content, over quota…: not about the recipient's consent
		}
	default:
		return r, false
	}
	return r, true
}
