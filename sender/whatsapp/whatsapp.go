// Package whatsapp is the WhatsApp provider for Meta's WhatsApp Cloud API
// (SLUICE_WHATSAPP_SENDER=cloud): template messages with their body
// parameters, and free-form text, POSTed to BASE/{phone-number-id}/messages
// with the system user's access token as a bearer token.
//
// Meta answers a refused message with an error object whose code says why.
// The throughput, pair-rate and spam-rate codes are the provider's
// back-pressure: they become a hold on the business number (the sender), as
// a 429 does on SMS, so every worker waits instead of retrying into the
// wall; a message outside the customer-service window (131047) and other
// refusals are permanent. The codes and their meaning:
// https://developers.facebook.com/docs/whatsapp/cloud-api/support/error-codes
package whatsapp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
)

// Meta's error codes that Sluice acts on.
const (
	// CodeThroughput: the business number's messages per second were exceeded.
	CodeThroughput = 130429
	// CodePairRate: too many messages from the business number to one user
	// in a short time (about one per 6 s, bursts borrowed from the future).
	CodePairRate = 131056
	// CodeUpgrading: the number is being moved to a higher throughput.
	CodeUpgrading = 131057
	// CodeSpamRate: the number's messages were limited for quality.
	CodeSpamRate = 131048
	// CodeReengagement: more than 24 hours since the user last wrote: only a
	// template may start the conversation (the customer-service window).
	CodeReengagement = 131047
	// CodeUndeliverable: the message cannot be delivered to the user (not on
	// WhatsApp, or has not accepted the terms).
	CodeUndeliverable = 131026
)

// PairRateWait is how long a pair-rate refusal holds the number: Meta's
// pair rate is about one message per 6 s.
const PairRateWait = 6 * time.Second

// Config configures a Sender.
type Config struct {
	// BaseURL is the Graph API's base with its version,
	// "https://graph.facebook.com/v23.0".
	BaseURL string
	// Token is the access token (a system user's, with whatsapp_business_messaging).
	Token string
	// From is the default business number: its phone-number id.
	From    string
	Timeout time.Duration
	Client  *http.Client
}

// Sender sends WhatsApp messages through the Cloud API.
type Sender struct {
	cfg    Config
	client *http.Client
}

// NewSender returns a sender for the Cloud API at cfg.BaseURL.
func NewSender(cfg Config) (*Sender, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("whatsapp: base URL %q is not an http(s) URL", cfg.BaseURL)
	}
	cfg.BaseURL = strings.TrimSuffix(cfg.BaseURL, "/")
	c := cfg.Client
	if c == nil {
		c = &http.Client{Timeout: cfg.Timeout}
	}
	return &Sender{cfg: cfg, client: c}, nil
}

// Message is the Cloud API's request body of one message.
type Message struct {
	Product  string       `json:"messaging_product"`
	Type     string       `json:"recipient_type"`
	To       string       `json:"to"`
	Kind     string       `json:"type"`
	Text     *TextBody    `json:"text,omitempty"`
	Template *TemplateMsg `json:"template,omitempty"`
	// Opaque comes back in the message's status webhooks: the notification id.
	Opaque string `json:"biz_opaque_callback_data,omitempty"`
}

// TextBody is a text message's body.
type TextBody struct {
	Body string `json:"body"`
}

// TemplateMsg is a template message: its name, language and components.
type TemplateMsg struct {
	Name       string      `json:"name"`
	Language   Language    `json:"language"`
	Components []Component `json:"components,omitempty"`
}

// Language is a template's language.
type Language struct {
	Code string `json:"code"`
}

// Component is one component of a template (Sluice fills the body's).
type Component struct {
	Type       string      `json:"type"`
	Parameters []Parameter `json:"parameters"`
}

// Parameter is one text parameter.
type Parameter struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// NewMessage is the request body for n.
func NewMessage(n tasks.Notification) Message {
	m := Message{Product: "whatsapp", Type: "individual", To: strings.TrimPrefix(n.To, "+"), Opaque: n.ID}
	if t := n.Template; t != nil {
		m.Kind = "template"
		m.Template = &TemplateMsg{Name: t.Name, Language: Language{Code: t.LanguageOrDefault()}}
		if len(t.Params) > 0 {
			c := Component{Type: "body"}
			for _, p := range t.Params {
				c.Parameters = append(c.Parameters, Parameter{Type: "text", Text: p})
			}
			m.Template.Components = []Component{c}
		}
		return m
	}
	m.Kind, m.Text = "text", &TextBody{Body: n.Body}
	return m
}

// apiError is the Graph API's error object.
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Code    int    `json:"code"`
		Data    struct {
			Details string `json:"details"`
		} `json:"error_data"`
	} `json:"error"`
}

// Send posts n to BASE/{phone-number-id}/messages.
func (s *Sender) Send(ctx context.Context, n tasks.Notification) error {
	if n.Channel != tasks.WhatsApp {
		return &sender.SendError{Err: fmt.Errorf("whatsapp: a %s notification", n.Channel), Permanent: true, NotSent: true}
	}
	from := n.From
	if from == "" {
		from = s.cfg.From
	}
	if from == "" {
		return &sender.SendError{Err: errors.New("whatsapp: no business number (SLUICE_WHATSAPP_PHONE_NUMBER_ID or the notification's from)"), Permanent: true, NotSent: true}
	}
	body, err := json.Marshal(NewMessage(n))
	if err != nil {
		return &sender.SendError{Err: err, Permanent: true, NotSent: true}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.BaseURL+"/"+url.PathEscape(from)+"/messages", bytes.NewReader(body))
	if err != nil {
		return &sender.SendError{Err: err, Permanent: true, NotSent: true}
	}
	req.Header.Set("Authorization", "Bearer "+s.cfg.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		var op interface{ Timeout() bool }
		notSent := strings.Contains(err.Error(), "connection refused") || errors.Is(err, context.Canceled)
		if errors.As(err, &op) && op.Timeout() {
			notSent = false // the request may have left
		}
		return &sender.SendError{Err: fmt.Errorf("whatsapp: %w", err), NotSent: notSent}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode/100 == 2 {
		return nil
	}
	return classify(resp.StatusCode, raw)
}

// classify turns a refusal into a SendError by Meta's code, else by status.
func classify(status int, raw []byte) error {
	var e apiError
	_ = json.Unmarshal(raw, &e)
	code, msg := e.Error.Code, e.Error.Message
	err := fmt.Errorf("whatsapp: %d %s (code %d: %s)", status, http.StatusText(status), code, msg)
	se := &sender.SendError{Err: err, Code: code, NotSent: true}
	switch code {
	case CodePairRate:
		// The pair's own rate: held on the number for the pair's spacing.
		se.Throttled, se.Hold, se.RetryAfter = true, sender.HoldSender, PairRateWait
	case CodeThroughput, CodeUpgrading, CodeSpamRate:
		se.Throttled, se.Hold = true, sender.HoldSender
	case CodeReengagement, CodeUndeliverable:
		se.Permanent = true
	default:
		switch {
		case status == http.StatusTooManyRequests:
			se.Throttled, se.Hold = true, sender.HoldProvider
		case status == http.StatusServiceUnavailable:
		case status >= 500:
			se.NotSent = false // the outcome is unknown
		default:
			se.Permanent = true
		}
	}
	return se
}
