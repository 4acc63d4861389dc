package keyspace

import "strings"

// asynqPrefix starts every key of Asynq's (and Sluice's beside them).
const asynqPrefix = "asynq:"

// AsynqQueues is Asynq's set of the queues' names (what its inspector lists).
const AsynqQueues = asynqPrefix + "queues"

// Queue names the keys of one Asynq queue, "asynq:{<queue>}:…": those
// Sluice names itself for its scripts and reads (asynq v0.26's private
// layout, which Asynq builds too), and Sluice's own fair and fair:clock.
// They share the queue's hash tag, so they live in one Cluster slot.
type Queue struct{ p string }

// AsynqQueue returns queue's keys.
func AsynqQueue(queue string) Queue { return Queue{asynqPrefix + "{" + queue + "}:"} }

// QueuesStartingWith is the prefix every key of every queue whose name
// starts with base has ("asynq:{<base>"): a layout's queues. It may match
// other queues whose names start the same.
func QueuesStartingWith(base string) string { return asynqPrefix + "{" + base }

// QueueOf parses a key of a Queue: its queue and what follows "}:".
func QueueOf(key string) (queue, rest string, ok bool) {
	r, ok := strings.CutPrefix(key, asynqPrefix+"{")
	if !ok {
		return "", "", false
	}
	queue, rest, ok = strings.Cut(r, "}:")
	return queue, rest, ok && queue != ""
}

// Pending is Asynq's list of tasks ready to run.
func (q Queue) Pending() string { return q.p + "pending" }

// Active is Asynq's list of running tasks.
func (q Queue) Active() string { return q.p + "active" }

// Lease is Asynq's sorted set of the running tasks' leases.
func (q Queue) Lease() string { return q.p + "lease" }

// Paused is set while the queue is paused.
func (q Queue) Paused() string { return q.p + "paused" }

// Scheduled is Asynq's sorted set of tasks due later.
func (q Queue) Scheduled() string { return q.p + "scheduled" }

// Retry is Asynq's sorted set of tasks to retry.
func (q Queue) Retry() string { return q.p + "retry" }

// Archived is Asynq's sorted set of archived tasks.
func (q Queue) Archived() string { return q.p + "archived" }

// Completed is Asynq's sorted set of completed tasks kept for a while.
func (q Queue) Completed() string { return q.p + "completed" }

// Processed is Asynq's counter of processed tasks.
func (q Queue) Processed() string { return q.p + "processed" }

// IsProcessedOn reports whether key is Asynq's counter of one day's
// processed tasks of q ("…:processed:<yyyy-mm-dd>").
func (q Queue) IsProcessedOn(key string) bool {
	day, ok := strings.CutPrefix(key, q.Processed()+":")
	return ok && day != ""
}

// AggregationSets is Asynq's sorted set of a queue's aggregation sets.
func (q Queue) AggregationSets() string { return q.p + "aggregation_sets" }

// Groups is the set of tenants with a group (a waiting room).
func (q Queue) Groups() string { return q.p + "groups" }

// Fair is Sluice's sorted set of the tenants waiting, by the virtual
// start of their next dispatch.
func (q Queue) Fair() string { return q.p + "fair" }

// FairClock is Sluice's virtual time of the queue's last dispatch.
func (q Queue) FairClock() string { return q.p + "fair:clock" }

// TaskPrefix starts the key of every task's hash.
func (q Queue) TaskPrefix() string { return q.p + "t:" }

// Task is the key of a task's hash.
func (q Queue) Task(id string) string { return q.p + "t:" + id }

// GroupPrefix starts the key of every tenant's group.
func (q Queue) GroupPrefix() string { return q.p + "g:" }

// Group is the key of tenant's group (its waiting room).
func (q Queue) Group(tenant string) string { return q.p + "g:" + tenant }
