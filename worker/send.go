package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// The send path. The throttle middleware runs each task through these
// stages, in order; each either hands the task on or ends the run with
// what Asynq is to do with it:
//
//	decode    open the payload; what can never be sent is archived (invalid, unreadable)
//	route     a task in another lane or shard than the rules route it to is moved there
//	window    a free-form WhatsApp message whose recipient's service window is
//	          closed is archived (worker/whatsapp.go)
//	comply    bulk mail without a List-Unsubscribe is archived; email gets its
//	          hosted one-click link (the recipient's consent is read by the
//	          check itself)
//	reserve   ask the limiter under the plans in force, then, by its answer:
//	          done or duplicate → nothing to do; unknown outcome, expired,
//	          suppressed, dropped → archived; booked or denied → back to Asynq for
//	          the slot (not a failure); admitted → wait in process for a near slot
//	dispatch  hand it to the provider and record the outcome: the done record,
//	          a release of a send that did not happen, a retry, an archive

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

// errLate: a send woke too late for its slot, which it gave back.
var errLate = errors.New("woke too late for the slot")

// errHeld: a provider hold began while a send waited for its slot, which
// it gave back.
var errHeld = errors.New("a provider hold began during the wait")

type ctxKey struct{}

// notificationFrom returns the notification the throttle middleware decoded.
func notificationFrom(ctx context.Context) (tasks.Notification, bool) {
	n, ok := ctx.Value(ctxKey{}).(tasks.Notification)
	return n, ok
}

// throttleMiddleware runs the send path's stages (above) for each task and
// lets the handler send only what every rule admits.
func (w *Worker) throttleMiddleware(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		n, err := w.decode(ctx, t)
		if err != nil {
			return err
		}
		traceNotification(ctx, n)
		log := w.log.With("id", n.ID, "tenant", n.Tenant, "channel", n.Channel, "category", n.CategoryOrDefault())
		if moved, err := w.route(ctx, t, n, log); moved {
			return err
		}
		if n.FallbackFor != "" {
			if need, err := w.fallbackNeeded(ctx, n, log); !need {
				w.leftQueue(ctx, t, n, err, log)
				return err
			}
		}
		if err := w.serviceWindow(ctx, n, log); err != nil {
			w.leftQueue(ctx, t, n, err, log)
			return err
		}
		var tried []string // providers that did not take it in this run
		for {
			w.onTheWay(ctx, true) // again, after a failover
			a, err := w.reserve(ctx, t, &n, tried, log)
			if a == nil {
				w.leftQueue(ctx, t, n, err, log)
				return err
			}
			sendCtx, span := w.startSend(ctx, n, a.d)
			err = w.dispatch(sendCtx, t, n, a, tried, next, log)
			endSend(span, err)
			var fo *errFailover
			if errors.As(err, &fo) {
				// A priority send its provider did not take: the next one, now.
				tried = append(tried, fo.from)
				w.metrics.Failovers.WithLabelValues(string(n.Channel), fo.from).Inc()
				log.Warn("provider did not take a priority send; trying the next one", "provider", fo.from, "err", fo.err)
				continue
			}
			w.leftQueue(ctx, t, n, err, log)
			return err
		}
	})
}

// leftQueue takes a notification that leaves the queue with this attempt
// (sent, dropped, archived) out of its tenant's count of queued work
// (tasks.QueueQuota). One that waits (throttled, rescheduled as a copy,
// retried) still counts. The removal goes in the background (releaser); one
// lost lapses after TENANT_QUEUED_TTL.
func (w *Worker) leftQueue(ctx context.Context, t *asynq.Task, n tasks.Notification, err error, log *slog.Logger) {
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
	w.released.add(n.Tenant, n.ID)
}

// decode opens the task's payload. What can never be sent (bad JSON, a
// channel that does not match the task type, a payload that does not open)
// is archived at once.
func (w *Worker) decode(ctx context.Context, t *asynq.Task) (tasks.Notification, error) {
	taskID, _ := asynq.GetTaskID(ctx)
	n, err := tasks.Open(w.keys, taskID, t.Type(), t.Payload(), w.cfg.PayloadPlaintext == "accept")
	if err == nil {
		if typ, _ := n.Channel.TaskType(); typ != t.Type() {
			err = fmt.Errorf("%w: channel %q does not match task type %q", tasks.ErrInvalid, n.Channel, t.Type())
		}
	}
	if err == nil {
		return n, nil
	}
	reason := tasks.ReasonInvalid
	if errors.Is(err, tasks.ErrSealed) || errors.Is(err, tasks.ErrNotSealed) {
		reason = tasks.ReasonUnreadable
	}
	w.metrics.Sends.WithLabelValues(channelLabel(t.Type()), "invalid").Inc()
	w.metrics.Archived.WithLabelValues(channelLabel(t.Type()), "", reason).Inc()
	w.log.Warn("archiving a notification that cannot be sent", "task_id", taskID, "task_type", t.Type(), "reason", err)
	return tasks.Notification{}, fmt.Errorf("%w: %w", tasks.Archived(reason, err), asynq.SkipRetry)
}

// route moves a task found in another lane or shard than the rules in
// force route it to (a producer without the rules, or with older ones),
// before any check. The legacy single queue is served in place.
func (w *Worker) route(ctx context.Context, t *asynq.Task, n tasks.Notification, log *slog.Logger) (bool, error) {
	have, _ := asynq.GetQueueName(ctx)
	if have == w.layout.Legacy() {
		return false, nil
	}
	want := w.currentPolicy().Queue(w.layout, n)
	if _, _, ours := w.layout.Parse(have); !ours || have == want {
		return false, nil
	}
	return true, w.move(ctx, t, n, have, want, log)
}

// comply enforces what the rules demand of the notification itself, under
// the same plan as its check: a user where user=required; bulk mail carries a List-Unsubscribe (its
// own, or the rules' default, which it gets here). Producers refuse bulk
// mail without one (the API, sluice enqueue); this is the last line for
// other producers and for a plan that changed since the enqueue.
func (w *Worker) comply(c check, n *tasks.Notification, log *slog.Logger) error {
	if err := c.Match.CheckUser(*n); err != nil {
		w.archived(*n, tasks.ReasonInvalid)
		log.Warn("archiving a notification without a user: its rules require one (user=required)")
		return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonInvalid, err), asynq.SkipRetry)
	}
	if n.Channel != tasks.Email {
		return nil
	}
	if n.From != "" && !w.fromDomains.Allows(n.Tenant, n.From, w.cfg.SMTPFrom) {
		w.archived(*n, tasks.ReasonInvalid)
		log.Warn("archiving an email From a domain its tenant may not send from (SLUICE_EMAIL_FROM_DOMAINS)")
		return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonInvalid, errors.New("from: not at a domain this tenant may send from (SLUICE_EMAIL_FROM_DOMAINS)")), asynq.SkipRetry)
	}
	n.ListUnsubscribe = c.Match.ListUnsubscribe(*n)
	if c.Match.Hosted() {
		ok, err := w.hostedUnsubscribe(n)
		if err != nil {
			log.Warn("no hosted unsubscribe link for this email", "err", err)
		}
		if !ok && c.Match.Bulk {
			w.archived(*n, tasks.ReasonInvalid)
			log.Error("archiving bulk mail: its rules ask for a hosted unsubscribe link, and this worker has no SLUICE_UNSUBSCRIBE_URL")
			return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonInvalid, errors.New("a hosted unsubscribe link is required (unsubscribe=hosted) and SLUICE_UNSUBSCRIBE_URL is not set")), asynq.SkipRetry)
		}
	}
	if err := c.Match.CheckUnsubscribe(*n); err != nil {
		w.archived(*n, tasks.ReasonInvalid)
		log.Warn("archiving bulk mail without a List-Unsubscribe")
		return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonInvalid, err), asynq.SkipRetry)
	}
	return nil
}

// admission is a send the limiter admitted for now.
type admission struct {
	d  throttle.Decision
	c  check // what it was checked under
	pk pick  // the provider it goes to
	// order is its tenant's plan's order of the channel's providers (nil:
	// the configured list).
	order []string
	// sendBy is the latest instant the send may begin, in this process's
	// clock: half the send slack after its slot.
	sendBy time.Time
}

// reserve asks the limiter, under the plans in force, until the send is
// admitted for now (waiting in process for a near slot), or the run ends:
// a nil admission, with what Asynq is to do (nil: nothing more).
//
// The provider is picked first (pickProvider: the first of the channel's
// that is up and not in tried), and the check is of a send through it.
func (w *Worker) reserve(ctx context.Context, t *asynq.Task, n *tasks.Notification, tried []string, log *slog.Logger) (*admission, error) {
	resent := false
	for round := 0; ; round++ {
		policy, version := w.currentPlans()
		c := w.plan(policy, *n)
		if err := w.comply(c, n, log); err != nil {
			return nil, err
		}
		if joined, err := w.digestBefore(ctx, t, *n, &c, round, log); joined || err != nil {
			return nil, err
		}
		order := policy.Providers(n.Tenant, n.Channel)
		pk, err := w.pickProvider(ctx, *n, c.Match.Exempt, order, tried, log)
		if err != nil {
			return nil, w.providerWait(*n, err, log)
		}
		w.bindProvider(&c, *n, pk.p)
		d, waiter, replied, err := w.check(ctx, *n, c, log)
		if err != nil {
			return nil, err
		}
		if d.Attempt > 1 && (d.Status == throttle.StatusAdmitted || d.Status == throttle.StatusBooked) && w.reachedProvider(ctx, *n, d, c, &resent, log) {
			w.releaseWaiter(waiter)
			return nil, nil
		}
		switch d.Status {
		case throttle.StatusAdmitted:
			// The send may begin no later than half the send slack after its
			// slot. A slot already past by then — the process was starved
			// after the reply came, or the reply was lost with Redis and the
			// retry got this run's admission back — would crowd the next
			// window: give it back and ask again. (A reply slow to arrive is
			// not seen here: slotBy places the slot at the reply, so that
			// time is covered only by the slack.)
			slot := slotBy(replied, d)
			sendBy := slot.Add(w.cfg.SendSlack / 2)
			if late := time.Since(sendBy); w.cfg.SendSlack > 0 && late > 0 {
				w.releaseWaiter(waiter)
				w.lateWake(ctx, *n, d, c.Limits, late+w.cfg.SendSlack/2, log)
				err = errLate
			} else if d.Wait == 0 {
				if err := w.digestAdmitted(ctx, n, c, d, log); err != nil {
					return nil, err
				}
				return &admission{d: d, c: c, pk: pk, order: order, sendBy: sendBy}, nil
			} else {
				err = w.waitForSlot(ctx, *n, d, c, slot, sendBy, log)
				w.releaseWaiter(waiter)
			}
			switch {
			case errors.Is(err, errHeld):
				continue // booked after the hold (or admitted, if it lifted meanwhile)
			case errors.Is(err, errLate) && round < 3:
				continue
			case errors.Is(err, errLate):
				retryAt := time.Now().Add(time.Second)
				return nil, &ThrottledError{RetryAt: retryAt, WakeAt: slotTime(retryAt), Rule: "late wake-ups"}
			case err != nil:
				return nil, err
			}
			if _, now := w.currentPlans(); now != version && round < 3 {
				// The plans changed while this send waited: a change holds
				// from the moment it is applied, so place it again under it.
				w.release(ctx, *n, d.Attempt, c.Limits, log)
				log.Info("tenant plans changed during the wait; checking again", "version", now, "was", version)
				continue
			}
			if err := w.digestAdmitted(ctx, n, c, d, log); err != nil {
				return nil, err
			}
			return &admission{d: d, c: c, pk: pk, order: order, sendBy: sendBy}, nil
		default: // errOpened: its digest's carrier now, asked again with a booking
			w.giveBackProbe(ctx, pk, d, log)
			if err := w.notNow(ctx, t, *n, &c, d, log); !errors.Is(err, errOpened) {
				return nil, err
			}
		}
	}
}

// notNow ends a run whose send the limiter did not admit for now: booked
// or denied, back to Asynq for the slot (or into an open digest); else
// settled.
func (w *Worker) notNow(ctx context.Context, t *asynq.Task, n tasks.Notification, c *check, d throttle.Decision, log *slog.Logger) error {
	why := waitReason(d, c.Limits)
	switch d.Status {
	case throttle.StatusBooked, throttle.StatusDenied:
		if joined, err := w.digestDeferred(ctx, t, n, c, d, log); joined || err != nil {
			return err // nil: an open digest carries it
		}
		w.metrics.RetryAfter.WithLabelValues(string(n.Channel)).Observe(d.RetryAfter.Seconds())
		return w.reschedule(ctx, t, n, d, why, log)
	case throttle.StatusDone, throttle.StatusDuplicate:
	default:
		w.digestSpill(ctx, n, *c, log)
	}
	return w.settled(n, *c, d, why, log)
}

// reachedProvider settles a re-run whose earlier attempt's outcome is
// unknown (it was admitted, and no done record followed: a crash mid-send)
// from what the provider reported: a status callback recorded for the
// notification means the provider has the message, whatever its status,
// so it is not sent again. It gives back the slot the re-run was just
// given, records the earlier attempt done, and reports true. Without a
// report (none arrived, or the channel has none) the re-run sends, as
// at-least-once says; sluice_unknown_outcomes_total counts both, a resend
// once a run however often it asks again (a late wake-up): *resent says
// whether this run counted it.
func (w *Worker) reachedProvider(ctx context.Context, n tasks.Notification, d throttle.Decision, c check, resent *bool, log *slog.Logger) bool {
	var rec *delivery.Record
	if n.Channel == tasks.SMS {
		var err error
		if rec, err = w.delivery.Get(ctx, n.Tenant, n.ID); err != nil {
			log.Warn("could not read the provider's report of an earlier attempt; sending again (at-least-once)", "err", err)
		}
	}
	if rec == nil {
		if !*resent {
			*resent = true
			w.metrics.UnknownOutcomes.WithLabelValues(string(n.Channel), "resent").Inc()
		}
		return false
	}
	w.release(ctx, n, d.Attempt, c.Limits, log)
	w.markDone(ctx, n, d.Attempt-1, log)
	w.metrics.UnknownOutcomes.WithLabelValues(string(n.Channel), "settled").Inc()
	log.Info("an earlier attempt reached the provider (its status report is here); not sending again",
		"status", string(rec.Status), "message_sid", rec.MessageSID, "attempt", d.Attempt-1)
	return true
}

// check is one call of the limiter for n under c. A slot within
// MaxInlineWait is admitted for its instant when a waiter token is free
// (held, returned with the decision: the caller releases it after its
// wait); without one it is booked through Asynq instead.
//
// replied is when the answer reached this process: the decision was
// taken before it (slotBy).
func (w *Worker) check(ctx context.Context, n tasks.Notification, c check, log *slog.Logger) (d throttle.Decision, waiter bool, replied time.Time, err error) {
	opts := c.opts
	opts.Nonce = nonce() // a retry after a lost reply gets this run's own admission back
	if n.Channel == tasks.SMS && w.suppressCodes != nil {
		// The suppression list is read in the same script call.
		opts.Block = w.delivery.SuppressKey(n.Tenant, n.Channel, n.To)
	}
	if n.Channel == tasks.SMS {
		// Whom it goes to (a keyed hash), written with the admission, before
		// the provider can call back: a status callback marks only this
		// number undeliverable.
		opts.Note = w.delivery.RecipientNote(n.Tenant, n.ID, n.To, w.cfg.DedupeTTL)
	}
	waiter = w.tryWaiter()
	if !waiter {
		opts.Horizon = 0
	}
	opts.Seat = takeSeat(ctx)
	checkCtx, span := w.startCheck(ctx, c.Limits)
	err = w.withRedis(checkCtx, log, "quota check", func(ctx context.Context) error {
		var err error
		d, err = w.limiter.Reserve(ctx, n.Tenant, n.ID, opts, c.Limits...)
		replied = time.Now()
		return err
	})
	if err != nil {
		endCheck(span, d, "", err)
		w.releaseWaiter(waiter)
		w.metrics.LimiterError.Inc()
		log.Error("quota check failed; nothing sent, will try again", "err", err, "cause", unavailableWhy(err))
		return d, false, replied, &UnavailableError{Err: err}
	}
	if w.onDecide != nil {
		w.onDecide(n, d)
	}
	why := waitReason(d, c.Limits)
	endCheck(span, d, why, nil)
	w.metrics.Decisions.WithLabelValues(string(n.Channel), w.categoryLabel(n), why, decisionLabel(d)).Inc()
	if d.Status != throttle.StatusAdmitted || d.Wait == 0 {
		w.releaseWaiter(waiter)
		waiter = false
	}
	return d, waiter, replied, nil
}

// slotBy places an admission's slot in this process's clock. The
// decision was taken before its reply came (Redis's clock may differ from
// this one; the round trip does not), so the slot lies at most the wait
// after the reply, less how far it was already past when it was taken (an
// admission handed back again after a lost reply). slotBy takes that
// latest instant: a send is never early, and late by at most the round
// trip, which the send slack covers. (The round trip's midpoint, used
// before, could be early by half of it: CI saw a send 0.44 ms before its
// slot.)
func slotBy(replied time.Time, d throttle.Decision) time.Time {
	return replied.Add(d.Wait - max(d.Now.Sub(d.At), 0))
}

// settled handles the limiter's answers that end the run without a send:
// nil when there is nothing to do, else the archive error.
func (w *Worker) settled(n tasks.Notification, c check, d throttle.Decision, why string, log *slog.Logger) error {
	var err *tasks.ArchivedError
	switch d.Status {
	case throttle.StatusDone, throttle.StatusDuplicate:
		log.Info("already sent; not sending again")
		return nil
	case throttle.StatusUnknown:
		log.Warn("an earlier attempt may have sent this notification (outcome unknown); at-most-once: archiving, not sending")
		err = tasks.Archived(tasks.ReasonUnknown, errors.New("the outcome of an earlier attempt is unknown (at-most-once)"))
	case throttle.StatusExpired:
		log.Warn("expired: its earliest slot is past its deadline; archiving, not sending", "deadline", c.Deadline, "set_by", c.DeadlineBy, "slot", d.At, "waiting_for", why)
		err = tasks.Archived(tasks.ReasonExpired, fmt.Errorf("the earliest slot (%s, %s) is past the %s deadline %s",
			d.At.UTC().Format(time.RFC3339), why, c.DeadlineBy, c.Deadline.UTC().Format(time.RFC3339)))
	case throttle.StatusBlocked:
		log.Warn("the recipient's consent blocks this send; archiving, not sending", "block", d.BlockReason, "code", d.BlockValue, "since", d.BlockedSince)
		err = tasks.Archived(tasks.ReasonSuppressed, blockedError(n, d))
		w.fallBack(context.Background(), n, 0, log)
	case throttle.StatusDropped:
		log.Warn("dropped: a rule whose action is drop is full", "rule", why)
		err = tasks.Archived(tasks.ReasonThrottled, fmt.Errorf("%s is full and drops what exceeds it", why))
	default:
		return fmt.Errorf("worker: unexpected limiter status %s", d.Status)
	}
	w.archived(n, err.Reason)
	return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
}

// dispatch hands the notification to the sender and records the outcome:
// a sent one's done record; a release of the slot of a send that did not
// happen; a permanent refusal archived (and the recipient suppressed when
// the provider says so); a transient failure retried with backoff until
// the task's real retry budget is used up.
//
// With several providers, a transient failure counts toward the provider's
// breaker, and a send the provider definitely did not take (NotSent) moves
// to the next provider: a priority send at once (errFailover), the others
// through Asynq without spending a retry.
func (w *Worker) dispatch(ctx context.Context, t *asynq.Task, n tasks.Notification, a *admission, tried []string, next asynq.Handler, log *slog.Logger) error {
	if len(a.c.Caps) > 0 {
		done, err := w.takeCaps(ctx, n, a, log)
		if err != nil {
			return err
		}
		defer done()
	}
	if len(a.c.Caps) > 0 {
		if err := w.unlessHeld(ctx, t, n, a, log); err != nil {
			return err
		}
	}
	// At most CONCURRENCY (priority lane: PRIORITY_CONCURRENCY) requests of
	// this worker at the providers at once, the sends that waited in
	// process for their slots included; they queue for a request slot in
	// the order they ask, which is their slots' (a wait that makes a send
	// late is caught below).
	w.armFallback(ctx, n, log) // before the request slot: nothing between the late check and the send
	p := a.pk.p
	slots := p.slots
	if a.c.Match.Exempt {
		slots = p.prioritySlots
	}
	if err := slots.Acquire(ctx, 1); err != nil {
		w.release(ctx, n, a.d.Attempt, a.c.Limits, log)
		return err
	}
	start := time.Now()
	if late := start.Sub(a.sendBy); w.cfg.SendSlack > 0 && late > 0 {
		if err := w.recheck(ctx, t, n, a, late, log); err != nil {
			slots.Release(1)
			return err
		}
	}
	inflight := w.metrics.ProviderInFlight.WithLabelValues(string(n.Channel), p.name)
	inflight.Inc()
	err := redact(next.ProcessTask(context.WithValue(context.WithValue(ctx, ctxKey{}, n), providerKey{}, p), t), n)
	inflight.Dec()
	slots.Release(1) // the request is over: what follows (the done record, a hold) holds no request slot
	w.sent(ctx)
	w.metrics.SendLatency.WithLabelValues(string(n.Channel)).Observe(time.Since(start).Seconds())
	if err == nil {
		w.metrics.Sends.WithLabelValues(string(n.Channel), "sent").Inc()
		w.metrics.ProviderSends.WithLabelValues(string(n.Channel), p.name).Inc()
		w.markDone(ctx, n, a.d.Attempt, log)
		w.providerRecovered(ctx, a.pk, log)
		w.noteProvider(ctx, n, p, log)
		return nil
	}
	return w.sendFailed(ctx, t, n, a, tried, err, start, log)
}

// sendFailed records a send the provider did not accept: a release of the
// slot of one it did not take, the provider's breaker, a failover, a hold,
// an archive of a permanent refusal, or a retry.
func (w *Worker) sendFailed(ctx context.Context, t *asynq.Task, n tasks.Notification, a *admission, tried []string, err error, start time.Time, log *slog.Logger) error {
	p := a.pk.p
	var se *sender.SendError
	if !errors.As(err, &se) {
		se = &sender.SendError{Err: err}
	}
	if se.NotSent {
		w.release(ctx, n, a.d.Attempt, a.c.Limits, log)
	}
	if !se.Permanent && !se.Throttled {
		w.providerFailed(ctx, p, log)
	}
	if !se.Permanent && se.NotSent && a.c.Match.Exempt && w.canFailOver(n, p, a.order, tried) {
		if se.Throttled {
			_, _ = w.holdProvider(ctx, n, p, se, start, log)
		}
		w.metrics.Sends.WithLabelValues(string(n.Channel), "failover").Inc()
		return &errFailover{from: p.name, err: err}
	}
	if se.Throttled && !se.Permanent {
		return w.backPressure(ctx, n, p, se, start, log)
	}
	if !se.Permanent && se.NotSent && w.canFailOver(n, p, a.order, tried) {
		// Not taken: tried again soon, at the next provider once this one
		// is marked down and the grace is over (pickProvider); not a failure.
		w.metrics.Sends.WithLabelValues(string(n.Channel), "failover").Inc()
		retryAt := time.Now().Add(min(w.cfg.RetryBase, max(w.cfg.FailoverGrace, 100*time.Millisecond)))
		log.Warn("provider did not take the send; trying again, at the next provider once this one is down for the grace",
			"provider", p.name, "err", err, "retry_at", retryAt.UTC())
		return &ThrottledError{RetryAt: retryAt, WakeAt: slotTime(retryAt), Rule: "provider " + string(n.Channel) + ":" + p.name + " failing"}
	}
	if se.Permanent {
		w.metrics.Sends.WithLabelValues(string(n.Channel), "permanent").Inc()
		w.archived(n, tasks.ReasonPermanent)
		log.Warn("permanent send failure; archiving", "err", err, "code", se.Code)
		w.suppress(ctx, n, se, log)
		w.fallBack(ctx, n, se.Code, log)
		return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonPermanent, err), asynq.SkipRetry)
	}
	w.metrics.Sends.WithLabelValues(string(n.Channel), "transient").Inc()
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	if budget := tasks.RetryBudget(t, maxRetry); retried >= budget {
		w.archived(n, tasks.ReasonBudget)
		log.Warn("send failed and the retry budget is used up; archiving", "err", err, "retried", retried, "budget", budget)
		return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonBudget, fmt.Errorf("%w (retry budget of %d used)", err, budget)), asynq.SkipRetry)
	}
	log.Warn("transient send failure; will retry", "err", err, "retried", retried, "outcome_known", se.NotSent)
	return err
}

// recheck asks the limiter again, for now, for a send whose wait for an
// in-flight cap (the cap full, or Redis away meanwhile) took it past its
// slot: sending on the old slot would crowd the next window. It keeps the
// caps it holds; a send that no longer fits now goes back to Asynq for its
// new slot (nil: a holds the new admission).
func (w *Worker) recheck(ctx context.Context, t *asynq.Task, n tasks.Notification, a *admission, late time.Duration, log *slog.Logger) error {
	w.lateWake(ctx, n, a.d, a.c.Limits, late+w.cfg.SendSlack/2, log)
	return w.reask(ctx, t, n, a, log)
}

// unlessHeld reads the provider holds of a send that waited for an
// in-flight cap (a wait for the slot reads them itself, just before the
// slot: waitForSlot); held, it gives the slot back and asks again, which
// books it after the hold, in the order the limiter places it.
func (w *Worker) unlessHeld(ctx context.Context, t *asynq.Task, n tasks.Notification, a *admission, log *slog.Logger) error {
	if !w.heldBack(ctx, n, a.d.Attempt, a.c, log) {
		return nil
	}
	return w.reask(ctx, t, n, a, log)
}

// reask asks the limiter again, for now, for a send whose slot was given
// back: admitted (a holds it), or booked and handed to Asynq.
func (w *Worker) reask(ctx context.Context, t *asynq.Task, n tasks.Notification, a *admission, log *slog.Logger) error {
	c := a.c
	c.opts.Horizon = 0 // admitted for now, or booked
	d, _, replied, err := w.check(ctx, n, c, log)
	if err != nil {
		return err
	}
	why := waitReason(d, c.Limits)
	switch d.Status {
	case throttle.StatusAdmitted:
		a.d, a.sendBy = d, slotBy(replied, d).Add(w.cfg.SendSlack/2)
		return nil
	case throttle.StatusBooked, throttle.StatusDenied:
		return w.reschedule(ctx, t, n, d, why, log)
	default:
		return w.settled(n, c, d, why, log)
	}
}

// backPressure handles a provider's throttling answer: it holds the scope
// the answer names in Redis for every worker (the provider's Retry-After,
// else an exponential hold), so every queued send is booked after the hold
// instead of each retrying into it, and puts this task back for the hold's
// end without spending its retry budget (a ThrottledError is not a failure).
// sent is when the answered request left: one already in flight when
// another worker's hold began does not extend it.
func (w *Worker) backPressure(ctx context.Context, n tasks.Notification, p *provider, se *sender.SendError, sent time.Time, log *slog.Logger) error {
	scope := cmp.Or(se.Hold, sender.HoldProvider)
	h, err := w.holdProvider(ctx, n, p, se, sent, log)
	if err != nil {
		// Without the hold this task still waits: as a plain transient failure would, but unspent.
		log.Error("provider throttled and its hold could not be recorded; retrying this send alone", "err", err)
		retryAt := time.Now().Add(max(se.RetryAfter, holdBase))
		return &ThrottledError{RetryAt: retryAt, WakeAt: slotTime(retryAt), Rule: "provider back-pressure"}
	}
	w.metrics.Sends.WithLabelValues(string(n.Channel), "throttled").Inc()
	retryAt := time.Now().Add(time.Until(h.Until))
	if len(w.providers[n.Channel]) > 1 {
		// Another provider may take it once the grace is over (pickProvider).
		if graceEnd := time.Now().Add(max(w.cfg.FailoverGrace, 100*time.Millisecond)); graceEnd.Before(retryAt) {
			retryAt = graceEnd
		}
	}
	state := "begun"
	if h.Extended {
		state = "extended"
	}
	log.Warn("provider back-pressure: every worker's sends on this scope wait for the hold", "scope", string(n.Channel)+":"+scope, "provider", p.name,
		"until", h.Until.UTC(), "retry_after", se.RetryAfter, "level", h.Level, "hold", state, "code", se.Code, "err", se.Err)
	return &ThrottledError{RetryAt: retryAt, WakeAt: slotTime(retryAt), Rule: "provider back-pressure (" + string(n.Channel) + ":" + scope + ")"}
}

// holdProvider records a throttling answer of p as a hold of the scope it
// names (p's account, or the origin at p) for every worker.
func (w *Worker) holdProvider(ctx context.Context, n tasks.Notification, p *provider, se *sender.SendError, sent time.Time, log *slog.Logger) (throttle.HoldState, error) {
	scope := cmp.Or(se.Hold, sender.HoldProvider)
	key := p.hold
	if o := w.cfg.Origin(n); scope == sender.HoldSender && o != "" {
		key = w.senderHoldKey(p, o)
	}
	var h throttle.HoldState
	err := w.withRedis(ctx, log, "provider hold", func(ctx context.Context) error {
		var err error
		h, err = w.limiter.Hold(ctx, key, min(time.Since(sent), throttle.MaxHold), min(se.RetryAfter, throttle.MaxHold), holdBase, holdMax, se.Code)
		return err
	})
	if err == nil {
		state := "begun"
		if h.Extended {
			state = "extended"
		}
		w.metrics.Holds.WithLabelValues(string(n.Channel), scope, state).Inc()
	}
	return h, err
}

// providerWait turns a provider pick that ends the run into what Asynq is
// to do: a standard send waiting for its provider's grace, or its
// probe, goes back for then (not a failure).
func (w *Worker) providerWait(n tasks.Notification, err error, log *slog.Logger) error {
	var pw *errProviderWait
	if !errors.As(err, &pw) {
		return err
	}
	retryAt := pw.until
	if soon := time.Now().Add(10 * time.Millisecond); retryAt.Before(soon) {
		retryAt = soon
	}
	log.Info("its provider is down or held; waiting", "provider", pw.p, "until", retryAt.UTC())
	return &ThrottledError{RetryAt: retryAt, WakeAt: slotTime(retryAt), Rule: "provider " + string(n.Channel) + ":" + pw.p + " down"}
}

// capLease is how long an in-flight lease lasts unrenewed: a killed
// worker's slots come back within it (SLUICE_ORPHAN_AFTER, 15 s when the
// sweep is off). A running send renews its lease every third of it.
func (w *Worker) capLease() time.Duration { return cmp.Or(w.cfg.OrphanAfter, 15*time.Second) }

// takeCaps takes a slot of every in-flight cap of the send (all or none),
// waiting in the worker up to MaxInlineWait for one to free: Redis has no
// signal for a lease's end, so it asks again after a short, jittered pause.
// Without a slot by then it gives the send's quota slot back and puts the
// task back for a second later, not a failure. The returned func, called
// after the send, stops the renewal and frees the slots.
func (w *Worker) takeCaps(ctx context.Context, n tasks.Notification, a *admission, log *slog.Logger) (func(), error) {
	holder := n.ID + "." + strconv.Itoa(a.d.Attempt)
	ttl := w.capLease()
	deadline := time.Now().Add(w.cfg.MaxInlineWait)
	pause := 5 * time.Millisecond
	for {
		var l throttle.Lease
		err := w.withRedis(ctx, log, "in-flight cap", func(ctx context.Context) error {
			var err error
			l, err = w.limiter.Acquire(ctx, n.Tenant, holder, ttl, a.c.Caps...)
			return err
		})
		if err != nil {
			w.release(ctx, n, a.d.Attempt, a.c.Limits, log)
			return nil, &UnavailableError{Err: err}
		}
		if l.Granted {
			break
		}
		if time.Now().Add(pause).After(deadline) {
			w.release(ctx, n, a.d.Attempt, a.c.Limits, log)
			w.metrics.CapWaits.WithLabelValues(string(n.Channel), "deferred").Inc()
			log.Info("in-flight cap full; deferring", "cap", a.c.Caps[l.Full].String())
			retryAt := time.Now().Add(time.Second)
			return nil, &ThrottledError{RetryAt: retryAt, WakeAt: slotTime(retryAt), Rule: a.c.Caps[l.Full].String()}
		}
		select {
		case <-ctx.Done():
			w.release(ctx, n, a.d.Attempt, a.c.Limits, log)
			return nil, ctx.Err()
		case <-time.After(pause/2 + rand.N(pause)):
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
	stop := make(chan struct{})
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		tick := time.NewTicker(ttl / 3)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl/3)
				l, err := w.limiter.Acquire(rctx, n.Tenant, holder, ttl, a.c.Caps...)
				cancel()
				if err != nil || !l.Granted {
					log.Warn("in-flight lease could not be renewed; the send goes on", "err", err)
				}
			}
		}
	}()
	return func() {
		close(stop)
		<-renewed
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := w.limiter.Free(fctx, n.Tenant, holder, a.c.Caps...); err != nil {
			log.Warn("in-flight slots not freed; they come back when their lease lapses", "err", err, "lapse_in", ttl)
		}
	}, nil
}
