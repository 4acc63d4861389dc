// Package postmark reads Postmark's bounce, spam-complaint and
// subscription-change webhooks into the consent store (webhook.Provider
// "postmark").
//
// # Authentication
//
// Postmark signs nothing: its webhooks authenticate with basic auth, the
// user and password written into the webhook URL
// (https://USER:PASSWORD@sluice.example.com/v1/webhooks/postmark/TENANT),
// compared in constant time, over HTTPS. A tenant may also name the only
// client addresses deliveries are taken from (Postmark publishes its
// webhook IPs); behind a proxy the address is read from
// SLUICE_API_CLIENT_IP_HEADER. Postmark signs no timestamp or nonce: the
// replay guard keys a record by its RecordType and ID (a subscription
// change, which has none, by its MessageID, recipient, ChangedAt and
// direction) for ReplayTTL, so a replayed delivery records nothing again.
//
// # Events
//
// One JSON object per POST, by RecordType: Bounce of Type HardBounce or
// BadEmailAddress is a hard bounce (other types — soft bounces,
// auto-responders, DNS errors — are ignored); SpamComplaint a complaint;
// SubscriptionChange with SuppressSending true and SuppressionReason
// ManualSuppression an unsubscribe (its HardBounce and SpamComplaint
// reasons arrive as their own records). A subscription change lifting a
// suppression is ignored: Sluice's opt-outs are lifted by the recipient or
// the API, not by a provider's list.
package postmark

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/webhook"
)

// Name is the provider's name: /v1/webhooks/postmark/{tenant}.
const Name = "postmark"

// Provider is Postmark's webhooks.
type Provider struct{}

var _ webhook.Provider = Provider{}

// Name implements webhook.Provider.
func (Provider) Name() string { return Name }

// Check needs User and Password (16 bytes or more); AllowIPs optional.
func (Provider) Check(c webhook.Credentials) error {
	if c.User == "" || strings.ContainsAny(c.User, ":@/ ") || len(c.User) > 64 {
		return fmt.Errorf("%w: user: 1-64 characters without ':', '@', '/' or spaces", webhook.ErrCredentials)
	}
	if len(c.Password) < 16 || len(c.Password) > 256 {
		return fmt.Errorf("%w: password: 16-256 characters (e.g. `openssl rand -hex 16`)", webhook.ErrCredentials)
	}
	if c.Key != "" || len(c.Topics) > 0 {
		return fmt.Errorf("%w: postmark takes a user, a password and client addresses", webhook.ErrCredentials)
	}
	if _, err := Prefixes(c.AllowIPs); err != nil {
		return err
	}
	return nil
}

// Prefixes reads an allowlist: IPs or CIDR prefixes.
func Prefixes(allow []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(allow))
	for _, s := range allow {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%w: allow-ip %q: want an IP or a CIDR prefix", webhook.ErrCredentials, s)
		}
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out, nil
}

var _ webhook.HeadChecker = Provider{}

// CheckHead implements webhook.HeadChecker: the client address and the
// basic auth are in the head, checked before the body is read.
func (Provider) CheckHead(in webhook.Inbound) error {
	if len(in.Creds.AllowIPs) > 0 {
		allowed, err := Prefixes(in.Creds.AllowIPs)
		if err != nil {
			return err
		}
		if !contains(allowed, in.ClientIP) {
			return fmt.Errorf("%w: the client address is not in the tenant's allowlist", webhook.ErrNotAllowed)
		}
	}
	user, pass, ok := in.Request.BasicAuth()
	if !ok {
		return fmt.Errorf("%w: no basic auth: put USER:PASSWORD@ in the webhook URL", webhook.ErrUnsigned)
	}
	u := subtle.ConstantTimeCompare([]byte(user), []byte(in.Creds.User))
	p := subtle.ConstantTimeCompare([]byte(pass), []byte(in.Creds.Password))
	if u&p != 1 || in.Creds.Password == "" {
		return fmt.Errorf("%w: basic auth", webhook.ErrForged)
	}
	return nil
}

// Verify implements webhook.Provider.
func (p Provider) Verify(_ context.Context, in webhook.Inbound) (webhook.Batch, error) {
	if err := p.CheckHead(in); err != nil {
		return webhook.Batch{}, err
	}
	return Parse(in.Body)
}

func contains(allowed []netip.Prefix, a netip.Addr) bool {
	for _, p := range allowed {
		if a.IsValid() && p.Contains(a) {
			return true
		}
	}
	return false
}

// record is what Sluice reads of a Postmark webhook.
type record struct {
	RecordType        string          `json:"RecordType"`
	Type              string          `json:"Type"`
	Email             string          `json:"Email"`
	Recipient         string          `json:"Recipient"`
	MessageID         string          `json:"MessageID"`
	ID                json.RawMessage `json:"ID"`
	Details           string          `json:"Details"`
	SuppressSending   bool            `json:"SuppressSending"`
	SuppressionReason string          `json:"SuppressionReason"`
	ChangedAt         string          `json:"ChangedAt"`
}

// ReplayTTL is how long a record's id is remembered: Postmark retries a
// webhook that was not answered 200 for hours, and signs no nonce.
const ReplayTTL = 7 * 24 * time.Hour

// replayID names a record for the replay guard: its type and ID (a bounce's
// or complaint's), else its type, MessageID, recipient, time and direction
// (a subscription change has no ID of its own).
func (r record) replayID() string {
	if id := strings.Trim(string(r.ID), `"`); id != "" && id != "null" {
		return r.RecordType + "\x00" + id
	}
	if r.MessageID == "" {
		return ""
	}
	return fmt.Sprintf("%s\x00%s\x00%s\x00%s\x00%t", r.RecordType, r.MessageID, r.Recipient, r.ChangedAt, r.SuppressSending)
}

// Parse reads a delivery's body: one JSON object.
func Parse(body []byte) (webhook.Batch, error) {
	var rec record
	if err := json.Unmarshal(body, &rec); err != nil {
		return webhook.Batch{}, fmt.Errorf("%w: not a Postmark webhook (one JSON object)", webhook.ErrMalformed)
	}
	id := rec.MessageID
	if id == "" {
		id = strings.Trim(string(rec.ID), `"`)
	}
	r := consent.Report{Ref: webhook.Ref(Name, id)}
	to := rec.Email
	switch {
	case rec.RecordType == "Bounce" && (rec.Type == "HardBounce" || rec.Type == "BadEmailAddress"):
		r.Type, r.Code = consent.TypeBounce, webhook.SMTPCode(rec.Details)
	case rec.RecordType == "SpamComplaint":
		r.Type = consent.TypeComplaint
	case rec.RecordType == "SubscriptionChange" && rec.SuppressSending && rec.SuppressionReason == "ManualSuppression":
		r.Type, to = consent.TypeUnsubscribe, rec.Recipient
	default:
		return webhook.Batch{Ignored: 1}, nil
	}
	b := webhook.Batch{Items: []webhook.Item{{Recipient: to, Report: r}}}
	if id := rec.replayID(); id != "" {
		b.ReplayID, b.ReplayTTL = id, ReplayTTL
	}
	return b, nil
}
