package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/tasks"
)

// Queue depths and latency, read from Redis at each scrape.
//
// Asynq keeps a queue q in keys of its own (asynq v0.26) — the tenants'
// waiting rooms (tasks.Room: a group per tenant, read by one script per
// queue, tasks.ReadWaiting), the list
// asynq:{q}:pending (enqueued on the left, dequeued from the right), the list
// asynq:{q}:active, the sorted sets asynq:{q}:scheduled, :retry (Sluice's
// throttled tasks wait there for their slot) and :archived, and a hash per
// task asynq:{q}:t:<id> whose pending_since (Unix ns) is when the task last
// became pending — enqueued, or moved in from scheduled/retry when due. So
// the age of the oldest pending task is queueing delay only, never the wait
// for a slot. One pipeline of 6 reads per queue and one HGET per non-empty
// queue per scrape; with a Redis Cluster go-redis splits it by node.
//
// Every worker reports the same figures (they are Redis's): aggregate with
// max by (queue), not sum.

var (
	queueTasksDesc = prometheus.NewDesc("sluice_queue_tasks",
		"Tasks in each Asynq queue the workers serve, by state: waiting (in their tenants' waiting rooms, dispatched fairly between tenants), pending (dispatched, waiting for a worker), active, scheduled, retry (throttled tasks waiting for their slot, and failed sends waiting for their retry) and archived. Read from Redis at each scrape: every worker reports the same values.",
		[]string{"queue", "lane", "state"}, nil)
	queueLatencyDesc = prometheus.NewDesc("sluice_queue_latency_seconds",
		"Age of the oldest task of each queue waiting for a worker (since it was enqueued, into a waiting room or the pending list, or became due), 0 when none waits: how long work waits for a worker, never the wait for a quota slot.",
		[]string{"queue", "lane"}, nil)
)

// queueStates are the states sluice_queue_tasks reports, in the order they
// are read.
var queueStates = []string{"pending", "active", "scheduled", "retry", "archived", "waiting"}

type queueCollector struct {
	rdb     redis.UniversalClient
	layout  tasks.Layout
	log     *slog.Logger
	timeout time.Duration
}

func newQueueCollector(rdb redis.UniversalClient, layout tasks.Layout, log *slog.Logger) *queueCollector {
	return &queueCollector{rdb: rdb, layout: layout, log: log, timeout: time.Second}
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- queueTasksDesc
	ch <- queueLatencyDesc
}

// Collect reports nothing for the queues when Redis does not answer, so
// the rest of /metrics (sluice_limiter_errors_total above all) still
// reaches Prometheus.
func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	queues := c.layout.Queues()
	type reads struct {
		counts  [5]*redis.IntCmd
		oldest  *redis.StringCmd
		waiting tasks.Waiting
	}
	rs := make([]reads, len(queues))
	waiting := make([]*redis.Cmd, len(queues))
	_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, q := range queues {
			k := keyspace.AsynqQueue(q)
			rs[i].counts = [5]*redis.IntCmd{p.LLen(ctx, k.Pending()), p.LLen(ctx, k.Active()),
				p.ZCard(ctx, k.Scheduled()), p.ZCard(ctx, k.Retry()), p.ZCard(ctx, k.Archived())}
			rs[i].oldest = p.LIndex(ctx, k.Pending(), -1)
			waiting[i] = tasks.WaitingCmd(ctx, p, q)
		}
		return nil
	})
	var cmds []redis.Cmder
	for _, r := range rs {
		cmds = append(cmds, r.oldest, r.counts[0], r.counts[1], r.counts[2], r.counts[3], r.counts[4])
	}
	if !c.answered(cmds) {
		return
	}
	for i, q := range queues {
		w, err := tasks.ParseWaiting(waiting[i])
		if err != nil && redis.HasErrorPrefix(waiting[i].Err(), "NOSCRIPT") {
			w, err = tasks.ReadWaiting(ctx, c.rdb, q) // the script, sent in full once
		}
		if err != nil {
			c.log.Debug("queue metrics: Redis did not answer; not reporting them this scrape", "err", err)
			return
		}
		rs[i].waiting = w
	}
	since := make([]*redis.StringCmd, len(queues))
	cmds = cmds[:0]
	_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, q := range queues {
			if id, err := rs[i].oldest.Result(); err == nil {
				since[i] = p.HGet(ctx, keyspace.AsynqQueue(q).Task(id), "pending_since")
				cmds = append(cmds, since[i])
			}
		}
		return nil
	})
	if !c.answered(cmds) {
		return
	}
	now := time.Now()
	for i, q := range queues {
		lane := "legacy"
		if l, _, ok := c.layout.Parse(q); ok {
			lane = string(l)
		}
		for j, state := range queueStates[:5] {
			ch <- prometheus.MustNewConstMetric(queueTasksDesc, prometheus.GaugeValue, float64(rs[i].counts[j].Val()), q, lane, state)
		}
		ch <- prometheus.MustNewConstMetric(queueTasksDesc, prometheus.GaugeValue, float64(rs[i].waiting.Count), q, lane, "waiting")
		age := 0.0
		if since[i] != nil {
			if ns, err := strconv.ParseInt(since[i].Val(), 10, 64); err == nil && ns > 0 {
				age = max(0, now.Sub(time.Unix(0, ns)).Seconds())
			}
		}
		if o := rs[i].waiting.Oldest; !o.IsZero() {
			age = max(age, now.Sub(o).Seconds())
		}
		ch <- prometheus.MustNewConstMetric(queueLatencyDesc, prometheus.GaugeValue, age, q, lane)
	}
}

// answered reports whether Redis answered every command (a missing key or
// field, redis.Nil, is an answer).
func (c *queueCollector) answered(cmds []redis.Cmder) bool {
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
			c.log.Debug("queue metrics: Redis did not answer; not reporting them this scrape", "err", err)
			return false
		}
	}
	return true
}

// Depth is the work waiting for a worker, as KEDA's metrics-api trigger
// reads it from GET /queue-depth: every task in a tenant's waiting room or
// a pending list, over every queue the workers serve, and of the priority
// lane alone. Tasks waiting for a quota slot (scheduled, retry) are not
// counted: more workers do not make slots come sooner.
type Depth struct {
	Waiting  int64 `json:"waiting"`
	Priority int64 `json:"priority"`
}

// depth reads Depth from Redis: one pipeline of two reads per queue.
func (c *queueCollector) depth(ctx context.Context) (Depth, error) {
	queues := c.layout.Queues()
	pending := make([]*redis.IntCmd, len(queues))
	waiting := make([]*redis.Cmd, len(queues))
	_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, q := range queues {
			pending[i] = p.LLen(ctx, tasks.RoomOf(q).Pending)
			waiting[i] = tasks.WaitingCmd(ctx, p, q)
		}
		return nil
	})
	var d Depth
	for i, q := range queues {
		n, err := pending[i].Result()
		if err != nil {
			return Depth{}, fmt.Errorf("queue depth: %w", err)
		}
		w, err := tasks.ParseWaiting(waiting[i])
		if err != nil && redis.HasErrorPrefix(waiting[i].Err(), "NOSCRIPT") {
			w, err = tasks.ReadWaiting(ctx, c.rdb, q)
		}
		if err != nil {
			return Depth{}, fmt.Errorf("queue depth: %w", err)
		}
		d.Waiting += n + w.Count
		if lane, _, ok := c.layout.Parse(q); ok && lane == tasks.LanePriority {
			d.Priority += n + w.Count
		}
	}
	return d, nil
}
