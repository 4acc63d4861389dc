package smtp

import (
	"fmt"
	"net/mail"
	"strings"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
)

// Settings are the provider's SLUICE_SMTP_* and SLUICE_DKIM_* variables
// (the default From, SMTP_FROM, is config.Base's: sender rules need it
// whichever provider sends).
type Settings struct {
	Host           string        `env:"SMTP_HOST" envDefault:"localhost" desc:"SMTP server host."`
	Port           int           `env:"SMTP_PORT" envDefault:"587" desc:"SMTP server port."`
	TLS            string        `env:"SMTP_TLS" envDefault:"starttls" desc:"SMTP transport security: starttls (required), opportunistic, tls (implicit, port 465), none."`
	CAFile         string        `env:"SMTP_CA_FILE" desc:"PEM file of CA certificates to trust for the SMTP server instead of the system roots (they replace them; append the system bundle to the file to trust both); empty: the system roots. The certificate must name SMTP_HOST. Not allowed with SMTP_TLS=none."`
	Username       string        `env:"SMTP_USERNAME" desc:"SMTP AUTH user; empty disables AUTH. Needs SMTP_TLS starttls or tls unless SMTP_ALLOW_PLAIN_AUTH=true."`
	Password       string        `env:"SMTP_PASSWORD" desc:"SMTP AUTH password." secret:"true"`
	AllowPlainAuth bool          `env:"SMTP_ALLOW_PLAIN_AUTH" envDefault:"false" desc:"Allow SMTP AUTH with SMTP_TLS none or opportunistic, where the password (PLAIN or LOGIN) may cross the network unencrypted; without it such a configuration is refused."`
	Conns          int           `env:"SMTP_CONNECTIONS" envDefault:"4" desc:"SMTP connections kept open and reused per worker."`
	Timeout        time.Duration `env:"SMTP_TIMEOUT" envDefault:"15s" desc:"Timeout of one SMTP dial or send."`
	DKIMDomain     string        `env:"DKIM_DOMAIN" desc:"DKIM signing domain (d=); with DKIM_SELECTOR and DKIM_KEY_FILE (all three or none) the smtp sender signs every email. For DMARC it should be the From domain (SMTP_FROM's and any per-notification from) or a parent of it."`
	DKIMSelector   string        `env:"DKIM_SELECTOR" desc:"DKIM selector (s=): receivers fetch the public key from the TXT record SELECTOR._domainkey.DKIM_DOMAIN."`
	DKIMKeyFile    string        `env:"DKIM_KEY_FILE" desc:"PEM file of the DKIM private key: RSA (PKCS #1 or #8, at least 1024 bits, 2048 recommended) or Ed25519 (PKCS #8), unencrypted."`
	DKIMHeaders    []string      `env:"DKIM_HEADERS" envSeparator:"," envDefault:"From,To,Subject,Date,Message-ID,MIME-Version,Content-Type,Reply-To,List-Unsubscribe,List-Unsubscribe-Post" desc:"Comma-separated header fields the DKIM signature covers (h=); must include From. A listed field a message lacks is signed as absent, so a relay cannot add it."`
}

// Provider is the entry of sender/providers: SLUICE_EMAIL_SENDER=smtp.
var Provider = sender.Provider{Name: "smtp", Channel: tasks.Email, Settings: func() sender.Settings { return &Settings{} }}

// Validate records every problem of the settings: the server, TLS, AUTH
// (which needs TLS unless allowed in the clear), and DKIM (all three of
// domain, selector and key or none, and a usable key).
func (s *Settings) Validate(base config.Base, p *config.Problems) {
	if s.Host == "" {
		p.Add("SMTP_HOST", "must be set when SLUICE_EMAIL_SENDER=smtp")
	}
	if s.Port < 1 || s.Port > 65535 {
		p.Add("SMTP_PORT", "must be a port number, got %d", s.Port)
	}
	switch s.TLS {
	case "starttls", "opportunistic", "tls", "none":
	default:
		p.Add("SMTP_TLS", "must be starttls, opportunistic, tls or none, got %q", s.TLS)
	}
	if _, err := mail.ParseAddress(base.SMTPFrom); err != nil {
		p.Add("SMTP_FROM", "must be an email address when SLUICE_EMAIL_SENDER=smtp, got %q", base.SMTPFrom)
	}
	if s.CAFile != "" {
		if s.TLS == "none" {
			p.Add("SMTP_CA_FILE", "is set but %sSMTP_TLS=none: the connection would not use TLS", config.EnvPrefix)
		} else if _, err := config.LoadCAFile(s.CAFile); err != nil {
			p.Add("SMTP_CA_FILE", "%v", err)
		}
	}
	if s.Username != "" && (s.TLS == "none" || s.TLS == "opportunistic") && !s.AllowPlainAuth {
		p.Add("SMTP_USERNAME", "is set with %sSMTP_TLS=%s: the password could cross the network unencrypted; use %sSMTP_TLS=starttls or tls, or set %sSMTP_ALLOW_PLAIN_AUTH=true",
			config.EnvPrefix, s.TLS, config.EnvPrefix, config.EnvPrefix)
	}
	if s.Conns < 1 || s.Conns > 100 {
		p.Add("SMTP_CONNECTIONS", "must be between 1 and 100, got %d", s.Conns)
	}
	if s.Timeout < 10*time.Millisecond {
		p.Add("SMTP_TIMEOUT", "must be at least 10ms, got %v", s.Timeout)
	}
	s.validateDKIM(p)
}

// validateDKIM checks the DKIM_* variables: the three main ones are set
// together or not at all, and the key file must hold a usable key.
func (s *Settings) validateDKIM(p *config.Problems) {
	if err := checkDKIMHeaders(s.dkimHeaders()); err != nil {
		p.Add("DKIM_HEADERS", "%v", err)
	}
	vars := []struct{ name, value string }{{"DKIM_DOMAIN", s.DKIMDomain}, {"DKIM_SELECTOR", s.DKIMSelector}, {"DKIM_KEY_FILE", s.DKIMKeyFile}}
	var set []string
	for _, v := range vars {
		if v.value != "" {
			set = append(set, config.EnvPrefix+v.name)
		}
	}
	if len(set) == 0 {
		return
	}
	for _, v := range vars {
		if v.value == "" {
			p.Add(v.name, "must be set too: DKIM needs %sDKIM_DOMAIN, %sDKIM_SELECTOR and %sDKIM_KEY_FILE together, or none (set: %s)",
				config.EnvPrefix, config.EnvPrefix, config.EnvPrefix, strings.Join(set, ", "))
		}
	}
	if s.DKIMDomain != "" {
		if err := checkDKIMDomain(s.DKIMDomain); err != nil {
			p.Add("DKIM_DOMAIN", "%v", err)
		}
	}
	if s.DKIMSelector != "" {
		if err := checkDKIMSelector(s.DKIMSelector); err != nil {
			p.Add("DKIM_SELECTOR", "%v", err)
		}
	}
	if s.DKIMKeyFile != "" {
		if _, err := LoadDKIMKey(s.DKIMKeyFile); err != nil {
			p.Add("DKIM_KEY_FILE", "%v", err)
		}
	}
}

// dkimHeaders is DKIMHeaders with spaces around the names trimmed and
// empty entries dropped.
func (s *Settings) dkimHeaders() []string {
	var out []string
	for _, h := range s.DKIMHeaders {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	return out
}

// DKIM returns the signing configuration, nil when DKIM is off.
func (s *Settings) DKIM() (*DKIMConfig, error) {
	if s.DKIMDomain == "" && s.DKIMSelector == "" && s.DKIMKeyFile == "" {
		return nil, nil
	}
	key, err := LoadDKIMKey(s.DKIMKeyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %sDKIM_KEY_FILE %w", config.ErrConfig, config.EnvPrefix, err)
	}
	return &DKIMConfig{Domain: s.DKIMDomain, Selector: s.DKIMSelector, Key: key, Headers: s.dkimHeaders()}, nil
}

// Open returns the sender of the settings (it dials lazily), logging how
// it signs.
func (s *Settings) Open(env sender.Env) (sender.Sender, error) {
	dkimCfg, err := s.DKIM()
	if err != nil {
		return nil, err
	}
	if dkimCfg != nil {
		env.Log.Info("signing email with DKIM", "domain", dkimCfg.Domain, "selector", dkimCfg.Selector, "headers", strings.Join(dkimCfg.Headers, ":"))
		if !dkimAligned(env.Base.SMTPFrom, dkimCfg.Domain) {
			env.Log.Warn("the DKIM domain is not SMTP_FROM's domain nor a parent or subdomain of it: DMARC will not count the signature for mail from it",
				"dkim_domain", dkimCfg.Domain, "smtp_from", env.Base.SMTPFrom)
		}
	}
	return NewSender(Config{Host: s.Host, Port: s.Port, TLS: s.TLS, CAFile: s.CAFile,
		Username: s.Username, Password: s.Password, AllowPlainAuth: s.AllowPlainAuth,
		From: env.Base.SMTPFrom, Conns: s.Conns, Timeout: s.Timeout, DKIM: dkimCfg})
}
