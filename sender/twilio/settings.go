package twilio

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
)

// Settings are the provider's SLUICE_SMS_* variables (the default origin,
// SMS_FROM and SMS_MESSAGING_SERVICE_SID, and the suppression codes are
// config.Base's: every reader needs them).
type Settings struct {
	BaseURL           string        `env:"SMS_BASE_URL" envDefault:"https://api.twilio.com" desc:"Base URL of the Twilio-compatible API; messages are POSTed to BASE/2010-04-01/Accounts/SID/Messages.json."`
	AccountSID        string        `env:"SMS_ACCOUNT_SID" desc:"Account SID (basic-auth user)."`
	AuthToken         string        `env:"SMS_AUTH_TOKEN" desc:"Auth token (basic-auth password); the API checks the X-Twilio-Signature of status callbacks with it." secret:"true"`
	Timeout           time.Duration `env:"SMS_TIMEOUT" envDefault:"10s" desc:"Timeout of one SMS API request."`
	StatusCallbackURL string        `env:"SMS_STATUS_CALLBACK_URL" desc:"Base URL of sluice api as the SMS provider reaches it (e.g. https://sluice.example.com). When set, each SMS asks for status callbacks at BASE/v1/callbacks/sms/TENANT/ID; the API checks their X-Twilio-Signature with SMS_AUTH_TOKEN and reports delivered, undelivered or failed. A path in it is one a proxy strips before the API. Workers and the API need the same value."`
}

// Provider is the entry of sender/providers: SLUICE_SMS_SENDER=http.
var Provider = sender.Provider{Name: "http", Channel: tasks.SMS, Settings: func() sender.Settings { return &Settings{} }}

// Validate records every problem of the settings, for a worker that sends
// through the provider.
func (s *Settings) Validate(base config.Base, p *config.Problems) {
	if u, err := url.Parse(s.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.Add("SMS_BASE_URL", "must be an http(s) URL, got %q", s.BaseURL)
	}
	if s.AccountSID == "" {
		p.Add("SMS_ACCOUNT_SID", "must be set when SLUICE_SMS_SENDER=http")
	}
	if s.AuthToken == "" {
		p.Add("SMS_AUTH_TOKEN", "must be set when SLUICE_SMS_SENDER=http")
	}
	if base.SMSFrom == "" && base.SMSMessagingServiceSID == "" {
		p.Add("SMS_FROM", "must be set when SLUICE_SMS_SENDER=http, or SLUICE_SMS_MESSAGING_SERVICE_SID instead: the From number (or the Messaging Service) of messages that name none")
	}
	if s.Timeout < 10*time.Millisecond {
		p.Add("SMS_TIMEOUT", "must be at least 10ms, got %v", s.Timeout)
	}
	s.ValidateShared(p)
}

// ValidateShared records the problems of the status-callback settings,
// which the API reads too: they are checked whichever SMS sender the
// worker runs (sender.SharedSettings).
func (s *Settings) ValidateShared(p *config.Problems) {
	if s.StatusCallbackURL == "" {
		return
	}
	if err := checkCallbackBase(s.StatusCallbackURL); err != nil {
		p.Add("SMS_STATUS_CALLBACK_URL", "%v", err)
	}
	if s.AuthToken == "" {
		p.Add("SMS_STATUS_CALLBACK_URL", "is set but %sSMS_AUTH_TOKEN is not: the API checks each callback's X-Twilio-Signature with it", config.EnvPrefix)
	}
}

// Open returns the sender of the settings.
func (s *Settings) Open(env sender.Env) (sender.Sender, error) {
	codes := env.Base.SMSSuppressCodes
	return NewSender(Config{BaseURL: s.BaseURL, AccountSID: s.AccountSID, AuthToken: s.AuthToken, From: env.Base.SMSFrom,
		MessagingServiceSID: env.Base.SMSMessagingServiceSID, StatusCallback: s.StatusCallbackURL, Timeout: s.Timeout,
		Suppress: codes, SuppressFor: env.Base.SMSSuppressTTL})
}

// checkCallbackBase says what is wrong with SMS_STATUS_CALLBACK_URL.
func checkCallbackBase(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("must be an http(s) URL like https://sluice.example.com, got %q", raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(raw, "?") || strings.HasSuffix(raw, "#") {
		return fmt.Errorf("must be a base URL without user info, query or fragment (the path /v1/callbacks/sms/TENANT/ID is added to it), got %q", raw)
	}
	return nil
}
