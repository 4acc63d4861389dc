package telnyx

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
)

// Settings are the provider's SLUICE_TELNYX_* variables (the default
// origin, SMS_FROM, is config.Base's).
type Settings struct {
	APIKey             string               `env:"TELNYX_API_KEY" desc:"Telnyx API key (Bearer) of the Messages API v2, when SLUICE_SMS_SENDER=telnyx." secret:"true"`
	BaseURL            string               `env:"TELNYX_BASE_URL" envDefault:"https://api.telnyx.com" desc:"Base URL of the Telnyx API; messages are POSTed to BASE/v2/messages."`
	MessagingProfileID string               `env:"TELNYX_MESSAGING_PROFILE_ID" desc:"Messaging profile of the messages (sent as messaging_profile_id); with a number pool on the profile, messages may name no from."`
	PublicKey          PublicKey            `env:"TELNYX_PUBLIC_KEY" desc:"The account's Ed25519 public key (base64, Mission Control: Keys & Credentials): the API checks the telnyx-signature-ed25519 of delivery reports and inbound messages with it."`
	WebhookURL         string               `env:"TELNYX_WEBHOOK_URL" desc:"Base URL of sluice api as Telnyx reaches it (e.g. https://sluice.example.com). When set, each SMS asks for its delivery reports at BASE/v1/callbacks/telnyx/TENANT/ID; inbound messages go to BASE/v1/inbound/telnyx/TENANT (the messaging profile's webhook). Workers and the API need the same value; needs TELNYX_PUBLIC_KEY."`
	SuppressCodes      config.SuppressCodes `env:"TELNYX_SUPPRESS_CODES" envDefault:"40001,40300" desc:"Telnyx delivery error codes that mark the recipient undeliverable for the tenant for SMS_SUPPRESS_TTL (from a delivery report, or a refused send): 40001 not routable (a landline), 40300 the recipient texted STOP to the number. none: no code does."`
	Timeout            time.Duration        `env:"TELNYX_TIMEOUT" envDefault:"10s" desc:"Timeout of one Telnyx API request."`
}

// Provider is the entry of sender/providers: SLUICE_SMS_SENDER=telnyx.
var Provider = sender.Provider{Name: "telnyx", Channel: tasks.SMS, Settings: func() sender.Settings { return &Settings{} }}

var (
	_ sender.Settings       = (*Settings)(nil)
	_ sender.SharedSettings = (*Settings)(nil)
)

// Validate records every problem of the settings, for a worker that sends
// through Telnyx.
func (s *Settings) Validate(base config.Base, p *config.Problems) {
	if u, err := url.Parse(s.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.Add("TELNYX_BASE_URL", "must be an http(s) URL, got %q", s.BaseURL)
	}
	if s.APIKey == "" {
		p.Add("TELNYX_API_KEY", "must be set when SLUICE_SMS_SENDER=telnyx")
	}
	if base.SMSFrom == "" && s.MessagingProfileID == "" {
		p.Add("SMS_FROM", "must be set when SLUICE_SMS_SENDER=telnyx, or SLUICE_TELNYX_MESSAGING_PROFILE_ID with a number pool instead")
	}
	if s.Timeout < 10*time.Millisecond {
		p.Add("TELNYX_TIMEOUT", "must be at least 10ms, got %v", s.Timeout)
	}
	s.ValidateShared(p)
}

// ValidateShared records the problems of what the API reads too: the
// webhook base URL, the public key and the suppression codes.
func (s *Settings) ValidateShared(p *config.Problems) {
	if s.WebhookURL == "" {
		return
	}
	u, err := url.Parse(s.WebhookURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		p.Add("TELNYX_WEBHOOK_URL", "must be a base URL like https://sluice.example.com (no user info, query or fragment), got %q", s.WebhookURL)
	}
	if len(s.PublicKey) == 0 {
		p.Add("TELNYX_WEBHOOK_URL", "is set but %sTELNYX_PUBLIC_KEY is not: the API checks every webhook's Ed25519 signature with it", config.EnvPrefix)
	}
}

// PublicKey is TELNYX_PUBLIC_KEY, parsed when the settings are read: the
// account's Ed25519 public key (its base64 in the variable; empty: none).
type PublicKey ed25519.PublicKey

// UnmarshalText reads a base64 Ed25519 public key (32 bytes).
func (k *PublicKey) UnmarshalText(b []byte) error {
	if strings.TrimSpace(string(b)) == "" {
		*k = nil
		return nil
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(raw) != ed25519.PublicKeySize {
		return fmt.Errorf("must be the base64 of a 32-byte Ed25519 public key")
	}
	*k = PublicKey(raw)
	return nil
}

// String writes the key as TELNYX_PUBLIC_KEY takes it.
func (k PublicKey) String() string {
	if len(k) == 0 {
		return ""
	}
	return base64.StdEncoding.EncodeToString(k)
}

// Open returns the sender of the settings.
func (s *Settings) Open(env sender.Env) (sender.Sender, error) {
	return NewSender(Config{BaseURL: s.BaseURL, APIKey: s.APIKey, From: env.Base.SMSFrom, MessagingProfileID: s.MessagingProfileID,
		WebhookURL: s.WebhookURL, Timeout: s.Timeout, Suppress: s.SuppressCodes, SuppressFor: env.Base.SMSSuppressTTL})
}
