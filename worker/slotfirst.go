package worker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/sluicehq/sluice/throttle"
)

// reqSlots are a provider's request slots of one lane kind in this worker
// (CONCURRENCY, PRIORITY_CONCURRENCY), and how many sends wait for one.
type reqSlots struct {
	*semaphore.Weighted
	size    int64
	waiting atomic.Int64
}

func newReqSlots(n int) *reqSlots {
	return &reqSlots{Weighted: semaphore.NewWeighted(int64(n)), size: int64(max(n, 1))}
}

// acquire waits for a slot, counted among the waiting meanwhile.
func (r *reqSlots) acquire(ctx context.Context) error {
	r.waiting.Add(1)
	defer r.waiting.Add(-1)
	return r.Acquire(ctx, 1)
}

// wait is about how long a send that finds no slot free waits for one: a
// request time (pace, the providers' recent one) per turn of the slots
// for the sends ahead of it.
func (r *reqSlots) wait(pace time.Duration) time.Duration {
	return time.Duration(r.waiting.Load()/r.size+1) * pace
}

// requestSlots are the request slots a send of c takes at p: the priority
// lane's for an exempt (priority) send, else the standard and bulk lanes'.
func (p *provider) requestSlots(c check) *reqSlots {
	if c.Match.Exempt {
		return p.prioritySlots
	}
	return p.slots
}

// heldSlot is a provider request slot taken before the send's check
// (slotFirst). The send admitted for now keeps it for its request
// (dispatch); every other outcome frees it. free is safe to call again
// and on nil.
type heldSlot struct {
	sem  *reqSlots
	once sync.Once
}

func (h *heldSlot) free() {
	if h != nil {
		h.once.Do(func() { h.sem.Release(1) })
	}
}

// takeSlot returns the request slot of sem the send holds: the one
// slotFirst took for it, else one it waits for now.
func takeSlot(ctx context.Context, sem *reqSlots, pre *heldSlot) (*heldSlot, error) {
	if pre != nil {
		return pre, nil // of sem: taken for the same pick and check
	}
	if err := sem.acquire(ctx); err != nil {
		return nil, err
	}
	return &heldSlot{sem: sem}, nil
}

// slotFirst takes the send's request slot before its check, after the
// recipient's order (so it holds a slot only while it asks Redis), when the
// send would otherwise wait long for one after its admission: the
// providers are slow (their recent request time, pace, above above), or
// the sends queued ahead of it would keep it waiting longer than above. It
// waits for one when none is free, and the send is admitted for
// now only when it can go at once. Checked first, it would be admitted and
// then wait for a slot past half the send slack: its admission given back
// and checked again (a late wake: a release and a second check; 3,413 of
// 20,000 sends of a busy worker were). A check that waits for a slot gives
// up its cohort seat first: the cohort goes without it. Otherwise it takes
// none: a slot comes within milliseconds, and a check holding one would
// keep it from a send while its cohort gathers (always taken first, at
// CONCURRENCY 10 batching halved: 0.83 round trips a task, not 0.37). A
// send with in-flight caps takes its slot after them, as before (dispatch).
// Returns nil when it took none.
func slotFirst(ctx context.Context, pk pick, c check, seat *throttle.Seat, pace, above time.Duration) *heldSlot {
	if pk.p == nil || len(c.Caps) > 0 {
		return nil
	}
	sem := pk.p.requestSlots(c)
	if pace <= above && sem.wait(pace) <= above {
		return nil // the common case: one atomic read, the semaphore untouched
	}
	if !sem.TryAcquire(1) {
		seat.Leave()
		*seat = throttle.Seat{}
		if sem.acquire(ctx) != nil {
			return nil
		}
	}
	return &heldSlot{sem: sem}
}

// slowAbove is the wait for a request slot past which a check takes its
// slot first (slotFirst): a quarter of the send slack (25 ms without one).
func (c Config) slowAbove() time.Duration {
	if c.SendSlack <= 0 {
		return 25 * time.Millisecond
	}
	return c.SendSlack / 4
}
