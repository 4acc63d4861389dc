package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// records writes a run's outcome in Redis: the done record of a send, the
// release of a slot a send did not use, a reschedule for a slot ahead, a
// recipient a provider refused for good, and the queued-work count of what
// left the queue.
type records struct {
	*core
	released *releaser   // queued-work removals, in the background
	dones    doneRecords // done records waiting for their tasks' completions
}

// suppress records what a provider's refusal says of the recipient: it
// cannot take messages any more (an invalid or unsubscribed number, a
// mailbox that does not exist), in the recipient's consent for the tenant,
// for the refusal's SuppressFor.
func (rc *records) suppress(ctx context.Context, n tasks.Notification, se *sender.SendError, log *slog.Logger) {
	if !se.Suppress || (n.Channel == tasks.SMS && rc.suppressCodes == nil) {
		return
	}
	ctx, cancel := rc.afterSendContext(ctx)
	defer cancel()
	source, ttl := consent.SourceProvider, rc.cfg.SMSSuppressTTL
	if n.Channel == tasks.Email {
		source, ttl = consent.SourceBounce, rc.cfg.EmailSuppressTTL
	}
	if se.SuppressFor > 0 {
		ttl = se.SuppressFor
	}
	var until time.Time
	err := rc.withRedis(ctx, log, "suppressing a recipient", func(ctx context.Context) error {
		e, err := rc.consent.Record(ctx, n.Tenant, n.Channel, n.To, consent.Event{Action: consent.Undeliverable, Source: source,
			Code: se.Code, Until: time.Now().Add(ttl), Ref: n.ID})
		until = e.Until
		return err
	})
	if err != nil {
		log.Warn("could not mark the recipient undeliverable", "code", se.Code, "err", err)
		return
	}
	rc.metrics.Suppressed.WithLabelValues(string(n.Channel), string(source)).Inc()
	log.Info("recipient marked undeliverable for the tenant", "code", se.Code, "until", until)
}

// leftQueue takes a notification that leaves the queue with this attempt
// (sent, dropped, archived) out of its tenant's count of queued work
// (tasks.QueueQuota). One that waits (throttled, rescheduled as a copy,
// retried) still counts. The removal goes in the background (releaser); one
// lost lapses after TENANT_QUEUED_TTL.
func (rc *records) leftQueue(ctx context.Context, t *asynq.Task, n tasks.Notification, err error, log *slog.Logger) {
	if err != nil {
		var te *ThrottledError
		var ue *UnavailableError
		switch {
		case errors.Is(err, asynq.RevokeTask), errors.As(err, &te):
			return
		case errors.Is(err, asynq.SkipRetry):
		case errors.As(err, &ue):
			return
		default:
			retried, _ := asynq.GetRetryCount(ctx)
			maxRetry, _ := asynq.GetMaxRetry(ctx)
			if retried < tasks.RetryBudget(t, maxRetry) {
				return // retried later
			}
		}
	}
	rc.released.add(n.Tenant, n.ID)
}

// wakeTime is when a task whose slot lies ahead should run again. Asynq
// keeps whole seconds and moves due tasks every DelayedCheckInterval, so a
// task asked to wake at t runs somewhere in [⌊t⌋, ⌊t⌋ + lead]. A slot far
// enough ahead is woken lead before it: the task arrives up to a second and
// a lead early, is admitted for the slot itself (MaxInlineWait covers the
// wait) and waits in process — two limiter calls per send, and the send
// goes at its exact slot instead of the next whole second. A slot too close
// for that is woken after it, at its second rounded up.
func (rc *records) wakeTime(d throttle.Decision) time.Time {
	lead := rc.cfg.wakeLead()
	if d.RetryAfter > lead+time.Second && rc.cfg.MaxInlineWait >= lead+time.Second {
		return d.RetryAt.Add(-lead)
	}
	return slotTime(d.RetryAt)
}

// reschedule hands a task whose slot lies ahead back to Asynq, without
// counting a failure or spending a retry.
//
// wakeBy (zero: none) is when a provider passed over for the one the send
// is booked at may come back: a slot past it is woken in time to be in
// process then (and plan again: waitForReplan).
func (rc *records) reschedule(ctx context.Context, t *asynq.Task, n tasks.Notification, d throttle.Decision, rule string, wakeBy time.Time, log *slog.Logger) error {
	rc.metrics.Rescheduled.WithLabelValues(string(n.Channel)).Inc()
	te := &ThrottledError{RetryAt: d.RetryAt, WakeAt: rc.wakeTime(d), Rule: rule, Booked: d.Booked}
	if !wakeBy.IsZero() && wakeBy.Before(d.RetryAt) {
		if w := rc.cfg.wakeFor(wakeBy); w.Before(te.WakeAt) {
			te.WakeAt = w
		}
	}
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
		if payload, err = tasks.Reseal(rc.keys, n, copyID, t.Type()); err != nil {
			return fmt.Errorf("reseal copy of %s: %w", taskID, err)
		}
	}
	_, err := rc.client.EnqueueContext(ctx, asynq.NewTaskWithHeaders(t.Type(), payload, headers),
		asynq.Queue(qname), asynq.MaxRetry(budget+1), asynq.ProcessAt(te.WakeAt),
		asynq.TaskID(copyID), asynq.Retention(0))
	if err != nil {
		return &UnavailableError{Err: fmt.Errorf("reschedule copy of %s: %w", taskID, err)}
	}
	log.Info("quota full and Asynq retries used up; rescheduled as a copy", "copy", copyID, "rule", rule)
	return fmt.Errorf("%w: rescheduled as %s", asynq.RevokeTask, copyID)
}

// release gives back the slot of a send that did not happen, retrying while
// Redis is away.
func (rc *records) release(ctx context.Context, n tasks.Notification, attempt int, limits []throttle.Limit, log *slog.Logger) {
	ctx, cancel := rc.afterSendContext(ctx)
	defer cancel()
	err := rc.withRedis(ctx, log, "releasing a slot", func(ctx context.Context) error {
		_, err := rc.limiter.Release(ctx, n.Tenant, n.ID, attempt, limits...)
		return err
	})
	if err != nil {
		log.Warn("could not release the quota slot of an unsent notification; it stays counted", "err", err)
	}
}

// markDone records a completed send. The record goes with the task's
// completion (Asynq's, in the next batch of the completer: donesBefore),
// ahead of it in the same pipeline, so a send costs no round trip of its
// own for it; one not carried within doneCarry (a task Asynq does not
// complete through the batches: a retention, a uniqueness lock) is written
// by flushDone, which retries while Redis is away until the task's
// deadline: a send without its record would be sent again by a re-run.
func (rc *records) markDone(ctx context.Context, n tasks.Notification, attempt int, log *slog.Logger) {
	id, ok := asynq.GetTaskID(ctx)
	if !ok {
		rc.writeDone(ctx, []throttle.DoneItem{{Group: n.Tenant, ID: n.ID, Attempt: attempt, TTL: rc.cfg.DedupeTTL}}, log)
		return
	}
	deadline, _ := ctx.Deadline()
	rc.dones.Lock()
	rc.dones.m[id] = pendingDone{item: throttle.DoneItem{Group: n.Tenant, ID: n.ID, Attempt: attempt, TTL: rc.cfg.DedupeTTL},
		at: time.Now(), deadline: deadline, log: log}
	rc.dones.Unlock()
}

// pendingDone is a done record waiting for its task's completion.
type pendingDone struct {
	item     throttle.DoneItem
	at       time.Time
	deadline time.Time // the task's: flushDone retries until then
	log      *slog.Logger
}

// doneRecords are the done records of sends whose tasks are not completed
// yet, by task id.
type doneRecords struct {
	sync.Mutex
	m map[string]pendingDone
}

// doneCarry is how long a done record waits for its task's completion to
// carry it before flushDone writes it alone.
const doneCarry = 50 * time.Millisecond

// donesBefore is the completer's Before: it adds the done records of the
// tasks ids to the batch's pipeline, ahead of their completions, and drops
// those written once it ran (those not written wait for Asynq's retry of
// the completion, or flushDone).
func (rc *records) donesBefore(ctx context.Context, p redis.Pipeliner, ids []string) func() {
	rc.dones.Lock()
	var taken []string
	var items []throttle.DoneItem
	for _, id := range ids {
		if d, ok := rc.dones.m[id]; ok {
			taken = append(taken, id)
			items = append(items, d.item)
		}
	}
	rc.dones.Unlock()
	if len(items) == 0 {
		return nil
	}
	result := rc.limiter.QueueDone(ctx, p, items)
	return func() {
		errs := result()
		rc.dones.Lock()
		defer rc.dones.Unlock()
		for i, id := range taken {
			if errs[i] == nil {
				delete(rc.dones.m, id)
			}
		}
	}
}

// flushDone writes the done records no completion carried within
// doneCarry, every doneCarry, until ctx ends; then every one left.
func (rc *records) flushDone(ctx context.Context) {
	t := time.NewTicker(doneCarry)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			rc.flushDoneOlder(context.WithoutCancel(ctx), time.Now().Add(time.Hour))
			return
		case now := <-t.C:
			rc.flushDoneOlder(ctx, now.Add(-doneCarry))
		}
	}
}

// flushDoneOlder writes the done records waiting since before cutoff.
func (rc *records) flushDoneOlder(ctx context.Context, cutoff time.Time) {
	rc.dones.Lock()
	var old []pendingDone
	for id, d := range rc.dones.m {
		if d.at.Before(cutoff) {
			old = append(old, d)
			delete(rc.dones.m, id)
		}
	}
	rc.dones.Unlock()
	for _, d := range old {
		dctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), later(d.deadline, time.Now().Add(rc.cfg.ShutdownTimeout)))
		rc.writeDone(dctx, []throttle.DoneItem{d.item}, d.log)
		cancel()
	}
}

// writeDone writes done records now, retrying while Redis is away until
// ctx's deadline.
func (rc *records) writeDone(ctx context.Context, items []throttle.DoneItem, log *slog.Logger) {
	ctx, cancel := rc.afterSendContext(ctx)
	defer cancel()
	for _, it := range items {
		err := rc.withRedis(ctx, log, "recording the send", func(ctx context.Context) error {
			return rc.limiter.MarkDone(ctx, it.Group, it.ID, it.Attempt, it.TTL)
		})
		if err != nil {
			rc.metrics.DoneLost.Inc()
			log.Error("sent, but could not record it; a re-run will count as a fresh send (at-least-once) or be archived (at-most-once)", "err", err)
		}
	}
}

// slotTime rounds t up to a whole second: Asynq stores scheduled times in
// whole Unix seconds, truncating.
func slotTime(t time.Time) time.Time {
	if s := t.Truncate(time.Second); !s.Equal(t) {
		return s.Add(time.Second)
	}
	return t
}
