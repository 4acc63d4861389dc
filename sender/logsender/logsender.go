// Package logsender is the provider that sends nothing: each notification
// is written to the log (recipient masked). It is the default for both
// channels (SLUICE_EMAIL_SENDER=log, SLUICE_SMS_SENDER=log) and what
// `sluice dev` and the benchmarks use.
package logsender

import (
	"context"
	"log/slog"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
)

// Sender writes each notification to the log instead of sending it.
type Sender struct {
	Logger *slog.Logger
}

// Send logs n.
func (s Sender) Send(ctx context.Context, n tasks.Notification) error {
	s.Logger.LogAttrs(ctx, slog.LevelInfo, "sent (log sender)",
		slog.String("channel", string(n.Channel)), slog.String("tenant", n.Tenant),
		slog.String("id", n.ID), slog.String("to", tasks.Mask(n.To)))
	return nil
}

// settings: the log sender has none.
type settings struct{}

func (*settings) Validate(config.Base, *config.Problems) {}

func (*settings) Open(env sender.Env) (sender.Sender, error) { return Sender{Logger: env.Log}, nil }

func newSettings() sender.Settings { return &settings{} }

// Email and SMS are the log sender's entries in sender/providers.
var (
	Email    = sender.Provider{Name: "log", Channel: tasks.Email, Settings: newSettings}
	SMS      = sender.Provider{Name: "log", Channel: tasks.SMS, Settings: newSettings}
	WhatsApp = sender.Provider{Name: "log", Channel: tasks.WhatsApp, Settings: newSettings}
)
