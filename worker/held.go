package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/orphans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// Sends held for their slot, and their recovery when the worker holding
// them dies (internal/orphans, "Held tasks"; throttle/fence.go).
//
// A send admitted for a slot ahead waits in this process (waitForSlot). It
// is registered as held for that wait (hold: one script call, the only
// cost, with the read before the send that ends it; a send admitted for
// now is never held and pays nothing), and this worker's holder stamps
// itself every 250 ms while it holds any. Should the worker stop
// answering, a sweeper presumes it dead HELD_DEAD_AFTER (1 s) after its
// last stamp, by Redis's clock, turns the send's admission into a booking
// (throttle.Limiter.TakeOver: the slot kept) and puts the task back at the
// head of its queue: its re-run takes the booking back at the same slot,
// or the earliest every rule allows when that has passed.
//
// Fencing: before it sends, and before it gives the slot back, the holder
// claims the admission (throttle.Limiter.Claim, riding the read it makes
// just before the slot). A holder that was presumed dead while it lived (a
// starved CPU, a late stamp) finds it lost the task: it neither sends, nor
// gives back the slot the re-run now holds, nor completes the Asynq task
// the re-run now runs (errTakenOver: Asynq's RevokeTask, and the batched
// completions skip it). A takeover that comes after the claim fails: the
// send is the holder's, so nothing is sent twice.

// heldTask is a send registered as held for its slot.
type heldTask struct {
	queue, id string // the Asynq task
	nid       string // the notification
	attempt   int
	nonce     string
	tenant    string
	ended     bool // its hold was ended (endHold, unhold)
}

// errTakenOver: a send held for its slot was taken over by another worker
// (this one was presumed dead); it is neither sent nor completed here.
var errTakenOver = errors.New("taken over by another worker while it waited for its slot")

// fenceOf is what a held send's entry says, for its takeover: the tenant,
// the notification, the attempt and the nonce of the check that admitted it.
func fenceOf(h *heldTask) string {
	return h.tenant + "\n" + h.nid + "\n" + strconv.Itoa(h.attempt) + "\n" + h.nonce
}

// hold registers the send n, admitted by d under c, as held by this worker
// (nil: holds are off, or the task is not an Asynq one).
func (wa *waiter) hold(ctx context.Context, n tasks.Notification, d throttle.Decision, c check, log *slog.Logger) *heldTask {
	if wa.holder == nil || c.opts.Nonce == "" {
		return nil
	}
	q, _ := asynq.GetQueueName(ctx)
	id, ok := asynq.GetTaskID(ctx)
	if q == "" || !ok {
		return nil
	}
	h := &heldTask{queue: q, id: id, nid: n.ID, attempt: d.Attempt, nonce: c.opts.Nonce, tenant: n.Tenant}
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := wa.holder.Hold(hctx, q, id, h.nonce, fenceOf(h)); err != nil {
		log.Warn("could not register a send held for its slot; should this worker die, the lease sweep recovers it", "err", err)
	}
	return h
}

// endHold queues the end of h's hold on p.
func (wa *waiter) endHold(ctx context.Context, p redis.Pipeliner, h *heldTask) {
	if h != nil && !h.ended {
		h.ended = true
		wa.holder.QueueUnhold(ctx, p, h.queue, h.id, h.nonce)
	}
}

// unhold ends h's hold if the read before the send did not.
func (wa *waiter) unhold(h *heldTask) {
	if h != nil && !h.ended {
		h.ended = true
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		wa.holder.Unhold(ctx, h.queue, h.id, h.nonce)
	}
}

// claimed reads the claim the read before the send carried (nil: h held
// nothing): nil when the send is still this run's. One whose reply did not
// come is asked again in a round trip of its own.
func (wa *waiter) claimed(ctx context.Context, h *heldTask, claim func() (bool, error), log *slog.Logger) error {
	if claim == nil {
		return nil
	}
	mine, err := claim()
	if err != nil {
		return wa.own(ctx, h, log)
	}
	if !mine {
		return wa.takenOver(h, log)
	}
	return nil
}

// own claims h's admission in a round trip of its own, before the slot is
// given back or after the read before the send lost its reply: nil when it
// is this run's (or h is nil). While Redis does not answer it asks again
// every UNAVAILABLE_RETRY (nothing is sent meanwhile: a send that then
// finds its slot past gives it back and asks again), until the task's
// deadline or the worker stops; an answer never given leaves the task
// alone, unsent, as one taken over: the lease sweep puts it back.
func (wa *waiter) own(ctx context.Context, h *heldTask, log *slog.Logger) error {
	if h == nil {
		return nil
	}
	var mine bool
	claim := func(ctx context.Context) error {
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		var err error
		mine, err = wa.limiter.Claim(tctx, h.tenant, h.nid, h.attempt, h.nonce)
		return err
	}
	var err error
	select {
	case <-wa.stopping: // stopping: one try, then the task goes back
		err = claim(context.WithoutCancel(ctx))
	default:
		cctx, cancel := wa.afterSendContext(ctx)
		defer cancel()
		go func() {
			select {
			case <-wa.stopping:
				cancel()
			case <-cctx.Done():
			}
		}()
		err = wa.withRedis(cctx, log, "the claim of a send held for its slot", claim)
	}
	if err != nil {
		log.Error("could not tell whether this send held for its slot is still this worker's; not sending it, leaving it to the orphan sweep", "err", err)
		return wa.leave(h, err)
	}
	if !mine {
		return wa.takenOver(h, log)
	}
	return nil
}

// takenOver ends a run whose send another worker took over.
func (wa *waiter) takenOver(h *heldTask, log *slog.Logger) error {
	wa.metrics.TakenOver.WithLabelValues("lost").Inc()
	log.Warn("another worker took this send over while it waited for its slot (this worker's stamps were late); not sending it")
	return wa.leave(h, errTakenOver)
}

// leave hands Asynq a task this run must not complete, retry or archive:
// the batched completions skip it (its re-run runs under the same id).
func (wa *waiter) leave(h *heldTask, err error) error {
	if wa.skip != nil {
		wa.skip(h.queue, h.id)
	}
	return fmt.Errorf("%w: %w", asynq.RevokeTask, err)
}

// takeOver is the sweeper's TakeOver: it fences the admission a dead
// holder's entry names.
func (wa *waiter) takeOver(ctx context.Context, t orphans.HeldTask) (bool, error) {
	parts := strings.Split(t.Fence, "\n")
	if len(parts) != 4 {
		return false, nil // not one this version wrote: left to the lease sweep
	}
	attempt, err := strconv.Atoi(parts[2])
	if err != nil {
		return false, nil
	}
	ok, err := wa.limiter.TakeOver(ctx, parts[0], parts[1], attempt, parts[3])
	if ok {
		wa.metrics.TakenOver.WithLabelValues("taken").Inc()
	}
	return ok, err
}
