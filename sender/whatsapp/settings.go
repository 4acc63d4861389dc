package whatsapp

import (
	"net/url"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
)

// Settings are the provider's SLUICE_WHATSAPP_* variables (the default
// business number, WHATSAPP_PHONE_NUMBER_ID, is config.Base's: sender
// rules count by it).
type Settings struct {
	Token   string        `env:"WHATSAPP_ACCESS_TOKEN" desc:"Access token of the WhatsApp Cloud API (a system user's, with whatsapp_business_messaging), sent as a bearer token, when SLUICE_WHATSAPP_SENDER=cloud." secret:"true"`
	BaseURL string        `env:"WHATSAPP_BASE_URL" envDefault:"https://graph.facebook.com/v23.0" desc:"Base URL of the Graph API with its version; messages are POSTed to BASE/PHONE_NUMBER_ID/messages."`
	Timeout time.Duration `env:"WHATSAPP_TIMEOUT" envDefault:"10s" desc:"Timeout of one Cloud API request."`
}

// Provider is the entry of sender/providers: SLUICE_WHATSAPP_SENDER=cloud.
var Provider = sender.Provider{Name: "cloud", Channel: tasks.WhatsApp, Settings: func() sender.Settings { return &Settings{} }}

var _ sender.Settings = (*Settings)(nil)

// Validate records every problem of the settings, for a worker that sends
// through the Cloud API.
func (s *Settings) Validate(base config.Base, p *config.Problems) {
	if u, err := url.Parse(s.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.Add("WHATSAPP_BASE_URL", "must be an http(s) URL, got %q", s.BaseURL)
	}
	if s.Token == "" {
		p.Add("WHATSAPP_ACCESS_TOKEN", "must be set when SLUICE_WHATSAPP_SENDER=cloud")
	}
	if base.WhatsAppFrom == "" {
		p.Add("WHATSAPP_PHONE_NUMBER_ID", "must be set when SLUICE_WHATSAPP_SENDER=cloud (the business number's phone-number id)")
	}
	if s.Timeout < 10*time.Millisecond {
		p.Add("WHATSAPP_TIMEOUT", "must be at least 10ms, got %v", s.Timeout)
	}
}

// Open returns the sender of the settings.
func (s *Settings) Open(env sender.Env) (sender.Sender, error) {
	return NewSender(Config{BaseURL: s.BaseURL, Token: s.Token, From: env.Base.WhatsAppFrom, Timeout: s.Timeout})
}
