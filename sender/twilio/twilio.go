// Package twilio is the SMS provider for a Twilio-compatible Messages API
// (SLUICE_SMS_SENDER=http): the sender, its settings (SLUICE_SMS_*), and
// the status-callback route it owns, which `sluice api` mounts
// (Callbacks): the provider's signed reports of each message's fate.
package twilio

import (
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
	BaseURL    string // e.g. https://api.twilio.com
	AccountSID string
	AuthToken  string
	// From is the default origin of messages that name none.
	From string
	// MessagingServiceSID, when set, is the default origin instead of From:
	// messages go through this Messaging Service (MessagingServiceSid).
	MessagingServiceSID string
	// StatusCallback is the base URL of sluice api as the provider reaches
	// it; when set, every message asks for status callbacks at
	// StatusCallback + CallbackPath(tenant, id).
	StatusCallback string
	Timeout        time.Duration // per request; default 10s
	Client         *http.Client  // default: a client with Timeout
	// Suppress are the error codes whose refusal puts the recipient on the
	// suppression list (SendError.Suppress), for SuppressFor.
	Suppress    map[int]bool
	SuppressFor time.Duration
}

// Sender sends SMS through a Twilio-compatible Messages API: a form
// POST of To, Body and From (or MessagingServiceSid), and StatusCallback
// when configured, to BASE/2010-04-01/Accounts/SID/Messages.json with basic
// auth. It sends the notification id as Idempotency-Key so a provider that
// honours it drops a repeated request.
type Sender struct {
	endpoint string
	cfg      Config
	client   *http.Client
}

// NewSender returns a sender for the API at cfg.BaseURL.
func NewSender(cfg Config) (*Sender, error) {
	u, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: SMS base URL %q", config.ErrConfig, cfg.BaseURL)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	c := cfg.Client
	if c == nil {
		c = &http.Client{Timeout: cfg.Timeout}
	}
	return &Sender{
		endpoint: u.String() + "/2010-04-01/Accounts/" + url.PathEscape(cfg.AccountSID) + "/Messages.json",
		cfg:      cfg, client: c,
	}, nil
}

// CallbackPath is the path of sluice api that receives the status callbacks
// of one SMS: /v1/callbacks/sms/TENANT/ID. The tenant is in it because a
// notification's records live in its tenant's Redis hash slot.
func CallbackPath(tenant, id string) string {
	return "/v1/callbacks/sms/" + url.PathEscape(tenant) + "/" + url.PathEscape(id)
}

// Send posts one message. 2xx is sent; 429 and 503 are transient and not
// sent (honouring Retry-After), and 429, Twilio 20429 (too many requests)
// and 30001 (queue overflow) are throttling answers that hold the provider
// (30001: the sender) for every worker (SendError.Throttled); other 5xx are transient with an unknown
// outcome; other 4xx are permanent. The provider's error code (Twilio's
// JSON "code") is kept in the SendError.
func (s *Sender) Send(ctx context.Context, n tasks.Notification) error {
	param, origin := tasks.SMSOrigin(n, s.cfg.From, s.cfg.MessagingServiceSID)
	form := url.Values{"To": {n.To}, param: {origin}, "Body": {n.Body}}
	if s.cfg.StatusCallback != "" {
		form.Set("StatusCallback", strings.TrimRight(s.cfg.StatusCallback, "/")+CallbackPath(n.Tenant, n.ID))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return &sender.SendError{Err: err, Permanent: true, NotSent: true}
	}
	req.SetBasicAuth(s.cfg.AccountSID, s.cfg.AuthToken)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", n.ID)
	resp, err := s.client.Do(req)
	if err != nil {
		// Refused connections never reached the provider; anything else may have.
		var op interface{ Timeout() bool }
		notSent := strings.Contains(err.Error(), "connection refused") || errors.Is(err, context.Canceled)
		if errors.As(err, &op) && op.Timeout() {
			notSent = false
		}
		return &sender.SendError{Err: fmt.Errorf("sms api: %w", err), NotSent: notSent}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	err = fmt.Errorf("sms api: HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	code := errorCode(body)
	switch {
	case code == 30001: // queue overflow: the sender's queue at the provider is full
		return &sender.SendError{Err: err, NotSent: true, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()), Code: code,
			Throttled: true, Hold: sender.HoldSender}
	case resp.StatusCode == http.StatusTooManyRequests || code == 20429: // too many requests: the account's rate
		return &sender.SendError{Err: err, NotSent: true, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()), Code: code,
			Throttled: true, Hold: sender.HoldProvider}
	case resp.StatusCode == http.StatusServiceUnavailable:
		return &sender.SendError{Err: err, NotSent: true, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()), Code: code}
	case resp.StatusCode >= 500:
		return &sender.SendError{Err: err, Code: code}
	default:
		return &sender.SendError{Err: err, Permanent: true, NotSent: true, Code: code, Suppress: s.cfg.Suppress[code], SuppressFor: s.cfg.SuppressFor}
	}
}

// errorCode reads the provider's error code from a Twilio-style JSON error
// body ({"code": 21211, "message": ...}); 0 when there is none.
func errorCode(body []byte) int {
	var e struct {
		Code json.Number `json:"code"`
	}
	if json.Unmarshal(body, &e) != nil {
		return 0
	}
	n, err := strconv.Atoi(e.Code.String())
	if err != nil || n < 0 || n > 999999 {
		return 0
	}
	return n
}

// parseRetryAfter reads delay-seconds or an HTTP date; 0 when absent or bad.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return min(time.Duration(s)*time.Second, time.Hour)
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), time.Hour)
	}
	return 0
}
