package tasks

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
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
	return p.enqueueMany(ctx, items, "")
}

// EnqueueAll enqueues items into their tenants' waiting rooms all or
// none, in one script, when they fit one — one queue, at most MaxRoomBatch
// items — and every one is valid and not enqueued yet: then true, and
// each Result has its Info. Otherwise it enqueues nothing and returns
// false; EnqueueMany or a Batch then says which item is the trouble. With
// no hold to release, it costs what EnqueueMany costs. The error is Redis
// trouble: the items are then either all enqueued or none (which, a reply
// lost with its connection does not say).
func (p *Producer) EnqueueAll(ctx context.Context, items []Item) ([]Result, bool, error) {
	if len(items) == 0 || len(items) > MaxRoomBatch {
		return nil, false, nil
	}
	var c *roomCall
	res := make([]Result, len(items))
	for i, it := range items {
		pr, err := prepare(ctx, it.N, p.keys, it.Opts)
		var m asynqMessage
		if err == nil {
			m, err = messageOf(pr)
		}
		if err != nil || (c != nil && m.queue != c.queue) {
			return nil, false, nil
		}
		if c == nil {
			c = newRoomCall(m.queue, "all")
		}
		m.group = pr.n.Tenant
		c.add(m.id, pr.n.Tenant, string(m.encode()))
		res[i].Info = m.info(pr.n.Tenant)
	}
	if err := p.publish(ctx, []string{c.queue}); err != nil {
		return nil, false, err
	}
	runRoomCalls(ctx, p.rdb, []*roomCall{c})
	added, err := c.cmd.Int64Slice()
	if err != nil {
		return nil, false, fmt.Errorf("tasks: enqueue: %w", err)
	}
	if len(added) != len(items) {
		return nil, false, nil // one was enqueued already: none is
	}
	return res, true, nil
}

// EnqueueHeld is EnqueueMany with the items held — scheduled until
// until, where no worker takes them — instead of in their rooms: what a
// Batch does before its Release moves them in.
func (p *Producer) EnqueueHeld(ctx context.Context, items []Item, until time.Time) ([]Result, error) {
	return p.enqueueMany(ctx, items, strconv.FormatInt(until.Unix(), 10))
}

func (p *Producer) enqueueMany(ctx context.Context, items []Item, held string) ([]Result, error) {
	return p.Send(ctx, p.prepareItems(ctx, items, held))
}

// Prepared is items made ready for one EnqueueMany round trip: validated,
// sealed and encoded into their queues' scripts (Prepare). A producer that
// enqueues batch after batch prepares the next while Redis runs the last.
type Prepared struct {
	res   []Result
	held  string
	order []string // queues, in order of first item
	calls []*roomCall
	parts [][]preparedEntry // each call's items
}

type preparedEntry struct {
	i      int
	tenant string
	m      asynqMessage
}

// Prepare does EnqueueMany's work on items that needs no Redis. Send
// enqueues them: Send(ctx, Prepare(ctx, items)) is EnqueueMany(ctx, items).
func (p *Producer) Prepare(ctx context.Context, items []Item) *Prepared {
	return p.prepareItems(ctx, items, "")
}

func (p *Producer) prepareItems(ctx context.Context, items []Item, held string) *Prepared {
	b := &Prepared{res: make([]Result, len(items)), held: held}
	byQueue := map[string][]preparedEntry{}
	for i, it := range items {
		pr, err := prepare(ctx, it.N, p.keys, it.Opts)
		var m asynqMessage
		if err == nil {
			m, err = messageOf(pr)
		}
		if err != nil {
			b.res[i].Err = err
			continue
		}
		m.group = pr.n.Tenant
		if _, ok := byQueue[m.queue]; !ok {
			b.order = append(b.order, m.queue)
		}
		byQueue[m.queue] = append(byQueue[m.queue], preparedEntry{i, pr.n.Tenant, m})
	}
	for _, q := range b.order {
		for all := byQueue[q]; len(all) > 0; {
			part := all[:min(len(all), MaxRoomBatch)]
			all = all[len(part):]
			c := newRoomCall(q, held)
			for _, e := range part {
				c.add(e.m.id, e.tenant, string(e.m.encode()))
			}
			b.calls, b.parts = append(b.calls, c), append(b.parts, part)
		}
	}
	return b
}

// Send enqueues prepared items in one round trip and says what became of
// each, as EnqueueMany does. A Prepared is sent once.
func (p *Producer) Send(ctx context.Context, b *Prepared) ([]Result, error) {
	if err := p.publish(ctx, b.order); err != nil {
		return nil, err
	}
	runRoomCalls(ctx, p.rdb, b.calls)
	res := b.res
	var redisErr error
	for k, c := range b.calls {
		added, err := c.cmd.Int64Slice()
		for j, e := range b.parts[k] {
			switch {
			case err != nil:
				res[e.i].Err = fmt.Errorf("tasks: enqueue %s: %w", e.m.id, err)
				redisErr = err
			case j >= len(added) || added[j] != 1:
				res[e.i].Err = fmt.Errorf("%w: %s", ErrDuplicate, e.m.id)
			default:
				res[e.i].Info = e.m.info(e.tenant)
				if b.held != "" {
					res[e.i].Info.State, res[e.i].Info.Group = asynq.TaskStateScheduled, ""
				}
			}
		}
	}
	if redisErr != nil {
		return res, fmt.Errorf("tasks: enqueue: %w", redisErr)
	}
	return res, nil
}

// roomCall is one run of fair_enqueue.lua: some notifications of one queue.
type roomCall struct {
	queue string
	room  Room
	keys  []string
	args  []any
	cmd   *redis.Cmd
}

// newRoomCall starts a call for queue's rooms; held is "" or the Unix
// second to hold new notifications until (scripts/fair_enqueue.lua).
func newRoomCall(queue, held string) *roomCall {
	r := RoomOf(queue)
	return &roomCall{queue: queue, room: r, keys: []string{r.Groups, r.Fair, r.Clock, r.Scheduled}, args: []any{0, held}}
}

// add appends a notification: its message, or "" for a held one to move in.
func (c *roomCall) add(id, tenant, msg string) {
	c.keys = append(c.keys, c.room.Task(id), c.room.Group(tenant))
	c.args = append(c.args, id, tenant, msg)
	c.args[0] = c.args[0].(int) + 1
}

// runRoomCalls sends calls in one pipeline, and once more in full (EVAL)
// those whose script Redis did not have (a restarted server, a new node).
// Each call's result is in its cmd.
func runRoomCalls(ctx context.Context, rdb redis.UniversalClient, calls []*roomCall) {
	_, _ = rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for _, c := range calls {
			c.cmd = scripts.FairEnqueue.EvalSha(ctx, pipe, c.keys, c.args...)
		}
		return nil
	})
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			c.cmd = scripts.FairEnqueue.Eval(ctx, rdb, c.keys, c.args...)
		}
	}
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
	if err := p.rdb.SAdd(ctx, keyspace.AsynqQueues, fresh...).Err(); err != nil {
		return fmt.Errorf("tasks: enqueue: %w", err)
	}
	for _, q := range fresh {
		p.published.Store(q, true)
	}
	return nil
}
