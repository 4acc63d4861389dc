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

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// holdPeek is how long before its slot a waiting send reads again what may
// have changed during its wait — the provider holds and the recipient's
// consent, in one round trip (readBeforeSend) — so that the read does not
// delay the send: a hold that begins in the last holdPeek finds the send on
// its way, as it finds requests already in flight, and an opt-out recorded
// in it still holds within the second in which a refusal must hold.
const holdPeek = 10 * time.Millisecond

// waitForSlot sleeps until an admission made for a near instant is due:
// its slot, placed in this process's clock (slotBy). sendBy is the latest
// instant the send may begin (half the send slack after the slot);
// everything between the wake-up and the send shares that half with the
// send's own way to the provider. A wake-up already past it gives the slot
// back (errLate). Just before the slot it reads again what its check read
// and the wait may have changed (readBeforeSend): a provider hold that
// began during the wait gives the slot back (errHeld; asked again, the
// send is booked after the hold), and an opt-out recorded during it
// archives the send. On shutdown it gives the slot back and hands the task
// to Asynq for it.
func (w *Worker) waitForSlot(ctx context.Context, n tasks.Notification, d throttle.Decision, c check, slot, sendBy time.Time, log *slog.Logger) error {
	limits := c.Limits
	w.metrics.InlineWaits.WithLabelValues(string(n.Channel)).Inc()
	defer w.waiting(ctx)()
	peek := len(c.opts.Holds) > 0 || c.opts.Consent != nil
	wake := slot
	if peek {
		wake = slot.Add(-holdPeek)
	}
	timer := time.NewTimer(time.Until(wake))
	defer timer.Stop()
	select {
	case <-timer.C:
		if peek {
			if err := w.readBeforeSend(ctx, n, d, c, sendBy, log); err != nil {
				return err
			}
			if rest := time.Until(slot); rest > 0 {
				timer.Reset(rest)
				select {
				case <-timer.C:
				case <-ctx.Done():
					return w.giveBack(ctx, n, d, limits, log)
				case <-w.stopping:
					return w.giveBack(ctx, n, d, limits, log)
				}
			}
		}
		// A timer that fires late (a starved CPU, a GC pause) would send
		// after the slot by more than the slack allows for: give the slot
		// back and ask again rather than crowd the next window.
		if late := time.Since(sendBy); w.cfg.SendSlack > 0 && late > 0 {
			w.lateWake(ctx, n, d, limits, late+w.cfg.SendSlack/2, log)
			return errLate
		}
		return nil
	case <-ctx.Done():
	case <-w.stopping:
	}
	return w.giveBack(ctx, n, d, limits, log)
}

// readBeforeSend reads, in one round trip, the provider holds c named and
// the recipient's consent, for a send admitted before it waited for its
// slot. A hold that is live now gives the slot back: errHeld. An opt-out
// recorded meanwhile gives it back too and archives the send (reason
// suppressed), as the check would have. The reading has until sendBy: what
// Redis cannot answer by then (or at all) lets the send go on what its
// admission read, at most MaxInlineWait earlier, and the log says so.
func (w *Worker) readBeforeSend(ctx context.Context, n tasks.Notification, d throttle.Decision, c check, sendBy time.Time, log *slog.Logger) error {
	if w.cfg.SendSlack <= 0 {
		sendBy = time.Now().Add(50 * time.Millisecond)
	}
	rctx, cancel := context.WithDeadline(ctx, sendBy)
	defer cancel()
	var held func() (time.Time, error)
	var verdict func() (consent.Verdict, error)
	cc := c.opts.Consent
	_, _ = w.rdb.Pipelined(rctx, func(p redis.Pipeliner) error {
		if len(c.opts.Holds) > 0 {
			held = w.limiter.QueueHolds(rctx, p, c.opts.Holds...)
		}
		if cc != nil {
			verdict = w.consent.QueueCheck(rctx, p, n.Tenant, n.Channel, n.To, cc.Category, cc.Exempt)
		}
		return nil
	}) // each reply is read on its own below
	if held != nil {
		if until, err := held(); err != nil {
			log.Warn("could not read the provider holds before a send that waited; sending", "err", err)
		} else if until.After(time.Now()) {
			w.metrics.HeldWakes.WithLabelValues(string(n.Channel)).Inc()
			w.release(ctx, n, d.Attempt, c.Limits, log)
			log.Info("a provider hold began while this send waited; asking again", "hold_until", until.UTC())
			return errHeld
		}
	}
	if verdict == nil {
		return nil
	}
	v, err := verdict()
	if err != nil {
		log.Warn("the consent could not be read again in time after the wait; sending on the reading of its admission", "send_by", sendBy, "waited", d.Wait, "err", err)
		return nil
	}
	if !v.Blocked() {
		return nil
	}
	w.release(ctx, n, d.Attempt, c.Limits, log)
	log.Warn("the recipient's consent changed during the wait for the slot; archiving, not sending", "block", v.Reason.String())
	w.archived(n, tasks.ReasonSuppressed)
	return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonSuppressed, fmt.Errorf("the recipient's consent was withdrawn while it waited for its slot (%s); not sent", v.Reason)), asynq.SkipRetry)
}

// heldBack reads the provider holds c named for a send admitted before it
// waited (the check that admitted it saw no hold). A live one gives the
// send's slot back and reports true: asked again, it is booked after the
// hold. A hold that cannot be read lets the send go, as it would have
// without the read.
func (w *Worker) heldBack(ctx context.Context, n tasks.Notification, attempt int, c check, log *slog.Logger) bool {
	until, err := w.limiter.HeldUntil(ctx, c.opts.Holds...)
	if err != nil {
		log.Warn("could not read the provider holds before a send that waited; sending", "err", err)
		return false
	}
	if !until.After(time.Now()) {
		return false
	}
	w.metrics.HeldWakes.WithLabelValues(string(n.Channel)).Inc()
	w.release(ctx, n, attempt, c.Limits, log)
	log.Info("a provider hold began while this send waited; asking again", "hold_until", until.UTC())
	return true
}

// giveBack ends a wait for a slot on shutdown: the slot is given back and
// the task handed to Asynq for it.
func (w *Worker) giveBack(ctx context.Context, n tasks.Notification, d throttle.Decision, limits []throttle.Limit, log *slog.Logger) error {
	w.release(ctx, n, d.Attempt, limits, log)
	log.Info("stopping: gave back a slot not yet used; the task goes back to the queue for it")
	at := time.Now().Add(time.Until(d.Now.Add(d.Wait)))
	return &ThrottledError{RetryAt: at, WakeAt: slotTime(at), Rule: "shutdown"}
}

// lateWake gives back a slot whose send could no longer begin within half
// the send slack after it.
func (w *Worker) lateWake(ctx context.Context, n tasks.Notification, d throttle.Decision, limits []throttle.Limit, late time.Duration, log *slog.Logger) {
	w.metrics.LateWakes.WithLabelValues(string(n.Channel)).Inc()
	w.release(ctx, n, d.Attempt, limits, log)
	log.Warn("too late for its slot; asking again instead of sending late", "late", late.Round(time.Millisecond))
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
	var se *sender.SendError
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
	case tasks.TypeWhatsApp:
		return string(tasks.WhatsApp)
	}
	return "unknown"
}
