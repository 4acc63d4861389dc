package throttle

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// DoneItem is one send's done record, as MarkDone writes it.
type DoneItem struct {
	Group, ID string
	Attempt   int
	TTL       time.Duration
}

// QueueDone adds the done records of items to p — one call of the
// limiter library per Cluster slot, each on one clock reading — so that
// they travel with the caller's own commands (a worker's completions of
// the tasks they belong to) in one round trip. The returned function,
// called once p ran, reports each item's error, nil when its record was
// written; a call that found the library missing on its server (a new or
// flushed one) is made again on its own, once.
func (l *Limiter) QueueDone(ctx context.Context, p redis.Pipeliner, items []DoneItem) func() []error {
	errs := make([]error, len(items))
	type slotCall struct {
		idx  []int
		cs   []*call
		cmd  *redis.Cmd
		keys []string
		argv []any
	}
	bySlot := map[int]*slotCall{}
	var order []*slotCall
	for i, it := range items {
		if err := l.doneItemValid(it); err != nil {
			errs[i] = err
			continue
		}
		o := doneOp{state: l.StateKey(it.Group, it.ID), attempt: it.Attempt, ttl: it.TTL}
		slot := 0
		if l.batch.cluster {
			slot = slotOf(it.Group)
		}
		sc := bySlot[slot]
		if sc == nil {
			sc = &slotCall{}
			bySlot[slot] = sc
			order = append(order, sc)
		}
		sc.idx = append(sc.idx, i)
		sc.cs = append(sc.cs, &call{op: o.build(), nowA: l.nowArg()})
	}
	mode := l.batch.mode.Load()
	for _, sc := range order {
		sc.keys, sc.argv = encode(sc.cs)
		sc.cmd = queue(ctx, p, sc.keys, sc.argv, mode)
	}
	return func() []error {
		for _, sc := range order {
			res, err := sc.cmd.Result()
			if err != nil && notLoaded(err) {
				res, err = l.batch.call(ctx, l.batch.client, sc.keys, sc.argv)
			}
			complete(sc.cs, res, err)
			for j, c := range sc.cs {
				if c.err != nil {
					errs[sc.idx[j]] = fmt.Errorf("throttle: mark done: %w", c.err)
				}
			}
		}
		return errs
	}
}

// doneItemValid checks a done record's arguments, as MarkDone does.
func (l *Limiter) doneItemValid(it DoneItem) error {
	if err := checkMember(it.ID); err != nil {
		return err
	}
	if err := checkGroup(it.Group); err != nil {
		return err
	}
	if it.TTL < time.Millisecond || it.Attempt < 1 {
		return fmt.Errorf("%w: done ttl %v must be at least 1ms and attempt %d at least 1", ErrInvalidRule, it.TTL, it.Attempt)
	}
	return nil
}
