// Package telnyx is the SMS provider for Telnyx's Messages API v2
// (SLUICE_SMS_SENDER=telnyx): the sender, its settings (SLUICE_TELNYX_*),
// and the two webhook routes it owns, which `sluice api` mounts: delivery
// reports (Callbacks), recorded on the notification like Twilio's status
// callbacks, and inbound messages (Inbound), handed to sender/inbound
// (STOP opts the number out).
//
// Telnyx signs every webhook with Ed25519: telnyx-signature-ed25519 is the
// base64 signature, by the account's key, of the telnyx-timestamp header's
// value, "|", and the raw body. A webhook without a valid signature, or
// signed more than Tolerance from now, is refused (403) before anything is
// read into Redis; a repeated event id changes nothing.
package telnyx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
)

// Config configures a Sender.
type Config struct {
	BaseURL, APIKey string
	// From is the default origin of messages that name none.
	From               string
	MessagingProfileID string
	// WebhookURL is the base URL of sluice api as Telnyx reaches it; when
	// set, every message asks for its delivery reports at WebhookURL +
	// CallbackPath(tenant, id).
	WebhookURL string
	Timeout    time.Duration
	Client     *http.Client
	// Suppress are the error codes whose refusal marks the recipient
	// undeliverable (SendError.Suppress), for SuppressFor.
	Suppress    map[int]bool
	SuppressFor time.Duration
}

// Sender sends SMS through Telnyx's Messages API v2: a JSON POST of from,
// to, text (and messaging_profile_id, webhook_url) to BASE/v2/messages
// with the API key as a bearer token.
type Sender struct {
	endpoint string
	cfg      Config
	client   *http.Client
}

// NewSender returns a sender for the API at cfg.BaseURL.
func NewSender(cfg Config) (*Sender, error) {
	u, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: Telnyx base URL %q", config.ErrConfig, cfg.BaseURL)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	c := cfg.Client
	if c == nil {
		c = &http.Client{Timeout: cfg.Timeout}
	}
	return &Sender{endpoint: u.String() + "/v2/messages", cfg: cfg, client: c}, nil
}

// CallbackPath is the path of sluice api that receives the delivery
// reports of one SMS: /v1/callbacks/telnyx/TENANT/ID.
func CallbackPath(tenant, id string) string {
	return "/v1/callbacks/telnyx/" + url.PathEscape(tenant) + "/" + url.PathEscape(id)
}

// Message is the body of POST /v2/messages as Sluice sends it.
type Message struct {
	From               string `json:"from,omitempty"`
	To                 string `json:"to"`
	Text               string `json:"text"`
	MessagingProfileID string `json:"messaging_profile_id,omitempty"`
	WebhookURL         string `json:"webhook_url,omitempty"`
	UseProfileWebhooks *bool  `json:"use_profile_webhooks,omitempty"`
}

// Send posts one message. 2xx is sent; 429 is a throttling answer that
// holds the provider for every worker (SendError.Throttled); 503 is
// transient and not sent; other 5xx transient with an unknown outcome;
// other 4xx permanent, with Telnyx's error code kept.
func (s *Sender) Send(ctx context.Context, n tasks.Notification) error {
	param, origin := tasks.SMSOrigin(n, s.cfg.From, "")
	if param != tasks.ParamFrom {
		return &sender.SendError{Err: errors.New("telnyx: a Messaging Service SID is Twilio's; Telnyx sends from a number or its messaging profile"), Permanent: true, NotSent: true}
	}
	m := Message{From: origin, To: n.To, Text: n.Body, MessagingProfileID: s.cfg.MessagingProfileID}
	if s.cfg.WebhookURL != "" {
		no := false
		m.WebhookURL, m.UseProfileWebhooks = strings.TrimRight(s.cfg.WebhookURL, "/")+CallbackPath(n.Tenant, n.ID), &no
	}
	body, err := json.Marshal(m)
	if err != nil {
		return &sender.SendError{Err: err, Permanent: true, NotSent: true}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.endpoint, bytes.NewReader(body))
	if err != nil {
		return &sender.SendError{Err: err, Permanent: true, NotSent: true}
	}
	req.Header.Set("Authorization", "Bearer "+s.cfg.APIKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Idempotency-Key", n.ID)
	resp, err := s.client.Do(req)
	if err != nil {
		var op interface{ Timeout() bool }
		notSent := strings.Contains(err.Error(), "connection refused") || errors.Is(err, context.Canceled)
		if errors.As(err, &op) && op.Timeout() {
			notSent = false
		}
		return &sender.SendError{Err: fmt.Errorf("telnyx: %w", err), NotSent: notSent}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	return s.refusal(resp, raw)
}

// refusal classifies a non-2xx answer.
func (s *Sender) refusal(resp *http.Response, raw []byte) error {
	err := fmt.Errorf("telnyx: HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(raw)))
	code := ErrorCode(raw)
	ra := retryAfter(resp.Header.Get("Retry-After"))
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		return &sender.SendError{Err: err, NotSent: true, RetryAfter: ra, Code: code, Throttled: true, Hold: sender.HoldProvider}
	case resp.StatusCode == http.StatusServiceUnavailable:
		return &sender.SendError{Err: err, NotSent: true, RetryAfter: ra, Code: code}
	case resp.StatusCode >= 500:
		return &sender.SendError{Err: err, Code: code}
	}
	return &sender.SendError{Err: err, Permanent: true, NotSent: true, Code: code, Suppress: s.cfg.Suppress[code], SuppressFor: s.cfg.SuppressFor}
}

// ErrorCode reads the code of the first error of a Telnyx error body
// ({"errors": [{"code": "40012", ...}]}); 0 when there is none.
func ErrorCode(body []byte) int {
	var e struct {
		Errors []struct {
			Code json.RawMessage `json:"code"`
		} `json:"errors"`
	}
	if json.Unmarshal(body, &e) != nil || len(e.Errors) == 0 {
		return 0
	}
	n, err := strconv.Atoi(strings.Trim(string(e.Errors[0].Code), `"`))
	if err != nil || n < 0 || n > 999999 {
		return 0
	}
	return n
}

func retryAfter(v string) time.Duration {
	s, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || s < 0 {
		return 0
	}
	return min(time.Duration(s)*time.Second, time.Hour)
}
