package tasks

import (
	"context"
	"fmt"
	"sync"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/scripts"
)

// Producer enqueues notifications into their tenants' waiting rooms
// (Room) through a Redis client: the workers dispatch each lane's waiting
// notifications fairly between tenants, so each tenant waits only for its
// own backlog, and a tenant's notifications keep their enqueue order to
// the microsecond. It is what Sluice's own producers (the API, `sluice
// enqueue`) use. Enqueue with an asynq.Client puts a notification in its
// tenant's room too, through Asynq's own group (its order kept to the
// second, then by id, which NewID makes increase). Safe for concurrent use.
type Producer struct {
	rdb       redis.UniversalClient
	keys      *Keyring
	published sync.Map // queues already in Asynq's set of queues
}

// NewProducer returns a producer that enqueues through rdb, sealing with
// keys (nil: not sealed, which workers accept only when configured to).
func NewProducer(rdb redis.UniversalClient, keys *Keyring) *Producer {
	return &Producer{rdb: rdb, keys: keys}
}

// Item is one notification of EnqueueMany, with its options (as Enqueue's).
type Item struct {
	N    Notification
	Opts []asynq.Option
}

// Result is what became of one Item: its task info, or why it was not
// enqueued (ErrInvalid, ErrDuplicate).
type Result struct {
	Info *asynq.TaskInfo
	Err  error
}

// Enqueue validates, seals and enqueues n into its tenant's waiting room
// in the queue its options name (asynq.Queue; by default its lane's shard
// of DefaultLayout, as NewTask routes). An id still enqueued gives
// ErrDuplicate; a bad notification ErrInvalid. The span context of ctx,
// if any, travels with the task. Options other than asynq.Queue,
// MaxRetry, Timeout, Deadline, Retention and TaskID are refused.
func (p *Producer) Enqueue(ctx context.Context, n Notification, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	res, err := p.EnqueueMany(ctx, []Item{{N: n, Opts: opts}})
	if err != nil {
		return nil, err
	}
	return res[0].Info, res[0].Err
}

// MaxRoomBatch is the most notifications one script adds to one queue's
// rooms; EnqueueMany splits larger groups.
const MaxRoomBatch = 500

// EnqueueMany enqueues items into their tenants' waiting rooms, one script
// per queue (and per MaxRoomBatch items), all the scripts in one round
// trip. Each item's Result says what became of it; an invalid or duplicate
// item leaves the others enqueued. The error is Redis trouble: then some
// queues' items may be enqueued and others not (each Result says).
func (p *Producer) EnqueueMany(ctx context.Context, items []Item) ([]Result, error) {
	res := make([]Result, len(items))
	type entry struct {
		i      int
		tenant string
		m      asynqMessage
	}
	byQueue := map[string][]entry{}
	var order []string
	for i, it := range items {
		pr, err := prepare(ctx, it.N, p.keys, it.Opts)
		var m asynqMessage
		if err == nil {
			m, err = messageOf(pr)
		}
		if err != nil {
			res[i].Err = err
			continue
		}
		m.group = pr.n.Tenant
		if _, ok := byQueue[m.queue]; !ok {
			order = append(order, m.queue)
		}
		byQueue[m.queue] = append(byQueue[m.queue], entry{i, pr.n.Tenant, m})
	}
	if err := p.publish(ctx, order); err != nil {
		return nil, err
	}
	type call struct {
		cmd     *redis.Cmd
		keys    []string
		args    []any
		entries []entry
	}
	var calls []call
	_, _ = p.rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, q := range order {
			room := RoomOf(q)
			all := byQueue[q]
			for len(all) > 0 {
				part := all[:min(len(all), MaxRoomBatch)]
				all = all[len(part):]
				keys := []string{room.Groups, room.Fair, room.Clock, room.Scheduled}
				args := []any{len(part)}
				for _, e := range part {
					keys = append(keys, room.Task(e.m.id), room.Group(e.tenant))
					args = append(args, e.m.id, e.tenant, e.m.encode())
				}
				calls = append(calls, call{scripts.FairEnqueue.EvalSha(ctx, pipe, keys, args...), keys, args, part})
			}
		}
		return nil
	})
	var redisErr error
	for _, c := range calls {
		added, err := c.cmd.Int64Slice()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			// The script is not loaded there (a restarted Redis, a new
			// node): run it once more, sending its text.
			added, err = scripts.FairEnqueue.Eval(ctx, p.rdb, c.keys, c.args...).Int64Slice()
		}
		for j, e := range c.entries {
			switch {
			case err != nil:
				res[e.i].Err = fmt.Errorf("tasks: enqueue %s: %w", e.m.id, err)
				redisErr = err
			case j >= len(added) || added[j] != 1:
				res[e.i].Err = fmt.Errorf("%w: %s", ErrDuplicate, e.m.id)
			default:
				res[e.i].Info = e.m.info(e.tenant)
			}
		}
	}
	if redisErr != nil {
		return res, fmt.Errorf("tasks: enqueue: %w", redisErr)
	}
	return res, nil
}

// publish adds queues to Asynq's set of queues (asynq:queues, which
// asynqmon and the inspector list), once per producer, as asynq.Client
// does.
func (p *Producer) publish(ctx context.Context, queues []string) error {
	var fresh []any
	for _, q := range queues {
		if _, ok := p.published.Load(q); !ok {
			fresh = append(fresh, q)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	if err := p.rdb.SAdd(ctx, "asynq:queues", fresh...).Err(); err != nil {
		return fmt.Errorf("tasks: enqueue: %w", err)
	}
	for _, q := range fresh {
		p.published.Store(q, true)
	}
	return nil
}
