// Package ses reads Amazon SES's bounce and complaint notifications,
// delivered by Amazon SNS to an HTTPS subscription, into the consent store
// (webhook.Provider "ses"): a permanent bounce marks each bounced address
// undeliverable, a complaint opts each complaining address out (source
// complaint).
//
// # Signature
//
// SNS signs every message with the RSA key of a certificate it serves at
// SigningCertURL: SignatureVersion 1 is SHA1withRSA, 2 SHA256withRSA,
// over the canonical string of the message's fields (StringToSign). The
// certificate is fetched only over https from the SNS host of the topic's
// region, sns.<region>.amazonaws.com (or .amazonaws.com.cn), and cached;
// a host that could not be reached is not asked again for FailureTTL. aws-sdk-go-v2
// has no such check (its sns package is the API client), so the scheme is
// implemented here from SNS's documentation. A message is taken for a
// tenant only from the topics the tenant configured (`sluice webhook set
// TENANT ses --topic ARN`): anyone can make an SNS topic and sign with it.
// Its Timestamp must be within Tolerance (SNS retries a message with its
// first timestamp, within the hour its delivery policy allows); the replay
// guard keys it by topic and MessageId.
//
// # Subscription
//
// A SubscriptionConfirmation from an allowed topic is confirmed as SNS
// documents it: by fetching its SubscribeURL, which must also be https on
// an SNS host. Raw message delivery must stay off: a raw message carries
// no signature and is refused.
//
// # Events
//
// SNS's Message holds the SES notification (notificationType, or eventType
// for a configuration set's event publishing). A Bounce of bounceType
// Permanent records each bouncedRecipient (the SMTP code read from its
// diagnosticCode); Transient and Undetermined bounces are ignored. A
// Complaint records each complainedRecipient, unless its feedback type is
// not-spam or SES reports an address already on its suppression list.
// Deliveries, sends, opens and clicks are ignored.
package ses

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/webhook"
)

// Name is the provider's name: /v1/webhooks/ses/{tenant}.
const Name = "ses"

// Tolerance is how far an SNS message's Timestamp may be from now: SNS
// keeps it across retries, which an HTTPS delivery policy spreads over at
// most an hour.
const Tolerance = time.Hour

// Provider is SES's notifications through SNS.
type Provider struct {
	// Client fetches signing certificates and subscription confirmations
	// (default: 10 s timeout, no redirects followed).
	Client *http.Client
	// AllowHost reports whether an https URL's host may serve SNS's
	// certificates and SubscribeURLs (default: the SNS host of the topic's
	// region, TopicHost). Tests serve the
	// certificate from loopback through it.
	AllowHost func(host string) bool

	mu     sync.Mutex
	certs  map[string]*x509.Certificate
	failed map[string]time.Time // host → until when it is not asked again
}

var _ webhook.Provider = (*Provider)(nil)

// New returns the provider with its defaults (and, in a binary built
// with the sluice_testhooks tag, the test hooks of testhooks.go).
func New() *Provider {
	p := &Provider{Client: &http.Client{Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	applyTestHooks(p)
	return p
}

// applyTestHooks is set by testhooks.go in test builds only.
var applyTestHooks = func(*Provider) {}

var snsHost = regexp.MustCompile(`^sns\.[a-z0-9-]{3,32}\.amazonaws\.com(\.cn)?$`)

// SNSHost reports whether host (as in a URL, with no port) is one of SNS's
// regional hosts: sns.<region>.amazonaws.com or sns.<region>.amazonaws.com.cn.
func SNSHost(host string) bool { return snsHost.MatchString(host) }

// Name implements webhook.Provider.
func (*Provider) Name() string { return Name }

var topicARN = regexp.MustCompile(`^arn:aws(-cn|-us-gov)?:sns:[a-z0-9-]{3,32}:[0-9]{12}:[A-Za-z0-9_-]{1,256}$`)

// Check needs Topics: the ARNs of the SNS topics SES publishes the
// tenant's notifications to.
func (*Provider) Check(c webhook.Credentials) error {
	if len(c.Topics) == 0 || len(c.Topics) > 16 {
		return fmt.Errorf("%w: topic: name 1 to 16 SNS topic ARNs (arn:aws:sns:REGION:ACCOUNT:NAME)", webhook.ErrCredentials)
	}
	for _, t := range c.Topics {
		if !topicARN.MatchString(t) {
			return fmt.Errorf("%w: topic %q: want an SNS topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME)", webhook.ErrCredentials, t)
		}
	}
	if c.Key != "" || c.User != "" || c.Password != "" || len(c.AllowIPs) > 0 {
		return fmt.Errorf("%w: ses takes topics only", webhook.ErrCredentials)
	}
	return nil
}

// Message is an SNS message as posted to an HTTPS subscription.
type Message struct {
	Type             string  `json:"Type"`
	MessageID        string  `json:"MessageId"`
	Token            string  `json:"Token"`
	TopicArn         string  `json:"TopicArn"`
	Subject          *string `json:"Subject"`
	Message          string  `json:"Message"`
	Timestamp        string  `json:"Timestamp"`
	SignatureVersion string  `json:"SignatureVersion"`
	Signature        string  `json:"Signature"`
	SigningCertURL   string  `json:"SigningCertURL"`
	SubscribeURL     string  `json:"SubscribeURL"`
	UnsubscribeURL   string  `json:"UnsubscribeURL"`
}

// The message types.
const (
	TypeNotification = "Notification"
	TypeSubscribe    = "SubscriptionConfirmation"
	TypeUnsubscribe  = "UnsubscribeConfirmation"
)

// StringToSign is the canonical string SNS signs: each field's name and
// value on lines of their own, in this order — for a Notification
// Message, MessageId, Subject (when the message has one), Timestamp,
// TopicArn, Type; for a (Un)SubscriptionConfirmation Message, MessageId,
// SubscribeURL, Timestamp, Token, TopicArn, Type.
func StringToSign(m Message) (string, error) {
	var b strings.Builder
	add := func(name, value string) { b.WriteString(name + "\n" + value + "\n") }
	switch m.Type {
	case TypeNotification:
		add("Message", m.Message)
		add("MessageId", m.MessageID)
		if m.Subject != nil {
			add("Subject", *m.Subject)
		}
		add("Timestamp", m.Timestamp)
		add("TopicArn", m.TopicArn)
		add("Type", m.Type)
	case TypeSubscribe, TypeUnsubscribe:
		add("Message", m.Message)
		add("MessageId", m.MessageID)
		add("SubscribeURL", m.SubscribeURL)
		add("Timestamp", m.Timestamp)
		add("Token", m.Token)
		add("TopicArn", m.TopicArn)
		add("Type", m.Type)
	default:
		return "", fmt.Errorf("%w: Type %q is not an SNS message type", webhook.ErrMalformed, m.Type)
	}
	return b.String(), nil
}

// Parse reads an SNS message (it checks nothing).
func Parse(body []byte) (Message, error) {
	var m Message
	if err := json.Unmarshal(body, &m); err != nil {
		return Message{}, fmt.Errorf("%w: not an SNS message (JSON)", webhook.ErrMalformed)
	}
	return m, nil
}

// Verify implements webhook.Provider.
func (p *Provider) Verify(ctx context.Context, in webhook.Inbound) (webhook.Batch, error) {
	m, err := Parse(in.Body)
	if err != nil || m.Signature == "" || m.SigningCertURL == "" {
		return webhook.Batch{}, fmt.Errorf("%w: no SNS Signature or SigningCertURL (raw message delivery must be off)", webhook.ErrUnsigned)
	}
	if !slices.Contains(in.Creds.Topics, m.TopicArn) {
		return webhook.Batch{}, fmt.Errorf("%w: TopicArn is not one of the tenant's topics", webhook.ErrNotAllowed)
	}
	if err := p.verifySignature(ctx, m); err != nil {
		return webhook.Batch{}, err
	}
	at, err := time.Parse(time.RFC3339Nano, m.Timestamp)
	if err != nil {
		return webhook.Batch{}, fmt.Errorf("%w: Timestamp", webhook.ErrMalformed)
	}
	if err := webhook.FreshTime(at, in.Now, Tolerance); err != nil {
		return webhook.Batch{}, fmt.Errorf("%w: Timestamp is not within %v of now", err, Tolerance)
	}
	replay := m.TopicArn + "\x00" + m.MessageID
	switch m.Type {
	case TypeNotification:
		b, err := Notification([]byte(m.Message))
		if err != nil {
			return webhook.Batch{}, err
		}
		b.ReplayID, b.ReplayTTL = replay, 2*Tolerance
		return b, nil
	case TypeSubscribe:
		sub, err := p.checkURL(m.SubscribeURL, "SubscribeURL", m.TopicArn)
		if err != nil {
			return webhook.Batch{}, err
		}
		return webhook.Batch{ReplayID: replay, ReplayTTL: 2 * Tolerance, Confirm: func(ctx context.Context) error { return p.confirm(ctx, sub) }}, nil
	}
	return webhook.Batch{ReplayID: replay, ReplayTTL: 2 * Tolerance}, nil // UnsubscribeConfirmation: nothing to do
}

// verifySignature checks m's signature against the certificate at its
// SigningCertURL.
func (p *Provider) verifySignature(ctx context.Context, m Message) error {
	var h crypto.Hash
	switch m.SignatureVersion {
	case "1":
		h = crypto.SHA1
	case "2":
		h = crypto.SHA256
	default:
		return fmt.Errorf("%w: SignatureVersion %q: want 1 or 2", webhook.ErrForged, m.SignatureVersion)
	}
	text, err := StringToSign(m)
	if err != nil {
		return err
	}
	sig, err := base64.StdEncoding.DecodeString(m.Signature)
	if err != nil {
		return fmt.Errorf("%w: Signature is not base64", webhook.ErrForged)
	}
	certURL, err := p.checkURL(m.SigningCertURL, "SigningCertURL", m.TopicArn)
	if err != nil {
		return err
	}
	if !strings.HasSuffix(certURL.Path, ".pem") {
		return fmt.Errorf("%w: SigningCertURL is not a .pem", webhook.ErrForged)
	}
	cert, err := p.cert(ctx, certURL.String())
	if err != nil {
		return err
	}
	key, ok := cert.PublicKey.(*rsa.PublicKey)
	if !ok {
		return fmt.Errorf("%w: the signing certificate's key is not RSA", webhook.ErrForged)
	}
	var digest []byte
	if h == crypto.SHA1 {
		s := sha1.Sum([]byte(text))
		digest = s[:]
	} else {
		s := sha256.Sum256([]byte(text))
		digest = s[:]
	}
	if rsa.VerifyPKCS1v15(key, h, digest, sig) != nil {
		return fmt.Errorf("%w: Signature", webhook.ErrForged)
	}
	return nil
}

// checkURL accepts only https URLs without user info on the SNS host of
// the topic's own region (sns.REGION.amazonaws.com, .amazonaws.com.cn in
// the aws-cn partition): SNS signs a topic's messages with its region's
// certificate, and the topic is one the tenant configured — so the only
// hosts ever looked up are those of regions the tenants named, never one
// a sender chose.
func (p *Provider) checkURL(raw, field, topic string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "https" || u.User != nil || u.Host == "" || u.Fragment != "" {
		return nil, fmt.Errorf("%w: %s is not an https URL", webhook.ErrForged, field)
	}
	if p.AllowHost != nil && p.AllowHost(u.Host) {
		return u, nil
	}
	if want := TopicHost(topic); want == "" || u.Port() != "" || u.Hostname() != want {
		return nil, fmt.Errorf("%w: %s is not on the SNS host of the topic's region (%s)", webhook.ErrForged, field, want)
	}
	return u, nil
}

// TopicHost is the SNS host of a topic ARN's region ("" for no ARN):
// sns.us-east-1.amazonaws.com for arn:aws:sns:us-east-1:…,
// sns.cn-north-1.amazonaws.com.cn for arn:aws-cn:sns:cn-north-1:….
func TopicHost(arn string) string {
	if !topicARN.MatchString(arn) {
		return ""
	}
	parts := strings.SplitN(arn, ":", 5)
	host := "sns." + parts[3] + ".amazonaws.com"
	if parts[1] == "aws-cn" {
		host += ".cn"
	}
	return host
}

// maxCerts bounds the certificate cache (SNS rotates its certificate
// rarely; a region has one at a time).
const maxCerts = 64

// cert returns the certificate at certURL, fetched once.
func (p *Provider) cert(ctx context.Context, certURL string) (*x509.Certificate, error) {
	p.mu.Lock()
	c := p.certs[certURL]
	p.mu.Unlock()
	if c != nil && time.Now().Before(c.NotAfter) {
		return c, nil
	}
	host := hostOf(certURL)
	if until, failed := p.failedUntil(host); failed {
		return nil, fmt.Errorf("%w: signing certificate: %s could not be reached; not asked again until %s", webhook.ErrUnavailable, host, until.UTC().Format(time.TimeOnly))
	}
	raw, err := p.get(ctx, certURL, 16<<10)
	if err != nil {
		p.fail(host)
		return nil, fmt.Errorf("%w: signing certificate: %w", webhook.ErrUnavailable, err)
	}
	block, _ := pem.Decode(raw)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%w: SigningCertURL serves no PEM certificate", webhook.ErrForged)
	}
	c, err = x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: signing certificate: %w", webhook.ErrForged, err)
	}
	if now := time.Now(); now.Before(c.NotBefore) || now.After(c.NotAfter) {
		return nil, fmt.Errorf("%w: the signing certificate is not valid now", webhook.ErrForged)
	}
	p.mu.Lock()
	if p.certs == nil || len(p.certs) >= maxCerts {
		p.certs = map[string]*x509.Certificate{}
	}
	p.certs[certURL] = c
	p.mu.Unlock()
	return c, nil
}

// FailureTTL is how long a certificate host that could not be reached is
// not asked again: each delivery it signs meanwhile is answered 503 at
// once (SNS retries), without a lookup or a connection.
const FailureTTL = time.Minute

func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	return u.Host
}

func (p *Provider) failedUntil(host string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	until, ok := p.failed[host]
	return until, ok && time.Now().Before(until)
}

// fail remembers that host could not be reached, for FailureTTL; at most
// maxCerts hosts (the hosts are those of the tenants' topics' regions).
func (p *Provider) fail(host string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed == nil || len(p.failed) >= maxCerts {
		p.failed = map[string]time.Time{}
	}
	p.failed[host] = time.Now().Add(FailureTTL)
}

// confirm fetches a SubscribeURL: SNS's documented confirmation.
func (p *Provider) confirm(ctx context.Context, u *url.URL) error {
	_, err := p.get(ctx, u.String(), 64<<10)
	return err
}

func (p *Provider) client() *http.Client {
	if p.Client != nil {
		return p.Client
	}
	return http.DefaultClient
}

func (p *Provider) get(ctx context.Context, u string, limit int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client().Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, errors.New("answered " + resp.Status)
	}
	return body, nil
}
