// Package webhooksms is a third SMS provider that exists to show (and test)
// what adding one takes: this package and one line in sender/providers. It
// POSTs each SMS as JSON to SLUICE_WEBHOOK_SMS_URL; a 2xx is sent, a 4xx
// a permanent refusal, anything else transient. It is not registered in
// the binary; sender/providers' test registers it.
package webhooksms

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
)

// Settings are the provider's own variables.
type Settings struct {
	URL     string        `env:"WEBHOOK_SMS_URL" desc:"URL each SMS is POSTed to as JSON (SLUICE_SMS_SENDER=webhook)."`
	Timeout time.Duration `env:"WEBHOOK_SMS_TIMEOUT" envDefault:"5s" desc:"Timeout of one webhook request."`
}

// Validate names every bad variable.
func (s *Settings) Validate(_ config.Base, p *config.Problems) {
	if u, err := url.Parse(s.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.Add("WEBHOOK_SMS_URL", "must be an http(s) URL when SLUICE_SMS_SENDER=webhook, got %q", s.URL)
	}
	if s.Timeout <= 0 {
		p.Add("WEBHOOK_SMS_TIMEOUT", "must be positive, got %v", s.Timeout)
	}
}

// Open returns the sender.
func (s *Settings) Open(env sender.Env) (sender.Sender, error) {
	return &Sender{url: s.URL, from: env.Base.SMSFrom, client: &http.Client{Timeout: s.Timeout}}, nil
}

// Provider is the entry for sender/providers.
var Provider = sender.Provider{Name: "webhook", Channel: tasks.SMS, Settings: func() sender.Settings { return &Settings{} }}

// Sender posts SMS to the webhook.
type Sender struct {
	url, from string
	client    *http.Client
}

// Message is the JSON body of one SMS.
type Message struct {
	ID   string `json:"id"`
	From string `json:"from"`
	To   string `json:"to"`
	Body string `json:"body"`
}

// Send posts n.
func (s *Sender) Send(ctx context.Context, n tasks.Notification) error {
	from := n.From
	if from == "" {
		from = s.from
	}
	body, err := json.Marshal(Message{ID: n.ID, From: from, To: n.To, Body: n.Body})
	if err != nil {
		return &sender.SendError{Err: err, Permanent: true, NotSent: true}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, bytes.NewReader(body))
	if err != nil {
		return &sender.SendError{Err: err, Permanent: true, NotSent: true}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", n.ID)
	resp, err := s.client.Do(req)
	if err != nil {
		return &sender.SendError{Err: err} // the outcome is unknown
	}
	resp.Body.Close()
	switch {
	case resp.StatusCode/100 == 2:
		return nil
	case resp.StatusCode/100 == 4:
		return &sender.SendError{Err: fmt.Errorf("webhook answered %s", resp.Status), Permanent: true, NotSent: true}
	}
	return &sender.SendError{Err: fmt.Errorf("webhook answered %s", resp.Status), NotSent: true}
}
