package tasks

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
)

// Defaults of NewTask and Enqueue; each can be overridden with an asynq.Option.
const (
	DefaultQueue      = "notifications"
	DefaultMaxRetry   = 8
	DefaultTimeout    = 30 * time.Second
	DefaultRetention  = 24 * time.Hour
	HeaderRetryBudget = "sluice-retry-budget"
)

// ErrDuplicate reports a notification id that is already enqueued, or was
// completed within the retention period.
var ErrDuplicate = errors.New("duplicate notification id")

// NewTask validates n and returns its Asynq task, with the task id set to
// the notification id (so a second enqueue of the same id is refused).
//
// Retry budget: Sluice reschedules throttled tasks without spending their
// retries, and Asynq archives any task whose retries are used up even when
// the error is not a failure. So NewTask stores the real budget (MaxRetry,
// DefaultMaxRetry unless given) in the task header HeaderRetryBudget and
// gives Asynq one more; the worker archives on real failures by that header.
func NewTask(n Notification, opts ...asynq.Option) (*asynq.Task, error) {
	n = n.Normalized()
	if n.ID == "" {
		n.ID = NewID()
	}
	typ, err := n.Channel.TaskType()
	if err != nil {
		return nil, err
	}
	payload, err := n.Encode()
	if err != nil {
		return nil, err
	}
	budget := DefaultMaxRetry
	all := []asynq.Option{asynq.Queue(DefaultQueue), asynq.Timeout(DefaultTimeout), asynq.Retention(DefaultRetention)}
	for _, o := range opts {
		if o.Type() == asynq.MaxRetryOpt {
			budget = o.Value().(int)
			continue
		}
		all = append(all, o)
	}
	if budget < 0 {
		budget = 0
	}
	all = append(all, asynq.MaxRetry(budget+1), asynq.TaskID(n.ID))
	headers := map[string]string{HeaderRetryBudget: strconv.Itoa(budget)}
	return asynq.NewTaskWithHeaders(typ, payload, headers, all...), nil
}

// RetryBudget returns the real retry budget of a task: the header set by
// NewTask, or, for a task built elsewhere, maxRetry as Asynq knows it.
func RetryBudget(t *asynq.Task, maxRetry int) int {
	if v, ok := t.Headers()[HeaderRetryBudget]; ok {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			return n
		}
	}
	return maxRetry
}

// Enqueue validates and enqueues n. It returns the notification's id with
// Asynq's task info; an id already enqueued (or completed within
// DefaultRetention) gives ErrDuplicate.
func Enqueue(ctx context.Context, c *asynq.Client, n Notification, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	if n.ID == "" {
		n.ID = NewID()
	}
	t, err := NewTask(n, opts...)
	if err != nil {
		return nil, err
	}
	info, err := c.EnqueueContext(ctx, t)
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return nil, fmt.Errorf("%w: %s: %w", ErrDuplicate, n.ID, err)
	}
	if err != nil {
		return nil, fmt.Errorf("tasks: enqueue %s: %w", n.ID, err)
	}
	return info, nil
}
