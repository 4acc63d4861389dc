package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/internal/orphans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// waiter holds admitted sends in process until their slot, reading again
// just before it what the wait may have changed, and gives back the slots
// of those that woke too late or are stopped.
type waiter struct {
	*core
	waiters chan struct{} // tokens of tasks waiting in process for their slot (MAX_WAITERS)
	rec     *records
	// holder registers the sends waiting for their slots, so that another
	// worker takes them over within seconds should this one die (nil: off,
	// HELD_DEAD_AFTER=0); skip tells the batched completions to leave a
	// task taken over alone (held.go).
	holder *orphans.Holder
	skip   func(queue, id string)
}

func (wa *waiter) releaseWaiter(held bool) {
	if held {
		<-wa.waiters
	}
}
func (wa *waiter) tryWaiter() bool {
	select {
	case wa.waiters <- struct{}{}:
		return true
	default:
		return false
	}
}

// lateWake gives back a slot whose send could no longer begin within half
// the send slack after it.
func (wa *waiter) lateWake(ctx context.Context, n tasks.Notification, d throttle.Decision, limits []throttle.Limit, late time.Duration, log *slog.Logger) {
	wa.metrics.LateWakes.WithLabelValues(string(n.Channel)).Inc()
	wa.rec.release(ctx, n, d.Attempt, limits, log)
	log.Warn("too late for its slot; asking again instead of sending late", "late", late.Round(time.Millisecond))
}

// giveBack ends a wait for a slot on shutdown: the slot is given back and
// the task handed to Asynq for it.
func (wa *waiter) giveBack(ctx context.Context, n tasks.Notification, d throttle.Decision, limits []throttle.Limit, h *heldTask, log *slog.Logger) error {
	if err := wa.own(ctx, h, log); err != nil {
		return err
	}
	wa.rec.release(ctx, n, d.Attempt, limits, log)
	log.Info("stopping: gave back a slot not yet used; the task goes back to the queue for it")
	at := time.Now().Add(time.Until(d.Now.Add(d.Wait)))
	return &ThrottledError{RetryAt: at, WakeAt: slotTime(at), Rule: "shutdown"}
}

// heldBack reads the provider holds c named for a send admitted before it
// waited (the check that admitted it saw no hold). A live one gives the
// send's slot back and reports true: asked again, it is booked after the
// hold. A hold that cannot be read lets the send go, as it would have
// without the read.
func (wa *waiter) heldBack(ctx context.Context, n tasks.Notification, attempt int, c check, log *slog.Logger) bool {
	until, err := wa.limiter.HeldUntil(ctx, c.opts.Holds...)
	if err != nil {
		log.Warn("could not read the provider holds before a send that waited; sending", "err", err)
		return false
	}
	if !until.After(time.Now()) {
		return false
	}
	wa.metrics.HeldWakes.WithLabelValues(string(n.Channel)).Inc()
	wa.rec.release(ctx, n, attempt, c.Limits, log)
	log.Info("a provider hold began while this send waited; asking again", "hold_until", until.UTC())
	return true
}

// readBeforeSend reads, in one round trip, the provider holds c named and
// the recipient's consent, for a send admitted before it waited for its
// slot. A hold that is live now gives the slot back: errHeld. An opt-out
// recorded meanwhile gives it back too and archives the send (reason
// suppressed), as the check would have. The reading has until sendBy: what
// Redis cannot answer by then (or at all) lets the send go on what its
// admission read, at most MaxInlineWait earlier, and the log says so.
func (wa *waiter) readBeforeSend(ctx context.Context, n tasks.Notification, d throttle.Decision, c check, sendBy time.Time, h *heldTask, log *slog.Logger) error {
	if wa.cfg.SendSlack <= 0 {
		sendBy = time.Now().Add(50 * time.Millisecond)
	}
	rctx, cancel := context.WithDeadline(ctx, sendBy)
	defer cancel()
	var held func() (time.Time, error)
	var verdict func() (consent.Verdict, error)
	var claimed func() (bool, error)
	cc := c.opts.Consent
	_, _ = wa.rdb.Pipelined(rctx, func(p redis.Pipeliner) error {
		if h != nil {
			claimed = wa.limiter.QueueClaim(rctx, p, n.Tenant, n.ID, h.attempt, h.nonce)
			wa.endHold(rctx, p, h)
		}
		if len(c.opts.Holds) > 0 {
			held = wa.limiter.QueueHolds(rctx, p, c.opts.Holds...)
		}
		if cc != nil {
			verdict = wa.consent.QueueCheck(rctx, p, n.Tenant, n.Channel, n.To, cc.Category, cc.Exempt)
		}
		return nil
	}) // each reply is read on its own below
	if err := wa.claimed(ctx, h, claimed, log); err != nil {
		return err
	}
	if held != nil {
		if until, err := held(); err != nil {
			log.Warn("could not read the provider holds before a send that waited; sending", "err", err)
		} else if until.After(time.Now()) {
			wa.metrics.HeldWakes.WithLabelValues(string(n.Channel)).Inc()
			wa.rec.release(ctx, n, d.Attempt, c.Limits, log)
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
	wa.rec.release(ctx, n, d.Attempt, c.Limits, log)
	log.Warn("the recipient's consent changed during the wait for the slot; archiving, not sending", "block", v.Reason.String())
	wa.archived(n, tasks.ReasonSuppressed)
	return fmt.Errorf("%w: %w", tasks.Archived(tasks.ReasonSuppressed, fmt.Errorf("the recipient's consent was withdrawn while it waited for its slot (%s); not sent", v.Reason)), asynq.SkipRetry)
}

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
//
// replan (nil: none) is closed when a provider ahead of the one the send
// was admitted at changes state: the slot is given back (errReplan) and
// the send plans again — back to its first provider the moment it may be.
func (wa *waiter) waitForSlot(ctx context.Context, n tasks.Notification, d throttle.Decision, c check, slot, sendBy time.Time, replan <-chan struct{}, log *slog.Logger) error {
	limits := c.Limits
	wa.metrics.InlineWaits.WithLabelValues(string(n.Channel)).Inc()
	defer waiting(ctx)()
	h := wa.hold(ctx, n, d, c, log)
	defer wa.unhold(h)
	// A held send reads before its slot whether it still owns it (claim).
	peek := len(c.opts.Holds) > 0 || c.opts.Consent != nil || h != nil
	wake := slot
	if peek {
		wake = slot.Add(-holdPeek)
	}
	timer := time.NewTimer(time.Until(wake))
	defer timer.Stop()
	select {
	case <-timer.C:
		if peek {
			if err := wa.readBeforeSend(ctx, n, d, c, sendBy, h, log); err != nil {
				return err
			}
			if rest := time.Until(slot); rest > 0 {
				timer.Reset(rest)
				select {
				case <-timer.C:
				case <-ctx.Done():
					return wa.giveBack(ctx, n, d, limits, h, log)
				case <-wa.stopping:
					return wa.giveBack(ctx, n, d, limits, h, log)
				}
			}
		}
		// A timer that fires late (a starved CPU, a GC pause) would send
		// after the slot by more than the slack allows for: give the slot
		// back and ask again rather than crowd the next window.
		if late := time.Since(sendBy); wa.cfg.SendSlack > 0 && late > 0 {
			wa.lateWake(ctx, n, d, limits, late+wa.cfg.SendSlack/2, log)
			return errLate
		}
		return nil
	case <-replan:
		if err := wa.own(ctx, h, log); err != nil {
			return err
		}
		wa.rec.release(ctx, n, d.Attempt, limits, log)
		log.Info("a provider ahead of this send's changed state while it waited for its slot; planning again")
		return errReplan
	case <-ctx.Done():
	case <-wa.stopping:
	}
	return wa.giveBack(ctx, n, d, limits, h, log)
}

// waitForProvider waits in process, for a send whose provider said to
// wait (pw: its grace, its cooldown, a moment before it is tried again),
// until the instant planned or until a provider of its channel changes
// state, whichever comes first: true, and the send plans again at once.
// False when the instant is further than MaxInlineWait, no waiter token is
// free, or the worker stops: the send goes back to Asynq (providerWait).
func (wa *waiter) waitForProvider(ctx context.Context, pw *errProviderWait, log *slog.Logger) bool {
	rest := time.Until(pw.until)
	if rest > wa.cfg.MaxInlineWait || !wa.tryWaiter() {
		return false
	}
	defer wa.releaseWaiter(true)
	defer waiting(ctx)()
	log.Info("its provider is down or held; waiting in process", "provider", pw.p, "until", pw.until.UTC())
	timer := time.NewTimer(max(rest, time.Millisecond))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-pw.changed:
		log.Info("a provider's state changed while this send waited for one; planning again", "provider", pw.p)
		return true
	case <-ctx.Done():
	case <-wa.stopping:
	}
	return false
}

// waitForReplan holds in process a send booked at a later provider of its
// list (d) whose earlier provider may come back before the booked slot
// (pk.replanAt: a cooldown's end, when a probe may go, or a hold's), until
// then or until a provider's state changes: true, and the send plans
// again (its own booking, if it picks the same provider). False when the
// instant is not before the slot, further than MaxInlineWait, or no waiter
// token is free.
func (wa *waiter) waitForReplan(ctx context.Context, pk pick, d throttle.Decision, log *slog.Logger) bool {
	if pk.replanAt.IsZero() || !pk.replanAt.Before(d.RetryAt) {
		return false
	}
	return wa.waitForProvider(ctx, &errProviderWait{until: pk.replanAt, p: pk.replanFor, changed: pk.replan}, log)
}

// errReplan: a provider ahead of the one a send was admitted at changed
// state while it waited for its slot, which it gave back to plan again.
var errReplan = errors.New("a provider changed state during the wait")

// errLate: a send woke too late for its slot, which it gave back.
var errLate = errors.New("woke too late for the slot")

// errHeld: a provider hold began while a send waited for its slot, which
// it gave back.
var errHeld = errors.New("a provider hold began during the wait")

// holdPeek is how long before its slot a waiting send reads again what may
// have changed during its wait — the provider holds and the recipient's
// consent, in one round trip (readBeforeSend) — so that the read does not
// delay the send: a hold that begins in the last holdPeek finds the send on
// its way, as it finds requests already in flight, and an opt-out recorded
// in it still holds within the second in which a refusal must hold.
const holdPeek = 10 * time.Millisecond
