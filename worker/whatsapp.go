package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/tasks"
)

// serviceWindow archives a free-form WhatsApp message (no template) whose
// recipient has not written to the tenant within WhatsApp's 24-hour
// customer-service window (consent.Store.CheckWindow, read each time the
// task runs): Meta would refuse it (131047), and only a template may start
// the conversation. Redis trouble defers the task, sending nothing.
func (w *Worker) serviceWindow(ctx context.Context, n tasks.Notification, log *slog.Logger) error {
	if n.Channel != tasks.WhatsApp || n.Template != nil {
		return nil
	}
	err := w.consent.CheckWindow(ctx, n, time.Now())
	switch {
	case err == nil:
		return nil
	case errors.Is(err, consent.ErrWindowClosed):
		w.archived(n, tasks.ReasonWindow)
		log.Warn("archiving a free-form WhatsApp message: its recipient's customer-service window is closed (no message from it in 24 h); send a template")
		return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonWindow, err), asynq.SkipRetry)
	}
	return &UnavailableError{Err: err}
}
