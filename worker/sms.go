package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/tasks"
)

// HTTPSMSConfig configures an HTTPSMSSender.
type HTTPSMSConfig struct {
	BaseURL    string // e.g. https://api.twilio.com
	AccountSID string
	AuthToken  string
	From       string
	Timeout    time.Duration // per request; default 10s
	Client     *http.Client  // default: a client with Timeout
}

// HTTPSMSSender sends SMS through a Twilio-compatible Messages API: a form
// POST of To, From and Body to BASE/2010-04-01/Accounts/SID/Messages.json
// with basic auth. It sends the notification id as Idempotency-Key so a
// provider that honours it drops a repeated request.
type HTTPSMSSender struct {
	endpoint string
	cfg      HTTPSMSConfig
	client   *http.Client
}

// NewHTTPSMSSender returns a sender for the API at cfg.BaseURL.
func NewHTTPSMSSender(cfg HTTPSMSConfig) (*HTTPSMSSender, error) {
	u, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: SMS base URL %q", ErrConfig, cfg.BaseURL)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	c := cfg.Client
	if c == nil {
		c = &http.Client{Timeout: cfg.Timeout}
	}
	return &HTTPSMSSender{
		endpoint: u.String() + "/2010-04-01/Accounts/" + url.PathEscape(cfg.AccountSID) + "/Messages.json",
		cfg:      cfg, client: c,
	}, nil
}

// Send posts one message. 2xx is sent; 429 and 503 are transient and not
// sent (honouring Retry-After); other 5xx are transient with an unknown
// outcome; other 4xx are permanent.
func (s *HTTPSMSSender) Send(ctx context.Context, n tasks.Notification) error {
	from := n.From
	if from == "" {
		from = s.cfg.From
	}
	form := url.Values{"To": {n.To}, "From": {from}, "Body": {n.Body}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return &SendError{Err: err, Permanent: true, NotSent: true}
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
		return &SendError{Err: fmt.Errorf("sms api: %w", err), NotSent: notSent}
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	err = fmt.Errorf("sms api: HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(body)))
	switch {
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		return &SendError{Err: err, NotSent: true, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	case resp.StatusCode >= 500:
		return &SendError{Err: err}
	default:
		return &SendError{Err: err, Permanent: true, NotSent: true}
	}
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
