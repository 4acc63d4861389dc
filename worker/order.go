package worker

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// recipientOrder keeps one recipient's checks in the order this worker's
// processors were handed their tasks (the fair dispatch's hand-outs, which
// follow each tenant's enqueue order in its lane). A task checks only once
// every task handed out before it has said whom it goes to (decoded) or
// left, and none of those to the same tenant, lane and recipient is still
// before its check — unless that one is in the same cohort, whose checks
// run in seat order in one call anyway. So of two notifications to one
// recipient, the later is never admitted ahead of the earlier when the
// rules would admit the earlier: a starved goroutine no longer lets #6
// overtake #5.
//
// It orders this worker's tasks only: two workers that took tasks of one
// recipient do not wait for each other. A task waits at most maxTurnWait
// for those before it (a processor that never runs its task — a shutdown —
// must not stall the others): past it, it checks as it would without the
// order.
type recipientOrder struct {
	mu      sync.Mutex
	next    uint64
	seqs    map[string]uint64 // task id → its place, until its run starts
	open    map[uint64]*turn  // places handed out whose task has not checked yet
	changed chan struct{}     // closed and replaced at every change of open
}

// turn is one handed-out task until its check.
type turn struct {
	id     string
	handed time.Time
	known  bool // its task said whom it goes to
	key    string
	cohort *throttle.Cohort
}

// maxTurnWait bounds a task's wait for the checks of those handed out
// before it.
const maxTurnWait = time.Second

func newRecipientOrder() *recipientOrder {
	return &recipientOrder{seqs: map[string]uint64{}, open: map[uint64]*turn{}, changed: make(chan struct{})}
}

// handed records that the task id was handed to a processor, next in turn.
func (o *recipientOrder) handed(id string) {
	if id == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, dup := o.seqs[id]; dup {
		return
	}
	o.seqs[id] = o.next
	o.open[o.next] = &turn{id: id, handed: time.Now()}
	o.next++
}

// start returns the place of a task whose run starts (ok false: it was not
// handed out through the dispatch, or started already).
func (o *recipientOrder) start(id string) (uint64, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	seq, ok := o.seqs[id]
	delete(o.seqs, id)
	return seq, ok
}

// broadcastLocked wakes every waiting task. o.mu held.
func (o *recipientOrder) broadcastLocked() {
	close(o.changed)
	o.changed = make(chan struct{})
}

// known records whom the task at seq goes to, and its cohort (nil: none).
func (o *recipientOrder) known(seq uint64, key string, cohort *throttle.Cohort) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if t := o.open[seq]; t != nil {
		t.known, t.key, t.cohort = true, key, cohort
		o.broadcastLocked()
	}
}

// done frees the task at seq's place: it checked, or ended before a check.
func (o *recipientOrder) done(seq uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.open[seq]; ok {
		delete(o.open, seq)
		o.broadcastLocked()
	}
}

// wait returns once the task at seq may check (see recipientOrder), ctx
// ends, or maxTurnWait passed.
func (o *recipientOrder) wait(ctx context.Context, seq uint64) {
	timer := time.NewTimer(maxTurnWait)
	defer timer.Stop()
	for {
		o.mu.Lock()
		me := o.open[seq]
		blocked := false
		for s, t := range o.open {
			if s >= seq || me == nil {
				continue
			}
			if !t.known && time.Since(t.handed) > maxTurnWait {
				// Handed out, never run (its processor gave up on it: a
				// shutdown, a deadline already past): it holds no one back.
				delete(o.open, s)
				delete(o.seqs, t.id)
				continue
			}
			if !t.known || t.key == me.key && (t.cohort == nil || t.cohort != me.cohort) {
				blocked = true
			}
		}
		changed := o.changed
		o.mu.Unlock()
		if !blocked {
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		case <-timer.C:
			return
		}
	}
}

// orderPlace is a task's place in its worker's recipientOrder, carried in
// its context; its methods do nothing on a nil place (a task not handed out
// through the dispatch).
type orderPlace struct {
	o    *recipientOrder
	seq  uint64
	over bool // checked, or ended before a check: only the task's goroutine touches it
}

type orderKey struct{}

// placeOf returns the task's place (nil: none).
func placeOf(ctx context.Context) *orderPlace {
	p, _ := ctx.Value(orderKey{}).(*orderPlace)
	return p
}

// known says whom the task goes to: its tenant, lane and recipient.
func (p *orderPlace) known(key string, seat throttle.Seat) {
	if p != nil && !p.over {
		p.o.known(p.seq, key, seat.Cohort())
	}
}

// wait returns once the task may check (recipientOrder.wait).
func (p *orderPlace) wait(ctx context.Context) {
	if p != nil && !p.over {
		p.o.wait(ctx, p.seq)
	}
}

// done frees the task's place; only its first call counts.
func (p *orderPlace) done() {
	if p != nil && !p.over {
		p.over = true
		p.o.done(p.seq)
	}
}
