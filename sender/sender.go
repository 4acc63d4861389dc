// Package sender is what the worker sends through: one small interface,
// one error type that classifies a failure, and the Provider that names a
// provider package, reads its own settings and opens its Sender.
//
// Each provider is a package of its own — sender/smtp (SMTP with DKIM),
// sender/twilio (a Twilio-compatible Messages API, with the status-callback
// route it owns), sender/logsender — and sender/providers lists them: a new
// provider is a new package and one line there. A provider reads its
// settings from SLUICE_* variables (config.Read on its Settings struct) and
// validates them itself, naming each variable; the configuration table and
// the unknown-variable check take their names from it.
package sender

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/tasks"
)

// Sender delivers notifications of one channel. Send returns nil once the
// provider has accepted the message, and otherwise a *SendError (or any
// error, taken as transient with an unknown outcome).
type Sender interface {
	Send(ctx context.Context, n tasks.Notification) error
}

// Named is one provider of a channel's list (SLUICE_SMS_PROVIDERS), by
// its name there.
type Named struct {
	Name   string
	Sender Sender
}

// SendError classifies a failed send.
type SendError struct {
	Err error
	// Permanent: retrying cannot help (SMTP 5xx, HTTP 4xx); the task is archived.
	Permanent bool
	// NotSent: the provider definitely did not take the message, so its quota
	// slot is released. False when the outcome is unknown (e.g. a timeout
	// after the request went out).
	NotSent bool
	// RetryAfter is the provider's requested delay (HTTP Retry-After); 0 if none.
	RetryAfter time.Duration
	// Code is the provider's error code (Twilio's "code", e.g. 21211 for an
	// invalid number); 0 if none.
	Code int
	// Suppress: the refusal says the recipient cannot (or must not) receive
	// this channel any more (an invalid or unsubscribed number): the worker
	// puts it on the tenant's suppression list for SuppressFor.
	Suppress    bool
	SuppressFor time.Duration
	// Throttled: the provider pushes back on volume (HTTP 429, Twilio 20429
	// or 30001, SMTP 421/451/452/454): the worker holds Hold's scope for
	// every worker (RetryAfter when set, else an exponential hold), without
	// spending the task's retry budget.
	Throttled bool
	// Hold is the scope a throttling answer holds: HoldProvider (the
	// channel's provider account) or HoldSender (the origin: From number,
	// sender id, messaging service or From address).
	Hold string
}

// The scopes a throttling answer holds (SendError.Hold).
const (
	HoldProvider = "provider"
	HoldSender   = "sender"
)

// SMTPThrottleCodes are the SMTP replies that mean "too much, slow down":
// 421 (service not available, closing: SES's and Gmail's throttling), 451
// (local error, rate limited), 452 (insufficient storage, too many
// recipients) and 454 (temporary failure: SES's sending-quota answer).
var SMTPThrottleCodes = map[int]bool{421: true, 451: true, 452: true, 454: true}

func (e *SendError) Error() string {
	kind := "transient"
	if e.Permanent {
		kind = "permanent"
	}
	return fmt.Sprintf("send failed (%s): %v", kind, e.Err)
}

func (e *SendError) Unwrap() error { return e.Err }

// ErrNoSender reports a task for a channel the worker has no sender for.
var ErrNoSender = errors.New("no sender for channel")

// Env is what a provider's Open gets from the command opening it.
type Env struct {
	Log *slog.Logger
	// Base is the shared settings: the default origins (SMTP_FROM,
	// SMS_FROM, SMS_MESSAGING_SERVICE_SID), the dedupe TTL, ...
	Base config.Base
}

// Settings are one provider's settings: a pointer to a struct whose fields
// carry env, envDefault and desc tags, read with config.Read.
type Settings interface {
	// Validate records every problem in p, naming the variable.
	Validate(base config.Base, p *config.Problems)
	// Open returns the provider's sender; it does not connect yet.
	Open(env Env) (Sender, error)
}

// SharedSettings are settings of which some are read by other commands
// too (a provider's status callbacks, which the API serves): their
// ValidateShared runs whichever provider the worker selected, so a broken
// variable is an error wherever it is read.
type SharedSettings interface {
	Settings
	ValidateShared(p *config.Problems)
}

// Provider is one provider package's entry in sender/providers.
type Provider struct {
	// Name is the value of the channel's SLUICE_EMAIL_SENDER or
	// SLUICE_SMS_SENDER that selects it.
	Name    string
	Channel tasks.Channel
	// Settings returns new, zero settings (nil: the provider has none).
	Settings func() Settings
}

// NewSettings returns the provider's settings read from environ (nil: the
// process environment), or nil when it has none.
func (p Provider) NewSettings(environ map[string]string) (Settings, error) {
	if p.Settings == nil {
		return nil, nil
	}
	s := p.Settings()
	if err := config.Read(environ, s); err != nil {
		return nil, err
	}
	return s, nil
}

// Lookup finds the provider of ch named name in ps.
func Lookup(ps []Provider, ch tasks.Channel, name string) (Provider, bool) {
	for _, p := range ps {
		if p.Channel == ch && p.Name == name {
			return p, true
		}
	}
	return Provider{}, false
}

// Names lists the names of ps's providers of ch.
func Names(ps []Provider, ch tasks.Channel) []string {
	var out []string
	for _, p := range ps {
		if p.Channel == ch {
			out = append(out, p.Name)
		}
	}
	return out
}

// Vars lists every variable the providers read, each once, in order.
func Vars(ps []Provider) []config.Var {
	seen := map[string]bool{}
	var out []config.Var
	for _, p := range ps {
		if p.Settings == nil {
			continue
		}
		for _, v := range config.Vars(p.Settings()) {
			if !seen[v.Name] {
				seen[v.Name] = true
				out = append(out, v)
			}
		}
	}
	return out
}

// ReadShared reads provider p's settings of type S from environ (nil:
// the process environment) and checks those its routes on the API process
// read (S's ValidateShared: a webhook's signing key, its base URL): what a
// provider's webhook routes need, without the sending settings a worker
// checks.
func ReadShared[S any, PS interface {
	*S
	ValidateShared(*config.Problems)
}](p Provider, environ map[string]string) (S, error) {
	var zero S
	st, err := p.NewSettings(environ)
	if err != nil {
		return zero, err
	}
	ps, ok := st.(PS)
	if !ok {
		return zero, fmt.Errorf("sender: %s's settings are %T, not %T", p.Name, st, ps)
	}
	var problems config.Problems
	ps.ValidateShared(&problems)
	return *ps, problems.Err()
}
