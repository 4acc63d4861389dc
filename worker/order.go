package worker

import (
	"context"
	"sync"
	"time"
)

// recipientOrder keeps one recipient's checks in the order this worker's
// processors were handed their tasks (the fair dispatch's hand-outs, which
// follow each tenant's enqueue order in its lane). A task checks only once
// every task handed out before it has said whom it goes to (decoded) or
// left, and none of those to the same tenant, lane and recipient is still
// running (it is freed once sent, deferred or settled, so a later task does
// not take a slot an earlier one gave back to ask again). Not even one of
// the same cohort goes first: a member that comes late to its cohort's call
// goes alone after it. (Two of one recipient's tasks in one batch thus cost
// the later the cohort's wait.) So of two notifications to one
// recipient, the later is never admitted ahead of the earlier when the
// rules would admit the earlier: a starved goroutine no longer lets #6
// overtake #5.
//
// It orders this worker's tasks only: two workers that took tasks of one
// recipient do not wait for each other. A task waits at most maxTurnWait
// for those before it, a safety net (a processor that never runs its task —
// a shutdown — must not stall the others for good): past it, it checks as
// it would without the order. An earlier run of the recipient lasts at most
// its in-process wait (MAX_INLINE_WAIT) and a send; a task handed out is
// decoded within milliseconds, and within seconds on a machine loaded far
// beyond its cores.
type recipientOrder struct {
	mu      sync.Mutex
	next    uint64            // the place the next task handed out gets
	low     uint64            // every place below it is known or free
	seqs    map[string]uint64 // task id → its place, until its run starts
	open    map[uint64]*turn  // places whose task has not checked yet
	byKey   map[string][]uint64
	waiting int           // tasks in wait
	changed chan struct{} // closed and replaced at a change, when a task waits
}

// turn is one handed-out task until its check.
type turn struct {
	id     string
	handed time.Time
	known  bool // its task said whom it goes to
	key    string
}

// maxTurnWait bounds a task's wait for those handed out before it.
const maxTurnWait = 10 * time.Second

func newRecipientOrder() *recipientOrder {
	return &recipientOrder{seqs: map[string]uint64{}, open: map[uint64]*turn{}, byKey: map[string][]uint64{}, changed: make(chan struct{})}
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

// changedLocked wakes the waiting tasks, if any. o.mu held.
func (o *recipientOrder) changedLocked() {
	if o.waiting > 0 {
		close(o.changed)
		o.changed = make(chan struct{})
	}
}

// known records whom the task at seq goes to.
func (o *recipientOrder) known(seq uint64, key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	t := o.open[seq]
	if t == nil || t.known {
		return
	}
	t.known, t.key = true, key
	q := o.byKey[key]
	i := len(q)
	for i > 0 && q[i-1] > seq { // places mostly come known in order
		i--
	}
	o.byKey[key] = append(q[:i], append([]uint64{seq}, q[i:]...)...)
	o.changedLocked()
}

// done frees the task at seq's place: it checked, or ended before a check.
func (o *recipientOrder) done(seq uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.freeLocked(seq)
	o.changedLocked()
}

// freeLocked drops seq's place. o.mu held.
func (o *recipientOrder) freeLocked(seq uint64) {
	t := o.open[seq]
	if t == nil {
		return
	}
	delete(o.open, seq)
	if !t.known {
		return
	}
	q := o.byKey[t.key]
	for i, s := range q {
		if s == seq {
			q = append(q[:i], q[i+1:]...)
			break
		}
	}
	if len(q) == 0 {
		delete(o.byKey, t.key)
	} else {
		o.byKey[t.key] = q
	}
}

// mayCheckLocked reports whether the task at seq may check now. o.mu held.
func (o *recipientOrder) mayCheckLocked(seq uint64) bool {
	me := o.open[seq]
	if me == nil || !me.known {
		return true
	}
	for o.low < seq { // every place below seq known or free?
		t := o.open[o.low]
		switch {
		case t == nil, t.known:
			o.low++
		case time.Since(t.handed) > maxTurnWait:
			// Handed out, never run (its processor gave up on it: a
			// shutdown, a deadline already past): it holds no one back.
			delete(o.seqs, t.id)
			o.freeLocked(o.low)
			o.low++
		default:
			return false
		}
	}
	for _, s := range o.byKey[me.key] {
		return s >= seq // an earlier one to the same recipient still running holds me back
	}
	return true
}

// wait returns once the task at seq may check (see recipientOrder), ctx
// ends, or maxTurnWait passed.
func (o *recipientOrder) wait(ctx context.Context, seq uint64) {
	o.mu.Lock()
	if o.mayCheckLocked(seq) {
		o.mu.Unlock()
		return
	}
	o.waiting++
	defer func() { o.mu.Lock(); o.waiting--; o.mu.Unlock() }()
	o.mu.Unlock()
	timer := time.NewTimer(maxTurnWait)
	defer timer.Stop()
	for {
		o.mu.Lock()
		if o.mayCheckLocked(seq) {
			o.mu.Unlock()
			return
		}
		changed := o.changed
		o.mu.Unlock()
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
func (p *orderPlace) known(key string) {
	if p != nil && !p.over {
		p.o.known(p.seq, key)
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
