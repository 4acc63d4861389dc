package tasks

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
// while the rest are still being enqueued; Release then moves them all to
// their queues' pending lists (in the order added, one script per queue),
// and Abort deletes them instead. A Batch is not safe for concurrent use.
//
// Release does in one script per queue what Asynq's forwarder does when a
// scheduled task comes due (ZREM from scheduled, LPUSH to pending, state
// and pending_since set); TestBatchReleaseIsAsynqsForward pins that to the
// Asynq version in go.mod.
type Batch struct {
	c    *asynq.Client
	rdb  redis.UniversalClient
	insp *asynq.Inspector
	keys *Keyring
	held []heldTask
}

type heldTask struct {
	queue, id string
	adopted   bool // enqueued by an earlier attempt: released, never deleted
}

// NewBatch returns an empty batch that enqueues through c and releases
// through rdb (the Redis c uses), sealing with keys (nil: not sealed).
func NewBatch(c *asynq.Client, rdb redis.UniversalClient, keys *Keyring) *Batch {
	return &Batch{c: c, rdb: rdb, insp: asynq.NewInspectorFromRedisClient(rdb), keys: keys}
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
	b.held = append(b.held, heldTask{queue: queue, id: n.ID})
	return info, nil
}

// Adopt adds a task already enqueued (by an earlier attempt of the same
// batch) to the batch: Release makes it due if it is still held, and
// leaves it alone otherwise; Abort never deletes it.
func (b *Batch) Adopt(queue, id string) {
	b.held = append(b.held, heldTask{queue: queue, id: id, adopted: true})
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

// releaseHeld moves the held ids of one queue to its pending list, in
// order, as Asynq's forwarder moves a due scheduled task; ids no longer
// in the scheduled set (released already, adopted tasks already due) are
// left alone. It returns how many it moved.
//
// KEYS[1] asynq:{q}:scheduled  KEYS[2] asynq:{q}:pending
// ARGV[1] asynq:{q}:t:         ARGV[2] now, Unix ns (pending_since)
// ARGV[3..] task ids
var releaseHeld = redis.NewScript(`
local moved = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[1], id) == 1 then
    redis.call('LPUSH', KEYS[2], id)
    redis.call('HSET', ARGV[1] .. id, 'state', 'pending', 'pending_since', ARGV[2])
    moved = moved + 1
  end
end
return moved
`)

// Release makes every task of the batch due now. On an error some queues
// may be released and others still held: those come due when BatchHold
// ends, so every notification still goes.
func (b *Batch) Release(ctx context.Context) error {
	var order []string
	ids := map[string][]any{}
	for _, h := range b.held {
		q := h.queue
		if _, ok := ids[q]; !ok {
			order = append(order, q)
		}
		ids[q] = append(ids[q], h.id)
	}
	now := strconv.FormatInt(time.Now().UnixNano(), 10)
	var errs []error
	for _, q := range order {
		p := "asynq:{" + q + "}:"
		argv := append([]any{p + "t:", now}, ids[q]...)
		if err := releaseHeld.Run(ctx, b.rdb, []string{p + "scheduled", p + "pending"}, argv...).Err(); err != nil {
			errs = append(errs, fmt.Errorf("tasks: release batch in %s: %w", q, err))
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
