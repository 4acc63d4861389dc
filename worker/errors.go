package worker

import (
	"time"

	"github.com/sluicehq/sluice/tasks"
)

// ThrottledError is returned to Asynq for a task whose slot lies ahead. It
// is not a failure: the task is rescheduled for WakeAt without spending a retry.
type ThrottledError struct {
	// RetryAt is the slot, in this host's clock.
	RetryAt time.Time
	// WakeAt is when Asynq should run the task again (see WakeTime).
	WakeAt time.Time
	// Rule is the rule that set the slot, e.g. "sms:recipient 1/1m".
	Rule string
	// Booked: the limiter holds the slot for the task.
	Booked bool
}

// Error starts with tasks.DeferredPrefix: Asynq shows it as the task's
// LastErr in its Retry list, where it must not read as a failure.
// tasks.ReadTaskError reads it back.
func (e *ThrottledError) Error() string { return tasks.ThrottledText(e.Rule, e.RetryAt.UTC()) }

// Is matches any *ThrottledError, so errors.Is(err, &ThrottledError{}) works.
func (e *ThrottledError) Is(target error) bool {
	_, ok := target.(*ThrottledError)
	return ok
}

// UnavailableError is returned to Asynq when Redis could not be asked for
// the whole time the task may run. Nothing was sent; it is not a failure and
// the task is tried again after Config.UnavailableRetry.
type UnavailableError struct{ Err error }

func (e *UnavailableError) Error() string { return tasks.UnavailableText(e.Err.Error()) }
func (e *UnavailableError) Unwrap() error { return e.Err }
