package tasks

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/scripts"
)

// Room names the Redis keys of one queue's waiting rooms: where each
// tenant's notifications wait, in enqueue order, until the workers
// dispatch them fairly into the queue's pending list (start-time fair
// queuing over the tenants with work waiting: docs/queues.md). A waiting
// notification is an Asynq task in its tenant's group — Asynq's
// "aggregating" state, which no Sluice worker hands to an aggregator and
// which asynqmon lists under the queue's groups — so Asynq's inspector
// reads, deletes and runs it as any other task, and its id stays taken
// while it waits.
type Room struct {
	Queue string
	// Pending is Asynq's pending list; Groups the set of tenants with a
	// group; Fair the sorted set of tenants waiting, by the virtual start
	// of their next dispatch; Clock the virtual time of the last dispatch.
	Pending, Groups, Fair, Clock string
	// TaskPrefix and GroupPrefix start a task's hash and a tenant's group.
	TaskPrefix, GroupPrefix string
	// Scheduled is Asynq's scheduled set (where a held batch waits).
	Scheduled string
}

// RoomOf returns the keys of queue's waiting rooms. They share the
// queue's Redis Cluster hash tag ({queue}), like every Asynq key of it.
func RoomOf(queue string) Room {
	q := keyspace.AsynqQueue(queue)
	return Room{Queue: queue, Pending: q.Pending(), Groups: q.Groups(), Fair: q.Fair(), Clock: q.FairClock(),
		TaskPrefix: q.TaskPrefix(), GroupPrefix: q.GroupPrefix(), Scheduled: q.Scheduled()}
}

// Group is the key of tenant's group (its waiting room) in the queue.
func (r Room) Group(tenant string) string { return keyspace.AsynqQueue(r.Queue).Group(tenant) }

// Task is the key of a task's hash in the queue.
func (r Room) Task(id string) string { return keyspace.AsynqQueue(r.Queue).Task(id) }

// asynqMessage is what Asynq keeps of a task (its TaskMessage, asynq
// v0.26), as asynq.Client fills it for Sluice's options.
type asynqMessage struct {
	typ       string
	payload   []byte
	headers   map[string]string
	id, queue string
	group     string // the tenant: Asynq's inspector shows it as the task's group
	retry     int
	timeout   time.Duration
	deadline  time.Time
	retention time.Duration
}

// messageOf fills the message of a prepared notification from its
// options, as asynq.Client.Enqueue composes them: the last of each kind
// wins; no deadline and no timeout means Asynq's default timeout of 30
// minutes.
func messageOf(p prepared) (asynqMessage, error) {
	m := asynqMessage{typ: p.typ, payload: p.payload, headers: p.headers}
	for _, o := range p.opts {
		switch o.Type() {
		case asynq.QueueOpt:
			m.queue = o.Value().(string)
		case asynq.MaxRetryOpt:
			m.retry = o.Value().(int)
		case asynq.TaskIDOpt:
			m.id = o.Value().(string)
		case asynq.TimeoutOpt:
			m.timeout = o.Value().(time.Duration)
		case asynq.DeadlineOpt:
			m.deadline = o.Value().(time.Time)
		case asynq.RetentionOpt:
			m.retention = o.Value().(time.Duration)
		case asynq.ProcessAtOpt, asynq.ProcessInOpt, asynq.UniqueOpt, asynq.GroupOpt:
			return m, invalid("options", "a waiting-room enqueue takes no ProcessAt, ProcessIn, Unique or Group (use Enqueue with an asynq.Client)")
		}
	}
	if m.deadline.IsZero() && m.timeout == 0 {
		m.timeout = 30 * time.Minute
	}
	return m, nil
}

// encode writes the message in Asynq's wire format: the protocol-buffer
// TaskMessage of asynq v0.26 (fields 1 type, 2 payload, 3 id, 4 queue,
// 5 retry, 8 timeout, 9 deadline, 12 retention, 14 group, 15 headers),
// as asynq.Client writes it for asynq.Group(tenant); zero values
// are left out, as proto3 does. TestAsynqReadsRoomMessages pins it to the
// Asynq version in go.mod by reading tasks back through its inspector.
func (m asynqMessage) encode() []byte {
	b := make([]byte, 0, len(m.payload)+len(m.typ)+len(m.id)+len(m.queue)+64)
	str := func(num protowire.Number, s string) {
		if s != "" {
			b = protowire.AppendTag(b, num, protowire.BytesType)
			b = protowire.AppendString(b, s)
		}
	}
	varint := func(num protowire.Number, v int64) {
		if v != 0 {
			b = protowire.AppendTag(b, num, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(v))
		}
	}
	str(1, m.typ)
	if len(m.payload) > 0 {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, m.payload)
	}
	str(3, m.id)
	str(4, m.queue)
	varint(5, int64(int32(m.retry)))
	varint(8, int64(m.timeout/time.Second))
	deadline := int64(0)
	if !m.deadline.IsZero() {
		deadline = m.deadline.Unix()
	}
	varint(9, deadline)
	varint(12, int64(m.retention/time.Second))
	str(14, m.group)
	for k, v := range m.headers {
		var e []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, k)
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, v)
		b = protowire.AppendTag(b, 15, protowire.BytesType)
		b = protowire.AppendBytes(b, e)
	}
	return b
}

// info is the asynq.TaskInfo of a message added to a waiting room.
func (m asynqMessage) info(tenant string) *asynq.TaskInfo {
	return &asynq.TaskInfo{ID: m.id, Queue: m.queue, Type: m.typ, Payload: m.payload, Headers: m.headers,
		State: asynq.TaskStateAggregating, MaxRetry: m.retry, Timeout: m.timeout, Deadline: m.deadline,
		Group: tenant, Retention: m.retention}
}

// Waiting is what waits in one queue's rooms.
type Waiting struct {
	Count int64
	// Oldest is when the longest-waiting notification was enqueued (zero
	// when none waits).
	Oldest time.Time
}

// ReadWaiting reads how many notifications wait in queue's rooms, and
// since when. It writes nothing.
func ReadWaiting(ctx context.Context, rdb redis.Scripter, queue string) (Waiting, error) {
	r := RoomOf(queue)
	return parseWaiting(scripts.FairWaiting.Run(ctx, rdb, []string{r.Groups}, r.GroupPrefix).Slice())
}

// WaitingCmd queues the read of ReadWaiting on a pipeline; ParseWaiting
// reads its reply.
func WaitingCmd(ctx context.Context, p redis.Pipeliner, queue string) *redis.Cmd {
	r := RoomOf(queue)
	return scripts.FairWaiting.EvalSha(ctx, p, []string{r.Groups}, r.GroupPrefix)
}

// ParseWaiting reads the reply of WaitingCmd.
func ParseWaiting(c *redis.Cmd) (Waiting, error) { return parseWaiting(c.Slice()) }

func parseWaiting(vals []any, err error) (Waiting, error) {
	if err != nil {
		return Waiting{}, fmt.Errorf("tasks: read waiting rooms: %w", err)
	}
	if len(vals) != 2 {
		return Waiting{}, errors.New("tasks: read waiting rooms: unexpected reply")
	}
	var w Waiting
	w.Count, _ = vals[0].(int64)
	if s, _ := vals[1].(string); s != "" {
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return Waiting{}, fmt.Errorf("tasks: read waiting rooms: %w", err)
		}
		sec, frac := math.Modf(f)
		w.Oldest = time.Unix(int64(sec), int64(frac*1e9))
	}
	return w, nil
}

// TenantWaiting counts tenant's notifications waiting in its rooms, by
// lane: in its shard of each lane under pins, and in its shard without
// them (notifications enqueued before a pin). It writes nothing.
func TenantWaiting(ctx context.Context, rdb redis.UniversalClient, l Layout, tenant string, pins Pins) (map[Lane]int64, error) {
	type read struct {
		lane Lane
		cmd  *redis.IntCmd
	}
	var reads []read
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, lane := range Lanes {
			q := l.Route(tenant, lane, pins)
			reads = append(reads, read{lane, p.ZCard(ctx, RoomOf(q).Group(tenant))})
			if other := l.Route(tenant, lane, nil); other != q {
				reads = append(reads, read{lane, p.ZCard(ctx, RoomOf(other).Group(tenant))})
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("tasks: read %s's waiting rooms: %w", tenant, err)
	}
	out := map[Lane]int64{}
	for _, r := range reads {
		out[r.lane] += r.cmd.Val()
	}
	return out, nil
}
