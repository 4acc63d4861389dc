package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/tasks"
)

// Sender delivers notifications of one channel. Send returns nil once the
// provider has accepted the message, and otherwise a *SendError (or any
// error, taken as transient with an unknown outcome).
type Sender interface {
	Send(ctx context.Context, n tasks.Notification) error
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
}

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

// LogSender writes each notification to the log instead of sending it.
// Recipients are masked at info level.
type LogSender struct {
	Logger *slog.Logger
}

// Send logs n.
func (s LogSender) Send(ctx context.Context, n tasks.Notification) error {
	s.Logger.LogAttrs(ctx, slog.LevelInfo, "sent (log sender)",
		slog.String("channel", string(n.Channel)), slog.String("tenant", n.Tenant),
		slog.String("id", n.ID), slog.String("to", tasks.Mask(n.To)))
	return nil
}
