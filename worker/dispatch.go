package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// dispatcher hands an admitted send to its provider — within the
// in-flight caps and the provider's request slots, late checks before the
// request — and handles the answer: the done record, a failover, a hold, a
// retry or an archive.
type dispatcher struct {
	*core
	adm  *admission
	wait *waiter
	prov *providerSet
	rec  *records
	fb   *fallbacks
}

// takeCaps takes a slot of every in-flight cap of the send (all or none),
// waiting in the worker up to MaxInlineWait for one to free: Redis has no
// signal for a lease's end, so it asks again after a short, jittered pause.
// Without a slot by then it gives the send's quota slot back and puts the
// task back for a second later, not a failure. The returned func, called
// after the send, stops the renewal and frees the slots.
func (dp *dispatcher) takeCaps(ctx context.Context, n tasks.Notification, a *admitted, log *slog.Logger) (func(), error) {
	holder := n.ID + "." + strconv.Itoa(a.d.Attempt)
	ttl := dp.capLease()
	deadline := time.Now().Add(dp.cfg.MaxInlineWait)
	pause := 5 * time.Millisecond
	for {
		var l throttle.Lease
		err := dp.withRedis(ctx, log, "in-flight cap", func(ctx context.Context) error {
			var err error
			l, err = dp.limiter.Acquire(ctx, n.Tenant, holder, ttl, a.c.Caps...)
			return err
		})
		if err != nil {
			dp.rec.release(ctx, n, a.d.Attempt, a.c.Limits, log)
			return nil, &UnavailableError{Err: err}
		}
		if l.Granted {
			break
		}
		if time.Now().Add(pause).After(deadline) {
			dp.rec.release(ctx, n, a.d.Attempt, a.c.Limits, log)
			dp.metrics.CapWaits.WithLabelValues(string(n.Channel), "deferred").Inc()
			log.Info("in-flight cap full; deferring", "cap", a.c.Caps[l.Full].String())
			retryAt := time.Now().Add(time.Second)
			return nil, &ThrottledError{RetryAt: retryAt, WakeAt: slotTime(retryAt), Rule: a.c.Caps[l.Full].String()}
		}
		select {
		case <-ctx.Done():
			dp.rec.release(ctx, n, a.d.Attempt, a.c.Limits, log)
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
				l, err := dp.limiter.Acquire(rctx, n.Tenant, holder, ttl, a.c.Caps...)
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
		if err := dp.limiter.Free(fctx, n.Tenant, holder, a.c.Caps...); err != nil {
			log.Warn("in-flight slots not freed; they come back when their lease lapses", "err", err, "lapse_in", ttl)
		}
	}, nil
}

// capLease is how long an in-flight lease lasts unrenewed: a killed
// worker's slots come back within it (SLUICE_ORPHAN_AFTER, 15 s when the
// sweep is off). A running send renews its lease every third of it.
func (dp *dispatcher) capLease() time.Duration { return cmp.Or(dp.cfg.OrphanAfter, 15*time.Second) }

// holdInFlightMargin: an answer to a request sent up to this long after a
// hold began counts as one already on its way (in_flight), not one that
// extends the hold. No worker could have read the hold by then, and the
// request's age is measured before this call's transit to Redis, which
// makes it look younger: a loaded full run once counted an answer to a
// request sent before the first 429 as extending the hold.
const holdInFlightMargin = 100 * time.Millisecond

// holdProvider records a throttling answer of p as a hold of the scope it
// names (p's account, or the origin at p) for every worker.
func (dp *dispatcher) holdProvider(ctx context.Context, n tasks.Notification, p *provider, se *sender.SendError, sent time.Time, log *slog.Logger) (throttle.HoldState, error) {
	scope := cmp.Or(se.Hold, sender.HoldProvider)
	key := p.hold
	if o := p.origin(n); scope == sender.HoldSender && o != "" {
		key = dp.prov.senderHoldKey(p, o)
	}
	var h throttle.HoldState
	err := dp.withRedis(ctx, log, "provider hold", func(ctx context.Context) error {
		var err error
		h, err = dp.limiter.Hold(ctx, key, min(time.Since(sent)+holdInFlightMargin, throttle.MaxHold), min(se.RetryAfter, throttle.MaxHold), holdBase, holdMax, se.Code)
		return err
	})
	if err == nil {
		// A hold begun or extended was announced with its write (the
		// script's PUBLISH on ProviderEvents): every worker reads the
		// providers' states now, and its hold cache forgets.
		dp.metrics.Holds.WithLabelValues(string(n.Channel), scope, holdLabel(h)).Inc()
	}
	return h, err
}

// holdLabel is sluice_provider_holds_total's hold label of a throttling
// answer: begun, extended (an answer to a request sent during the hold),
// or in_flight (one already on its way when it began: the hold unchanged;
// docs/rules.md).
func holdLabel(h throttle.HoldState) string {
	switch {
	case h.InFlight:
		return "in_flight"
	case h.Extended:
		return "extended"
	}
	return "begun"
}

// backPressure handles a provider's throttling answer: it holds the scope
// the answer names in Redis for every worker (the provider's Retry-After,
// else an exponential hold), so every queued send is booked after the hold
// instead of each retrying into it, and puts this task back for the hold's
// end without spending its retry budget (a ThrottledError is not a failure).
// sent is when the answered request left: one already in flight when
// another worker's hold began does not extend it.
func (dp *dispatcher) backPressure(ctx context.Context, n tasks.Notification, p *provider, se *sender.SendError, sent time.Time, log *slog.Logger) error {
	scope := cmp.Or(se.Hold, sender.HoldProvider)
	h, err := dp.holdProvider(ctx, n, p, se, sent, log)
	if err != nil {
		// Without the hold this task still waits: as a plain transient failure would, but unspent.
		log.Error("provider throttled and its hold could not be recorded; retrying this send alone", "err", err)
		retryAt := time.Now().Add(max(se.RetryAfter, holdBase))
		return &ThrottledError{RetryAt: retryAt, WakeAt: slotTime(retryAt), Rule: "provider back-pressure"}
	}
	dp.metrics.Sends.WithLabelValues(string(n.Channel), "throttled").Inc()
	log.Warn("provider back-pressure: every worker's sends on this scope wait for the hold", "scope", string(n.Channel)+":"+scope, "provider", p.name,
		"until", h.Until.UTC(), "retry_after", se.RetryAfter, "level", h.Level, "hold", holdLabel(h), "code", se.Code, "err", se.Err)
	retryAt := time.Now().Add(time.Until(h.Until))
	if dp.prov.several(n.Channel) && scope == sender.HoldProvider {
		// Another provider may take it once the grace is over: it picks
		// again then (pickProvider), or as soon as a provider's state
		// changes, in process when that is near (throttleMiddleware).
		if graceEnd := time.Now().Add(max(dp.cfg.FailoverGrace, 100*time.Millisecond)); graceEnd.Before(retryAt) {
			retryAt = graceEnd
		}
		return &errProviderWait{until: retryAt, p: p.name, changed: dp.prov.changes(n.Channel)}
	}
	return &ThrottledError{RetryAt: retryAt, WakeAt: dp.cfg.wakeFor(retryAt), Rule: "provider back-pressure (" + string(n.Channel) + ":" + scope + ")"}
}

// reask asks the limiter again, for now, for a send whose slot was given
// back: admitted (a holds it), or booked and handed to Asynq.
func (dp *dispatcher) reask(ctx context.Context, t *asynq.Task, n tasks.Notification, a *admitted, log *slog.Logger) error {
	c := a.c
	c.opts.Horizon = 0 // admitted for now, or booked
	c.opts.Nonce = ""  // a run of its own (check draws one)
	// No pick: it asks holding its request slot already (no slotFirst).
	d, _, replied, _, err := dp.adm.check(ctx, n, c, pick{}, log)
	if err != nil {
		return err
	}
	why := waitReason(d, c.Limits)
	switch d.Status {
	case throttle.StatusAdmitted:
		a.d, a.sendBy = d, slotBy(replied, d).Add(dp.cfg.SendSlack/2)
		return nil
	case throttle.StatusBooked, throttle.StatusDenied:
		if dp.prov.heldAsPicked(ctx, n, c, a.pk, d, log) {
			// Its provider's hold began while it waited: picked again now
			// (throttleMiddleware), it waits out the grace, then moves on.
			dp.rec.release(ctx, n, d.Attempt, c.Limits, log)
			return &errProviderWait{until: time.Now(), p: a.pk.p.name, changed: dp.prov.changes(n.Channel)}
		}
		return dp.rec.reschedule(ctx, t, n, d, why, a.c.wakeBy, log)
	default:
		return dp.adm.settled(n, c, d, why, log)
	}
}

// unlessHeld reads the provider holds of a send that waited for an
// in-flight cap (a wait for the slot reads them itself, just before the
// slot: waitForSlot); held, it gives the slot back and asks again, which
// books it after the hold, in the order the limiter places it.
func (dp *dispatcher) unlessHeld(ctx context.Context, t *asynq.Task, n tasks.Notification, a *admitted, log *slog.Logger) error {
	if !dp.wait.heldBack(ctx, n, a.d.Attempt, a.c, log) {
		return nil
	}
	return dp.reask(ctx, t, n, a, log)
}

// recheck asks the limiter again, for now, for a send whose wait for an
// in-flight cap (the cap full, or Redis away meanwhile) took it past its
// slot: sending on the old slot would crowd the next window. It keeps the
// caps it holds; a send that no longer fits now goes back to Asynq for its
// new slot (nil: a holds the new admission).
func (dp *dispatcher) recheck(ctx context.Context, t *asynq.Task, n tasks.Notification, a *admitted, late time.Duration, log *slog.Logger) error {
	dp.wait.lateWake(ctx, n, a.d, a.c.Limits, late+dp.cfg.SendSlack/2, log)
	return dp.reask(ctx, t, n, a, log)
}

// sendFailed records a send the provider did not accept: a release of the
// slot of one it did not take, the provider's breaker, a failover, a hold,
// an archive of a permanent refusal, or a retry.
func (dp *dispatcher) sendFailed(ctx context.Context, t *asynq.Task, n tasks.Notification, a *admitted, tried []string, err error, start time.Time, log *slog.Logger) error {
	p := a.pk.p
	var se *sender.SendError
	if !errors.As(err, &se) {
		se = &sender.SendError{Err: err}
	}
	if se.NotSent {
		dp.rec.release(ctx, n, a.d.Attempt, a.c.Limits, log)
	}
	if !se.Permanent && !se.Throttled {
		dp.prov.providerFailed(ctx, p, log)
	}
	if !se.Permanent && se.NotSent && a.c.Match.Exempt && dp.prov.canFailOver(n, p, a.order, tried) {
		if se.Throttled {
			_, _ = dp.holdProvider(ctx, n, p, se, start, log)
		}
		dp.metrics.Sends.WithLabelValues(string(n.Channel), "failover").Inc()
		return &errFailover{from: p.name, err: err}
	}
	if se.Throttled && !se.Permanent {
		return dp.backPressure(ctx, n, p, se, start, log)
	}
	if !se.Permanent && se.NotSent && dp.prov.canFailOver(n, p, a.order, tried) {
		// Not taken: tried again soon, at the next provider once this one
		// is marked down and the grace is over (pickProvider); not a failure.
		dp.metrics.Sends.WithLabelValues(string(n.Channel), "failover").Inc()
		retryAt := time.Now().Add(min(dp.cfg.RetryBase, max(dp.cfg.FailoverGrace, 100*time.Millisecond)))
		log.Warn("provider did not take the send; trying again, at the next provider once this one is down for the grace",
			"provider", p.name, "err", err, "retry_at", retryAt.UTC())
		return &errProviderWait{until: retryAt, p: p.name, changed: dp.prov.changes(n.Channel)}
	}
	if se.Permanent {
		dp.metrics.Sends.WithLabelValues(string(n.Channel), "permanent").Inc()
		dp.archived(n, tasks.ReasonPermanent)
		log.Warn("permanent send failure; archiving", "err", err, "code", se.Code)
		dp.rec.suppress(ctx, n, se, log)
		dp.fb.fallBack(ctx, n, se.Code, log)
		return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonPermanent, err), asynq.SkipRetry)
	}
	dp.metrics.Sends.WithLabelValues(string(n.Channel), "transient").Inc()
	retried, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	if budget := tasks.RetryBudget(t, maxRetry); retried >= budget {
		dp.archived(n, tasks.ReasonBudget)
		log.Warn("send failed and the retry budget is used up; archiving", "err", err, "retried", retried, "budget", budget)
		return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonBudget, fmt.Errorf("%w (retry budget of %d used)", err, budget)), asynq.SkipRetry)
	}
	log.Warn("transient send failure; will retry", "err", err, "retried", retried, "outcome_known", se.NotSent)
	return err
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
func (dp *dispatcher) dispatch(ctx context.Context, t *asynq.Task, n tasks.Notification, a *admitted, tried []string, next asynq.Handler, log *slog.Logger) error {
	defer a.slot.free() // taken before the check (slotFirst): freed on every way out
	if len(a.c.Caps) > 0 {
		done, err := dp.takeCaps(ctx, n, a, log)
		if err != nil {
			return err
		}
		defer done()
	}
	if len(a.c.Caps) > 0 {
		if err := dp.unlessHeld(ctx, t, n, a, log); err != nil {
			return err
		}
	}
	// At most CONCURRENCY (priority lane: PRIORITY_CONCURRENCY) requests of
	// this worker at the providers at once, the sends that waited in
	// process for their slots included; they queue for a request slot in
	// the order they ask, which is their slots' (a wait that makes a send
	// late is caught below).
	dp.fb.armFallback(ctx, n, log) // before the request slot: nothing between the late check and the send
	p := a.pk.p
	slot, err := takeSlot(ctx, p.requestSlots(a.c), a.slot)
	if err != nil {
		dp.rec.release(ctx, n, a.d.Attempt, a.c.Limits, log)
		return err
	}
	start := time.Now()
	if late := start.Sub(a.sendBy); dp.cfg.SendSlack > 0 && late > 0 {
		if err := dp.recheck(ctx, t, n, a, late, log); err != nil {
			slot.free()
			return err
		}
	}
	inflight := dp.metrics.ProviderInFlight.WithLabelValues(string(n.Channel), p.name)
	inflight.Inc()
	err = redact(next.ProcessTask(context.WithValue(context.WithValue(ctx, ctxKey{}, n), providerKey{}, p), t), n)
	inflight.Dec()
	slot.free() // the request is over: what follows (the done record, a hold) holds no request slot
	sent(ctx)
	took := time.Since(start)
	dp.metrics.SendLatency.WithLabelValues(string(n.Channel)).Observe(took.Seconds())
	dp.paced(took)
	if err == nil {
		dp.metrics.Sends.WithLabelValues(string(n.Channel), "sent").Inc()
		dp.metrics.ProviderSends.WithLabelValues(string(n.Channel), p.name).Inc()
		dp.rec.markDone(ctx, n, a.d.Attempt, log)
		dp.prov.providerRecovered(ctx, a.pk, log)
		dp.prov.noteProvider(ctx, n, p, log)
		return nil
	}
	return dp.sendFailed(ctx, t, n, a, tried, err, start, log)
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

// Provider back-pressure: a hold without a Retry-After lasts holdBase,
// doubling with each hold that follows another, up to holdMax.
const (
	holdBase = time.Second
	holdMax  = time.Minute
)
