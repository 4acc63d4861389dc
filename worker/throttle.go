package worker

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
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

// Error starts with DeferredPrefix: Asynq shows it as the task's LastErr in
// its Retry list, where it must not read as a failure. ReadTaskError reads it.
func (e *ThrottledError) Error() string {
	return fmt.Sprintf("%sthrottled by %s until %s", DeferredPrefix, e.Rule, e.RetryAt.UTC().Format(time.RFC3339Nano))
}

// Is matches any *ThrottledError, so errors.Is(err, &ThrottledError{}) works.
func (e *ThrottledError) Is(target error) bool {
	_, ok := target.(*ThrottledError)
	return ok
}

// UnavailableError is returned to Asynq when Redis could not be asked for
// the whole time the task may run. Nothing was sent; it is not a failure and
// the task is tried again after Config.UnavailableRetry.
type UnavailableError struct{ Err error }

func (e *UnavailableError) Error() string {
	return DeferredPrefix + "quota check unavailable, nothing sent: " + e.Err.Error()
}
func (e *UnavailableError) Unwrap() error { return e.Err }

// errLate: a send woke too late for its slot, which it gave back.
var errLate = errors.New("woke too late for the slot")

type ctxKey struct{}

// notificationFrom returns the notification the throttle middleware decoded.
func notificationFrom(ctx context.Context) (tasks.Notification, bool) {
	n, ok := ctx.Value(ctxKey{}).(tasks.Notification)
	return n, ok
}

// Archive reasons, as logged and counted (sluice_archived_total{reason}).
const (
	ReasonInvalid    = "invalid"
	ReasonUnreadable = "unreadable"
	ReasonUnknown    = "outcome_unknown"
	ReasonExpired    = "expired"
	ReasonThrottled  = "throttled"
	ReasonPermanent  = "permanent"
	ReasonBudget     = "retry_budget"
	ReasonSuppressed = "suppressed"
)

// throttleMiddleware decodes the task, asks the limiter with every rule that
// applies, waits in process for a slot that is close, and only then lets the
// handler send. See the package doc.
func (w *Worker) throttleMiddleware(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		taskID, _ := asynq.GetTaskID(ctx)
		n, err := tasks.Open(w.keys, taskID, t.Type(), t.Payload(), w.cfg.PayloadPlaintext == "accept")
		if err == nil {
			if typ, _ := n.Channel.TaskType(); typ != t.Type() {
				err = fmt.Errorf("%w: channel %q does not match task type %q", tasks.ErrInvalid, n.Channel, t.Type())
			}
		}
		if err != nil {
			reason := ReasonInvalid
			if errors.Is(err, tasks.ErrSealed) || errors.Is(err, tasks.ErrNotSealed) {
				reason = ReasonUnreadable
			}
			w.metrics.Sends.WithLabelValues(channelLabel(t.Type()), "invalid").Inc()
			w.metrics.Archived.WithLabelValues(channelLabel(t.Type()), "", reason).Inc()
			w.log.Warn("archiving a notification that cannot be sent", "task_id", taskID, "task_type", t.Type(), "reason", err)
			return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
		}
		traceNotification(ctx, n)
		log := w.log.With("id", n.ID, "tenant", n.Tenant, "channel", n.Channel, "category", n.CategoryOrDefault())
		// A producer without the rules (or with older ones) may have put the
		// task in another lane or shard: move it before any check.
		policy, _ := w.currentPlans()
		if have, _ := asynq.GetQueueName(ctx); have != w.layout.Legacy() {
			if want := policy.Queue(w.layout, n); have != want {
				if _, _, ours := w.layout.Parse(have); ours {
					return w.move(ctx, t, n, have, want, log)
				}
			}
		}
		var d throttle.Decision
		var limits []throttle.Limit
		for round := 0; ; round++ {
			policy, version := w.currentPlans()
			c := w.plan(policy, n)
			if n.Channel == tasks.Email {
				// Bulk mail and its default List-Unsubscribe, under the same plan as
				// the check. Producers refuse bulk mail without one (the API, sluice
				// enqueue); this is the last line for other producers and for a plan
				// that changed since the enqueue.
				n.ListUnsubscribe = c.match.ListUnsubscribe(n)
				if err := c.match.CheckUnsubscribe(n); err != nil {
					w.archived(n, ReasonInvalid)
					log.Warn("archiving bulk mail without a List-Unsubscribe")
					return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
				}
			}
			limits = c.limits
			opts := c.opts
			opts.Nonce = nonce() // a retry after a lost reply gets this run's own admission back
			if n.Channel == tasks.SMS && w.suppressCodes != nil {
				// The suppression list is read in the same script call.
				opts.Block = w.delivery.SuppressKey(n.Tenant, n.Channel, n.To)
			}
			// A slot within MaxInlineWait is waited for here, holding a waiter
			// token; without a free token it is booked through Asynq instead.
			waiter := w.tryWaiter()
			if !waiter {
				opts.Horizon = 0
			}
			checkCtx, check := w.startCheck(ctx, limits)
			err = w.withRedis(checkCtx, log, "quota check", func(ctx context.Context) error {
				var err error
				d, err = w.limiter.Reserve(ctx, n.Tenant, n.ID, opts, limits...)
				return err
			})
			if err != nil {
				endCheck(check, d, "", err)
				w.releaseWaiter(waiter)
				w.metrics.LimiterError.Inc()
				log.Error("quota check failed; nothing sent, will try again", "err", err)
				return &UnavailableError{Err: err}
			}
			if w.onDecide != nil {
				w.onDecide(n, d)
			}
			why := waitReason(d, limits)
			endCheck(check, d, why, nil)
			w.metrics.Decisions.WithLabelValues(string(n.Channel), w.categoryLabel(n), why, decisionLabel(d)).Inc()
			if d.Status != throttle.StatusAdmitted || d.Wait == 0 {
				w.releaseWaiter(waiter)
			}
			switch d.Status {
			case throttle.StatusDone, throttle.StatusDuplicate:
				log.Info("already sent; not sending again")
				return nil
			case throttle.StatusUnknown:
				w.archived(n, ReasonUnknown)
				log.Warn("an earlier attempt may have sent this notification (outcome unknown); at-most-once: archiving, not sending")
				return fmt.Errorf("outcome of an earlier attempt unknown (at-most-once): %w", asynq.SkipRetry)
			case throttle.StatusExpired:
				w.archived(n, ReasonExpired)
				log.Warn("expired: its earliest slot is past its deadline; archiving, not sending", "deadline", c.deadline, "set_by", c.reason, "slot", d.At, "waiting_for", why)
				return fmt.Errorf("expired: the earliest slot (%s, %s) is past the %s deadline %s: %w",
					d.At.UTC().Format(time.RFC3339), why, c.reason, c.deadline.UTC().Format(time.RFC3339), asynq.SkipRetry)
			case throttle.StatusBlocked:
				w.archived(n, ReasonSuppressed)
				log.Warn("the recipient is on the tenant's suppression list; archiving, not sending", "code", d.BlockValue)
				return fmt.Errorf("suppressed: an earlier SMS to this recipient failed permanently (provider code %d); not sent: %w", d.BlockValue, asynq.SkipRetry)
			case throttle.StatusDropped:
				w.archived(n, ReasonThrottled)
				log.Warn("dropped: a rule whose action is drop is full", "rule", why)
				return fmt.Errorf("throttled: %s is full and drops what exceeds it: %w", why, asynq.SkipRetry)
			case throttle.StatusBooked, throttle.StatusDenied:
				w.metrics.RetryAfter.WithLabelValues(string(n.Channel)).Observe(d.RetryAfter.Seconds())
				return w.reschedule(ctx, t, n, d, why, log)
			case throttle.StatusAdmitted:
				if d.Wait > 0 {
					err := w.waitForSlot(ctx, n, d, limits, log)
					w.releaseWaiter(waiter)
					if errors.Is(err, errLate) && round < 3 {
						continue
					}
					if errors.Is(err, errLate) {
						retryAt := time.Now().Add(time.Second)
						return &ThrottledError{RetryAt: retryAt, WakeAt: slotTime(retryAt), Rule: "late wake-ups"}
					}
					if err != nil {
						return err
					}
					if _, now := w.currentPlans(); now != version && round < 3 {
						// The plans changed while this send waited: a change holds
						// from the moment it is applied, so place it again under it.
						w.release(ctx, n, d.Attempt, limits, log)
						log.Info("tenant plans changed during the wait; checking again", "version", now, "was", version)
						continue
					}
				}
			default:
				return fmt.Errorf("worker: unexpected limiter status %s", d.Status)
			}
			break
		}
		sendCtx, span := w.startSend(ctx, n, d)
		err = w.send(sendCtx, t, n, d, limits, next, log)
		endSend(span, err)
		return err
	})
}

// waitForSlot sleeps until an admission made for a near instant is due. On
// shutdown it gives the slot back and hands the task to Asynq for it.
func (w *Worker) waitForSlot(ctx context.Context, n tasks.Notification, d throttle.Decision, limits []throttle.Limit, log *slog.Logger) error {
	w.metrics.InlineWaits.WithLabelValues(string(n.Channel)).Inc()
	start := time.Now()
	timer := time.NewTimer(d.Wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		// A timer that fires late (a starved CPU, a GC pause) would send
		// after the slot by more than the slack allows for: give the slot
		// back and ask again rather than crowd the next window.
		if late := time.Since(start) - d.Wait; w.cfg.SendSlack > 0 && late > w.cfg.SendSlack/2 {
			w.metrics.LateWakes.WithLabelValues(string(n.Channel)).Inc()
			w.release(ctx, n, d.Attempt, limits, log)
			log.Warn("woke late for its slot; asking again instead of sending late", "late", late.Round(time.Millisecond))
			return errLate
		}
		return nil
	case <-ctx.Done():
	case <-w.stopping:
	}
	w.release(ctx, n, d.Attempt, limits, log)
	log.Info("stopping: gave back a slot not yet used; the task goes back to the queue for it")
	at := time.Now().Add(time.Until(d.Now.Add(d.Wait)))
	return &ThrottledError{RetryAt: at, WakeAt: slotTime(at), Rule: "shutdown"}
}

// send hands the notification to the sender and records the outcome.
func (w *Worker) send(ctx context.Context, t *asynq.Task, n tasks.Notification, d throttle.Decision, limits []throttle.Limit, next asynq.Handler, log *slog.Logger) error {
	start := time.Now()
	err := redact(next.ProcessTask(context.WithValue(ctx, ctxKey{}, n), t), n)
	w.metrics.SendLatency.WithLabelValues(string(n.Channel)).Observe(time.Since(start).Seconds())
	if err == nil {
		w.metrics.Sends.WithLabelValues(string(n.Channel), "sent").Inc()
		w.markDone(ctx, n, d.Attempt, log)
		return nil
	}
	var se *SendError
	if !errors.As(err, &se) {
		se = &SendError{Err: err}
	}
	if se.NotSent {
		w.release(ctx, n, d.Attempt, limits, log)
	}
	if se.Permanent {
		w.metrics.Sends.WithLabelValues(string(n.Channel), "permanent").Inc()
		w.archived(n, ReasonPermanent)
		log.Warn("permanent send failure; archiving", "err", err, "code", se.Code)
		w.suppress(ctx, n, se.Code, log)
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	w.metrics.Sends.WithLabelValues(string(n.Channel), "transient").Inc()
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	if budget := tasks.RetryBudget(t, maxRetry); retried >= budget {
		w.archived(n, ReasonBudget)
		log.Warn("send failed and the retry budget is used up; archiving", "err", err, "retried", retried, "budget", budget)
		return fmt.Errorf("%w (retry budget of %d used): %w", err, budget, asynq.SkipRetry)
	}
	log.Warn("transient send failure; will retry", "err", err, "retried", retried, "outcome_known", se.NotSent)
	return err
}

// suppress puts the recipient of an SMS the provider refused for good on
// the tenant's suppression list, when the refusal's code is one of
// SMS_SUPPRESS_CODES.
func (w *Worker) suppress(ctx context.Context, n tasks.Notification, code int, log *slog.Logger) {
	if n.Channel != tasks.SMS || !w.suppressCodes[code] {
		return
	}
	ctx, cancel := w.afterSendContext(ctx)
	defer cancel()
	err := w.withRedis(ctx, log, "suppressing a recipient", func(ctx context.Context) error {
		return w.delivery.Suppress(ctx, n.Tenant, n.Channel, n.To, code, w.cfg.SMSSuppressTTL)
	})
	if err != nil {
		log.Warn("could not put the recipient on the suppression list", "code", code, "err", err)
		return
	}
	log.Info("recipient put on the tenant's suppression list", "code", code, "for", w.cfg.SMSSuppressTTL)
}

// markDone records a completed send, retrying while Redis is away until the
// task's deadline: a send without its record would be sent again by a re-run.
func (w *Worker) markDone(ctx context.Context, n tasks.Notification, attempt int, log *slog.Logger) {
	ctx, cancel := w.afterSendContext(ctx)
	defer cancel()
	err := w.withRedis(ctx, log, "recording the send", func(ctx context.Context) error {
		return w.limiter.MarkDone(ctx, n.Tenant, n.ID, attempt, w.cfg.DedupeTTL)
	})
	if err != nil {
		w.metrics.DoneLost.Inc()
		log.Error("sent, but could not record it; a re-run will count as a fresh send (at-least-once) or be archived (at-most-once)", "err", err)
	}
}

// release gives back the slot of a send that did not happen, retrying while
// Redis is away.
func (w *Worker) release(ctx context.Context, n tasks.Notification, attempt int, limits []throttle.Limit, log *slog.Logger) {
	ctx, cancel := w.afterSendContext(ctx)
	defer cancel()
	err := w.withRedis(ctx, log, "releasing a slot", func(ctx context.Context) error {
		_, err := w.limiter.Release(ctx, n.Tenant, n.ID, attempt, limits...)
		return err
	})
	if err != nil {
		log.Warn("could not release the quota slot of an unsent notification; it stays counted", "err", err)
	}
}

// afterSendContext outlives the task's cancellation (the send happened; its
// record must be written) but not its deadline plus a grace period.
func (w *Worker) afterSendContext(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(w.cfg.ShutdownTimeout)
	if d, ok := ctx.Deadline(); ok && d.After(time.Now()) {
		deadline = d
	}
	return context.WithDeadline(context.WithoutCancel(ctx), deadline)
}

// withRedis runs f, and while Redis cannot be reached runs it again every
// UnavailableRetry until ctx ends: a short outage costs seconds, not a trip
// through Asynq (which cannot move the task while Redis is away).
func (w *Worker) withRedis(ctx context.Context, log *slog.Logger, what string, f func(context.Context) error) error {
	start := time.Now()
	for tries := 1; ; tries++ {
		err := f(ctx)
		if err == nil || !unavailable(err) {
			if err == nil && tries > 1 {
				log.Info("redis answers again", "what", what, "after", time.Since(start).Round(time.Millisecond), "tries", tries)
			}
			return err
		}
		if tries == 1 {
			log.Warn(unavailableWhy(err)+"; nothing is sent meanwhile, trying again", "what", what, "every", w.cfg.UnavailableRetry, "err", err)
		}
		select {
		case <-time.After(w.cfg.UnavailableRetry):
		case <-ctx.Done():
			return err
		}
	}
}

// unavailable tells Redis being away (network, loading, failover, memory
// full, replicas not acknowledging) from answers that retrying cannot
// change (bad input, a script error).
func unavailable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, throttle.ErrInvalidRule) || errors.Is(err, throttle.ErrInvalidKey) || errors.Is(err, throttle.ErrTooManyRules) {
		return false
	}
	if errors.Is(err, throttle.ErrNotReplicated) || errors.Is(err, throttle.ErrOutOfMemory) {
		return true
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		// OOM: at maxmemory under noeviction; NOREPLICAS: min-replicas-to-write;
		// MOVED/ASK: a slot's master changed under a WAITing check.
		for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY", "OOM ", "NOREPLICAS", "MOVED ", "ASK "} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrClosed) ||
		strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "EOF") ||
		strings.Contains(err.Error(), "connection reset")
}

// unavailableWhy says in a few words why Redis could not be used.
func unavailableWhy(err error) string {
	var rerr redis.Error
	switch {
	case errors.Is(err, throttle.ErrNotReplicated):
		return "redis replicas did not acknowledge the admission (REDIS_WAIT_REPLICAS)"
	case errors.Is(err, throttle.ErrOutOfMemory), errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "OOM "):
		return "redis is out of memory (maxmemory, noeviction)"
	}
	return "redis unreachable"
}

// nonce names one run of a task's handler.
func nonce() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func (w *Worker) tryWaiter() bool {
	select {
	case w.waiters <- struct{}{}:
		return true
	default:
		return false
	}
}

func (w *Worker) releaseWaiter(held bool) {
	if held {
		<-w.waiters
	}
}

// redact masks the notification's recipient, sender, subject and body in a
// send error: its message goes to the log and into Asynq's task record.
func redact(err error, n tasks.Notification) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	clean := msg
	for _, s := range []string{n.To, n.From, n.Subject, n.Body} {
		if len(s) >= 4 {
			clean = strings.ReplaceAll(clean, s, tasks.Mask(s))
		}
	}
	if clean == msg {
		return err
	}
	return &redactedError{msg: clean, err: err}
}

// redactedError keeps the wrapped error for errors.As (SendError) while its
// message hides personal data.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// waitReason names what set a slot later than now: a rule, or quiet hours.
func waitReason(d throttle.Decision, limits []throttle.Limit) string {
	switch {
	case d.DeniedBy >= 0:
		return limits[d.DeniedBy].String()
	case d.Wait > 0 && (d.Status == throttle.StatusBooked || d.Status == throttle.StatusAdmitted || d.Status == throttle.StatusExpired):
		return "quiet hours"
	}
	return ""
}

func decisionLabel(d throttle.Decision) string {
	if d.Status == throttle.StatusAdmitted && d.Wait > 0 {
		return "admitted_later"
	}
	return d.Status.String()
}

func (w *Worker) archived(n tasks.Notification, reason string) {
	w.metrics.Archived.WithLabelValues(string(n.Channel), w.categoryLabel(n), reason).Inc()
}

// reschedule hands a task whose slot lies ahead back to Asynq, without
// counting a failure or spending a retry.
func (w *Worker) reschedule(ctx context.Context, t *asynq.Task, n tasks.Notification, d throttle.Decision, rule string, log *slog.Logger) error {
	w.metrics.Rescheduled.WithLabelValues(string(n.Channel)).Inc()
	te := &ThrottledError{RetryAt: d.RetryAt, WakeAt: w.WakeTime(d), Rule: rule, Booked: d.Booked}
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	log.Info("waiting for its slot", "until", d.At, "waiting_for", rule, "booked", d.Booked, "wake_at", te.WakeAt)
	if retried < maxRetry {
		return te // Asynq's retry path; IsFailure is false for it.
	}
	// Asynq would archive this task (its retries are used up, or it was
	// enqueued with MaxRetry(0) outside tasks.NewTask). Re-enqueue a copy for
	// the slot, keeping the real remaining budget, and drop this one; a
	// sealed payload is sealed again for the copy's id.
	budget := max(0, tasks.RetryBudget(t, maxRetry)-retried)
	qname, _ := asynq.GetQueueName(ctx)
	headers := map[string]string{}
	for k, v := range t.Headers() {
		headers[k] = v
	}
	headers[tasks.HeaderRetryBudget] = strconv.Itoa(budget)
	taskID, _ := asynq.GetTaskID(ctx)
	copyID := n.ID + "-r" + strconv.FormatInt(time.Now().UnixNano(), 36)
	payload := t.Payload()
	if tasks.IsSealed(payload) {
		var err error
		if payload, err = tasks.Reseal(w.keys, n, copyID, t.Type()); err != nil {
			return fmt.Errorf("reseal copy of %s: %w", taskID, err)
		}
	}
	_, err := w.client.EnqueueContext(ctx, asynq.NewTaskWithHeaders(t.Type(), payload, headers),
		asynq.Queue(qname), asynq.MaxRetry(budget+1), asynq.ProcessAt(te.WakeAt),
		asynq.TaskID(copyID), asynq.Retention(0))
	if err != nil {
		return &UnavailableError{Err: fmt.Errorf("reschedule copy of %s: %w", taskID, err)}
	}
	log.Info("quota full and Asynq retries used up; rescheduled as a copy", "copy", copyID, "rule", rule)
	return fmt.Errorf("%w: rescheduled as %s", asynq.RevokeTask, copyID)
}

// move re-enqueues a task, under its own id, in the queue the rules route
// it to, and completes it here. Nothing was checked or sent for it yet. A
// move repeated after a crash finds the copy there (its id is taken) and
// completes this one too; a copy already sent is skipped by its done record.
func (w *Worker) move(ctx context.Context, t *asynq.Task, n tasks.Notification, from, to string, log *slog.Logger) error {
	taskID, _ := asynq.GetTaskID(ctx)
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	budget := max(0, tasks.RetryBudget(t, maxRetry)-retried)
	headers := map[string]string{}
	for k, v := range t.Headers() {
		headers[k] = v
	}
	headers[tasks.HeaderRetryBudget] = strconv.Itoa(budget)
	_, err := w.client.EnqueueContext(ctx, asynq.NewTaskWithHeaders(t.Type(), t.Payload(), headers),
		asynq.Queue(to), asynq.TaskID(taskID), asynq.MaxRetry(budget+1), asynq.Timeout(tasks.DefaultTimeout), asynq.Retention(0))
	if err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return &UnavailableError{Err: fmt.Errorf("move %s to %s: %w", taskID, to, err)}
	}
	w.metrics.Moved.WithLabelValues(string(n.Channel)).Inc()
	log.Info("moved to the queue its rules route it to", "from", from, "to", to)
	return nil
}

// slotTime rounds t up to a whole second: Asynq stores scheduled times in
// whole Unix seconds, truncating.
func slotTime(t time.Time) time.Time {
	if s := t.Truncate(time.Second); !s.Equal(t) {
		return s.Add(time.Second)
	}
	return t
}

// WakeTime is when a task whose slot lies ahead should run again. Asynq
// keeps whole seconds and moves due tasks every DelayedCheckInterval, so a
// task asked to wake at t runs somewhere in [⌊t⌋, ⌊t⌋ + lead]. A slot far
// enough ahead is woken lead before it: the task arrives up to a second and
// a lead early, is admitted for the slot itself (MaxInlineWait covers the
// wait) and waits in process — two limiter calls per send, and the send
// goes at its exact slot instead of the next whole second. A slot too close
// for that is woken after it, at its second rounded up.
func (w *Worker) WakeTime(d throttle.Decision) time.Time {
	lead := w.cfg.wakeLead()
	if d.RetryAfter > lead+time.Second && w.cfg.MaxInlineWait >= lead+time.Second {
		return d.RetryAt.Add(-lead)
	}
	return slotTime(d.RetryAt)
}

// retryDelay is Asynq's RetryDelayFunc.
func (w *Worker) retryDelay(n int, err error, _ *asynq.Task) time.Duration {
	now := time.Now()
	var te *ThrottledError
	if errors.As(err, &te) {
		return max(0, te.WakeAt.Sub(now))
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

// reserveOptions are the limiter options of every check.
func (w *Worker) reserveOptions() throttle.ReserveOptions {
	o := throttle.ReserveOptions{
		Policy:  throttle.AtLeastOnce,
		Slack:   w.cfg.SendSlack,
		Horizon: w.cfg.MaxInlineWait,
		Book:    w.cfg.Reschedule == "booked",
	}
	if w.cfg.Rerun == "at-most-once" {
		o.Policy = throttle.AtMostOnce
	}
	return o
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
