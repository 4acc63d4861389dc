package throttle

import (
	"context"
	"sync"
	"time"
)

// A Cohort is the checks of tasks taken from the queue together (a
// worker's batched dequeue): they are sent to Redis as one script call once
// every member has asked (Reserve with its Seat) or left (Seat.Leave), or
// once the cohort's wait has passed since it was made, whichever is first.
// Members that ask after that go as any other check. Inside the call the
// members' checks run in seat order, so of two that compete for one slot
// the earlier seat gets it.
//
// A cohort never delays a lone check: a task alone is given no seat. The
// first member to ask waits at most the cohort's wait for the others.
type Cohort struct {
	b     *batcher
	mu    sync.Mutex
	calls []*call // by seat: the calls that asked
	left  []bool  // by seat: the seats that will not ask
	open  int     // seats neither asked nor left
	sent  bool
	timer *time.Timer
}

// Seat is one member's place in a Cohort; its zero value is no seat.
type Seat struct {
	c *Cohort
	i int
}

// NewCohort makes a cohort of n seats whose members wait for each other at
// most wait (0: the limiter's default, 2 ms).
func (l *Limiter) NewCohort(n int, wait time.Duration) *Cohort {
	if wait <= 0 {
		wait = 2 * time.Millisecond
	}
	c := &Cohort{b: l.batch, calls: make([]*call, n), left: make([]bool, n), open: n}
	c.mu.Lock() // the timer may fire before it is stored
	c.timer = time.AfterFunc(wait, func() {
		c.mu.Lock()
		c.sendLocked()
	})
	c.mu.Unlock()
	return c
}

// Seat returns seat i (0 ≤ i < n).
func (c *Cohort) Seat(i int) Seat {
	if c == nil || i < 0 || i >= len(c.calls) {
		return Seat{}
	}
	return Seat{c, i}
}

// Leave says the seat's member will not ask (its task ended before its
// check); one that asked, or a cohort already sent, is left alone.
func (s Seat) Leave() {
	c := s.c
	if c == nil {
		return
	}
	c.mu.Lock()
	if c.sent || c.calls[s.i] != nil || c.left[s.i] {
		c.mu.Unlock()
		return
	}
	c.left[s.i] = true
	c.open--
	if c.open == 0 {
		c.sendLocked()
		return
	}
	c.mu.Unlock()
}

// take seats call; false: the seat was used or left, or the cohort went
// without it (the caller sends it alone).
func (s Seat) take(cl *call) bool {
	c := s.c
	c.mu.Lock()
	if c.sent || c.calls[s.i] != nil || c.left[s.i] {
		c.mu.Unlock()
		return false
	}
	c.calls[s.i] = cl
	c.open--
	if c.open == 0 {
		c.sendLocked()
		return true
	}
	c.mu.Unlock()
	return true
}

// sendLocked sends the calls seated so far as one batch, with any done
// records waiting to be carried. c.mu held; it unlocks it.
func (c *Cohort) sendLocked() {
	if c.sent {
		c.mu.Unlock()
		return
	}
	c.sent = true
	c.timer.Stop()
	var batch []*call
	for _, cl := range c.calls {
		if cl != nil && cl.state.CompareAndSwap(queued, taken) {
			batch = append(batch, cl)
		}
	}
	c.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	b := c.b
	batch = b.withCarried(batch)
	b.inflight.Add(1)
	b.exec(context.Background(), batch)
	b.inflight.Add(-1)
}

// doSeated runs o in seat's cohort: it returns once the cohort's call
// answered (or alone, when the seat cannot take it).
func (b *batcher) doSeated(ctx context.Context, seat Seat, nowA, group string, o *op) (int64, []int64, error) {
	if b.closed.Load() {
		return 0, nil, ErrClosed
	}
	c := &call{op: o, nowA: nowA, done: make(chan struct{})}
	if b.cluster {
		c.slot = slotOf(group)
	}
	if seat.c == nil || b.direct || !seat.take(c) {
		return b.do(ctx, nowA, group, o)
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(queued, abandoned) {
			return 0, nil, ctx.Err()
		}
		<-c.done
	case <-b.quit:
		if c.state.CompareAndSwap(queued, abandoned) {
			return 0, nil, ErrClosed
		}
		<-c.done
	}
	return c.now, c.reply, c.err
}
