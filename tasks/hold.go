package tasks

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// BatchHold is how far ahead a batch's notifications are scheduled while
// the batch is built. Release makes them due at once; if it cannot (Redis
// went away after the last one was in), Asynq makes them due when the hold
// ends: the batch is late, never partial.
const BatchHold = 5 * time.Minute

// Batch enqueues notifications all or nothing, even with workers running:
// each one is enqueued scheduled BatchHold ahead, so no worker can take it
// while the rest are still being enqueued; Release then moves them all
// into their tenants' waiting rooms (Room; in the order added, one script
// per queue, the scripts in one round trip), and Abort deletes them
// instead. A Batch is not safe for concurrent use.
type Batch struct {
	c    *asynq.Client
	rdb  redis.UniversalClient
	insp *asynq.Inspector
	keys *Keyring
	p    *Producer
	held []heldTask
}

type heldTask struct {
	queue, tenant, id string
	adopted           bool // enqueued by an earlier attempt: released, never deleted
}

// NewBatch returns an empty batch that enqueues through c and releases
// through rdb (the Redis c uses), sealing with keys (nil: not sealed).
func NewBatch(c *asynq.Client, rdb redis.UniversalClient, keys *Keyring) *Batch {
	return &Batch{c: c, rdb: rdb, insp: asynq.NewInspectorFromRedisClient(rdb), keys: keys, p: NewProducer(rdb, keys)}
}

// Add validates, seals and enqueues n into queue, held. Errors are
// Enqueue's (ErrDuplicate for an id already enqueued: see Adopt).
func (b *Batch) Add(ctx context.Context, n Notification, queue string, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	if n.ID == "" {
		n.ID = NewID()
	}
	opts = append(opts, asynq.Queue(queue), asynq.ProcessIn(BatchHold))
	info, err := Enqueue(ctx, b.c, b.keys, n, opts...)
	if err != nil {
		return nil, err
	}
	b.held = append(b.held, heldTask{queue: queue, tenant: n.Tenant, id: n.ID})
	return info, nil
}

// AddMany validates, seals and enqueues items held, one script per queue
// in one round trip (Producer.EnqueueHeld); each Result says what became
// of its item (ErrDuplicate for an id already enqueued: see Adopt). The
// error is Redis trouble: the items whose Result has an Info are held and
// in the batch all the same (Abort deletes them).
func (b *Batch) AddMany(ctx context.Context, items []Item) ([]Result, error) {
	for i := range items {
		if items[i].N.ID == "" {
			items[i].N.ID = NewID()
		}
	}
	res, err := b.p.EnqueueHeld(ctx, items, time.Now().Add(BatchHold))
	for i, r := range res {
		if r.Info != nil {
			b.held = append(b.held, heldTask{queue: r.Info.Queue, tenant: items[i].N.Tenant, id: r.Info.ID})
		}
	}
	return res, err
}

// Adopt adds a task of tenant already enqueued (by an earlier attempt of
// the same batch) to the batch: Release moves it into the room if it is
// still held, and leaves it alone otherwise; Abort never deletes it.
func (b *Batch) Adopt(queue, tenant, id string) {
	b.held = append(b.held, heldTask{queue: queue, tenant: tenant, id: id, adopted: true})
}

// Fresh returns the ids the batch enqueued itself (not adopted): what an
// Abort deletes.
func (b *Batch) Fresh() []string {
	var ids []string
	for _, h := range b.held {
		if !h.adopted {
			ids = append(ids, h.id)
		}
	}
	return ids
}

// Len is how many tasks the batch holds.
func (b *Batch) Len() int { return len(b.held) }

// Release moves every task of the batch into its tenant's waiting room,
// where the workers dispatch it. Tasks no longer held (released already,
// adopted tasks already due) are left alone. On an error some queues may
// be released and others still held: those come due when BatchHold ends
// (straight into their queues' pending lists), so every notification still
// goes.
func (b *Batch) Release(ctx context.Context) error {
	var order []string
	byQueue := map[string][]heldTask{}
	for _, h := range b.held {
		if _, ok := byQueue[h.queue]; !ok {
			order = append(order, h.queue)
		}
		byQueue[h.queue] = append(byQueue[h.queue], h)
	}
	var calls []*roomCall
	for _, q := range order {
		for all := byQueue[q]; len(all) > 0; {
			part := all[:min(len(all), MaxRoomBatch)]
			all = all[len(part):]
			c := newRoomCall(q, "")
			for _, h := range part {
				c.add(h.id, h.tenant, "")
			}
			calls = append(calls, c)
		}
	}
	runRoomCalls(ctx, b.rdb, calls)
	var errs []error
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil {
			errs = append(errs, fmt.Errorf("tasks: release batch in %s: %w", c.queue, err))
		}
	}
	b.held = nil
	return errors.Join(errs...)
}

// Abort deletes every task the batch enqueued (adopted ones are kept).
// No worker can have taken one: they are held. It returns the tasks it
// could not delete, to try again (AbortTasks) before BatchHold ends.
func (b *Batch) Abort() ([]HeldTask, error) {
	var left []HeldTask
	var errs []error
	for _, h := range b.held {
		if h.adopted {
			continue
		}
		if err := b.insp.DeleteTask(h.queue, h.id); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
			left = append(left, HeldTask{Queue: h.queue, ID: h.id})
			errs = append(errs, err)
		}
	}
	b.held = nil
	if len(errs) > 0 {
		return left, fmt.Errorf("tasks: abort batch: %d of its tasks not deleted: %w", len(left), errors.Join(errs...))
	}
	return nil, nil
}

// HeldTask names a task a batch holds.
type HeldTask struct{ Queue, ID string }

// AbortTasks deletes held tasks an Abort could not; it returns those it
// still could not delete.
func AbortTasks(insp *asynq.Inspector, ts []HeldTask) ([]HeldTask, error) {
	var left []HeldTask
	var errs []error
	for _, t := range ts {
		if err := insp.DeleteTask(t.Queue, t.ID); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
			left = append(left, t)
			errs = append(errs, err)
		}
	}
	return left, errors.Join(errs...)
}
