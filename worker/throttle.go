package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// ThrottledError is returned to Asynq for a task whose quota is full. It is
// not a failure: the task is rescheduled for RetryAt without spending a retry.
type ThrottledError struct {
	// RetryAt is when the slot opens, in this host's clock.
	RetryAt time.Time
	// Rule is the denying rule, e.g. "sms:recipient 1/1m".
	Rule string
	// Booked: the limiter holds a slot at RetryAt for the task.
	Booked bool
}

func (e *ThrottledError) Error() string {
	return fmt.Sprintf("throttled by %s until %s", e.Rule, e.RetryAt.Format(time.RFC3339Nano))
}

// Is matches any *ThrottledError, so errors.Is(err, &ThrottledError{}) works.
func (e *ThrottledError) Is(target error) bool {
	_, ok := target.(*ThrottledError)
	return ok
}

// UnavailableError is returned to Asynq when the limiter could not be asked
// (Redis unreachable). Nothing was sent; it is not a failure and the task is
// tried again after Config.UnavailableRetry.
type UnavailableError struct{ Err error }

func (e *UnavailableError) Error() string {
	return "quota check unavailable, nothing sent: " + e.Err.Error()
}
func (e *UnavailableError) Unwrap() error { return e.Err }

type ctxKey struct{}

// notificationFrom returns the notification the throttle middleware decoded.
func notificationFrom(ctx context.Context) (tasks.Notification, bool) {
	n, ok := ctx.Value(ctxKey{}).(tasks.Notification)
	return n, ok
}

// throttleMiddleware decodes the task, asks the limiter with every rule that
// applies, and only then lets the handler send. See the package doc.
func (w *Worker) throttleMiddleware(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		n, err := tasks.Decode(t.Payload())
		if err == nil {
			if typ, _ := n.Channel.TaskType(); typ != t.Type() {
				err = fmt.Errorf("%w: channel %q does not match task type %q", tasks.ErrInvalid, n.Channel, t.Type())
			}
		}
		if err != nil {
			w.metrics.Sends.WithLabelValues(channelLabel(t.Type()), "invalid").Inc()
			w.log.Warn("archiving invalid notification", "task_type", t.Type(), "reason", err)
			return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
		}
		log := w.log.With("id", n.ID, "tenant", n.Tenant, "channel", n.Channel)
		limits := w.policy.Limits(n)
		var d throttle.Decision
		if w.cfg.Reschedule == "booked" {
			d, err = w.limiter.Book(ctx, n.Tenant, n.ID, w.bookOpts, limits...)
		} else {
			d, err = w.limiter.Allow(ctx, n.Tenant, n.ID, limits...)
		}
		if err != nil {
			w.metrics.LimiterError.Inc()
			log.Error("quota check failed; nothing sent, will try again", "err", err)
			return &UnavailableError{Err: err}
		}
		if w.onDecide != nil {
			w.onDecide(n, d)
		}
		switch {
		case d.Done:
			w.metrics.Decisions.WithLabelValues(string(n.Channel), "", "done").Inc()
			log.Info("already sent; not sending again")
			return nil
		case !d.Allowed:
			rule := "early wake"
			if d.DeniedBy >= 0 {
				rule = limits[d.DeniedBy].String()
			}
			w.metrics.Decisions.WithLabelValues(string(n.Channel), rule, "denied").Inc()
			w.metrics.RetryAfter.WithLabelValues(string(n.Channel)).Observe(d.RetryAfter.Seconds())
			return w.reschedule(ctx, t, n, d, rule, log)
		case d.Duplicate:
			w.metrics.Decisions.WithLabelValues(string(n.Channel), "", "duplicate").Inc()
		default:
			w.metrics.Decisions.WithLabelValues(string(n.Channel), "", "allowed").Inc()
		}

		start := time.Now()
		err = next.ProcessTask(context.WithValue(ctx, ctxKey{}, n), t)
		w.metrics.SendLatency.WithLabelValues(string(n.Channel)).Observe(time.Since(start).Seconds())
		if err == nil {
			w.metrics.Sends.WithLabelValues(string(n.Channel), "sent").Inc()
			// Outlive every window the send counted in, so no re-run can pass
			// the limiter fresh and send again.
			if err := w.limiter.MarkDone(context.WithoutCancel(ctx), n.Tenant, n.ID, w.dedupeTTL(n)); err != nil {
				log.Error("sent, but could not record it; a re-run of this task could send again", "err", err)
			}
			return nil
		}
		var se *SendError
		if !errors.As(err, &se) {
			se = &SendError{Err: err}
		}
		if se.NotSent {
			if _, rerr := w.limiter.Release(context.WithoutCancel(ctx), n.Tenant, n.ID, limits...); rerr != nil {
				log.Warn("could not release the quota slot of an unsent notification", "err", rerr)
			}
		}
		if se.Permanent {
			w.metrics.Sends.WithLabelValues(string(n.Channel), "permanent").Inc()
			log.Warn("permanent send failure; archiving", "err", err)
			return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
		}
		w.metrics.Sends.WithLabelValues(string(n.Channel), "transient").Inc()
		retried, _ := asynq.GetRetryCount(ctx)
		maxRetry, _ := asynq.GetMaxRetry(ctx)
		if budget := tasks.RetryBudget(t, maxRetry); retried >= budget {
			log.Warn("send failed and the retry budget is used up; archiving", "err", err, "retried", retried, "budget", budget)
			return fmt.Errorf("%w (retry budget of %d used): %w", err, budget, asynq.SkipRetry)
		}
		log.Warn("transient send failure; will retry", "err", err, "retried", retried)
		return err
	})
}

// reschedule hands a denied task back to Asynq for its slot, without
// counting a failure or spending a retry.
func (w *Worker) reschedule(ctx context.Context, t *asynq.Task, n tasks.Notification, d throttle.Decision, rule string, log *slog.Logger) error {
	w.metrics.Rescheduled.WithLabelValues(string(n.Channel)).Inc()
	te := &ThrottledError{RetryAt: d.RetryAt, Rule: rule, Booked: d.Booked}
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	log.Debug("quota full; rescheduled", "rule", rule, "retry_after", d.RetryAfter, "retry_at", te.RetryAt)
	if retried < maxRetry {
		return te // Asynq's retry path; IsFailure is false for it.
	}
	// Asynq would archive this task (its retries are used up, or it was
	// enqueued with MaxRetry(0) outside tasks.NewTask). Re-enqueue a copy for
	// the slot, keeping the real remaining budget, and drop this one.
	budget := max(0, tasks.RetryBudget(t, maxRetry)-retried)
	qname, _ := asynq.GetQueueName(ctx)
	headers := map[string]string{}
	for k, v := range t.Headers() {
		headers[k] = v
	}
	headers[tasks.HeaderRetryBudget] = strconv.Itoa(budget)
	taskID, _ := asynq.GetTaskID(ctx)
	copyID := n.ID + "-r" + strconv.FormatInt(time.Now().UnixNano(), 36)
	_, err := w.client.EnqueueContext(ctx, asynq.NewTaskWithHeaders(t.Type(), t.Payload(), headers),
		asynq.Queue(qname), asynq.MaxRetry(budget+1), asynq.ProcessAt(te.wakeAt()),
		asynq.TaskID(copyID), asynq.Retention(tasks.DefaultRetention))
	if err != nil {
		return &UnavailableError{Err: fmt.Errorf("reschedule copy of %s: %w", taskID, err)}
	}
	log.Info("quota full and Asynq retries used up; rescheduled as a copy", "copy", copyID, "rule", rule)
	return fmt.Errorf("%w: rescheduled as %s", asynq.RevokeTask, copyID)
}

// slotTime rounds t up to a whole second: Asynq stores scheduled times in
// whole Unix seconds, truncating, so an unrounded time would wake the task
// up to a second before its slot.
func slotTime(t time.Time) time.Time {
	if s := t.Truncate(time.Second); !s.Equal(t) {
		return s.Add(time.Second)
	}
	return t
}

// wakeAt is when Asynq should run the task again. A booked slot is a whole
// second of Redis time; the host's RetryAt lands a little after it (the
// reply's travel time), so a booked slot is rounded to the second it is
// within 50 ms of rather than pushed a second later — the limiter admits a
// booked task a few ms early when no window suffers.
func (e *ThrottledError) wakeAt() time.Time { return WakeTime(e.RetryAt, e.Booked) }

// WakeTime is when a task denied with this retry time is scheduled to run
// again (see ThrottledError).
func WakeTime(retryAt time.Time, booked bool) time.Time {
	if booked {
		return slotTime(retryAt.Add(-50 * time.Millisecond))
	}
	return slotTime(retryAt)
}

// retryDelay is Asynq's RetryDelayFunc. A throttled task is delayed to its
// slot rounded up to a whole second (Asynq computes now+delay and truncates
// to seconds, so the delay must reach that second, not fall short of it).
func (w *Worker) retryDelay(n int, err error, _ *asynq.Task) time.Duration {
	now := time.Now()
	var te *ThrottledError
	if errors.As(err, &te) {
		return max(0, te.wakeAt().Sub(now))
	}
	var ue *UnavailableError
	if errors.As(err, &ue) {
		return w.cfg.UnavailableRetry
	}
	var se *SendError
	if errors.As(err, &se) && se.RetryAfter > 0 {
		return se.RetryAfter
	}
	d := w.cfg.RetryBase
	for i := 0; i < n && d < w.cfg.RetryMax; i++ {
		d *= 2
	}
	return min(d, w.cfg.RetryMax)
}

// isFailure tells Asynq which errors count as failures (and spend a retry).
func isFailure(err error) bool {
	var te *ThrottledError
	var ue *UnavailableError
	return !errors.As(err, &te) && !errors.As(err, &ue)
}

// dedupeTTL: at least the longest window the notification counted in.
func (w *Worker) dedupeTTL(n tasks.Notification) time.Duration {
	ttl := w.cfg.DedupeTTL
	for _, s := range w.policy.Specs(n.Tenant, n.Channel) {
		ttl = max(ttl, s.Rule.Window)
	}
	return ttl
}

func channelLabel(taskType string) string {
	switch taskType {
	case tasks.TypeEmail:
		return string(tasks.Email)
	case tasks.TypeSMS:
		return string(tasks.SMS)
	}
	return "unknown"
}
