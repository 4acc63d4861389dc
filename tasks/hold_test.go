package tasks_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
)

const holdQueue = "hold-test"

func holdKey(s string) string { return "asynq:{" + holdQueue + "}:" + s }

func holdSMS(i int) tasks.Notification {
	n := tasks.NewSMS("acme", "+1415555010"+string(rune('0'+i)), "batch")
	n.ID = tasks.NewID()
	return n
}

// counting is an Asynq server on holdQueue that records the ids it ran.
type counting struct {
	mu  sync.Mutex
	ids []string
	ran chan string
}

// runServer runs it as a worker does: through the fair dispatch of the
// tenants' waiting rooms (internal/fairq).
func runServer(t *testing.T, rdb *redis.Client) *counting {
	t.Helper()
	c := &counting{ran: make(chan string, 64)}
	srv := asynq.NewServerFromRedisClient(fairClient(t, rdb, holdQueue), asynq.Config{Concurrency: 1, Queues: map[string]int{holdQueue: 1}, LogLevel: asynq.FatalLevel,
		TaskCheckInterval: 20 * time.Millisecond, DelayedTaskCheckInterval: 50 * time.Millisecond})
	if err := srv.Start(asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		c.mu.Lock()
		c.ids = append(c.ids, id)
		c.mu.Unlock()
		c.ran <- id
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return c
}

func (c *counting) wait(t *testing.T, id string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-c.ran:
			if got == id {
				return
			}
		case <-timeout:
			t.Fatalf("task %s never ran", id)
		}
	}
}

func (c *counting) seen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.ids)
}

// With a worker polling the queue, nothing of a batch runs while it is
// built; an aborted batch leaves nothing behind and never runs; a
// released one runs whole, in the order added.
func TestBatchAllOrNothingWithAWorker(t *testing.T) {
	_, rdb := redistest.New(t)
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(rdb)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	c := runServer(t, rdb)

	queueInfo := func() *asynq.QueueInfo {
		qi, err := insp.GetQueueInfo(holdQueue)
		if err != nil {
			t.Fatal(err)
		}
		return qi
	}
	// Aborted.
	b := tasks.NewBatch(client, rdb, nil)
	var aborted []string
	for i := range 3 {
		n := holdSMS(i)
		if _, err := b.Add(ctx, n, holdQueue); err != nil {
			t.Fatal(err)
		}
		aborted = append(aborted, n.ID)
	}
	if qi := queueInfo(); qi.Scheduled != 3 || qi.Pending+qi.Active != 0 {
		t.Fatalf("while the batch is built: %d scheduled, %d pending, %d active; want all 3 held", qi.Scheduled, qi.Pending, qi.Active)
	}
	if left, err := b.Abort(); err != nil || len(left) != 0 {
		t.Fatalf("Abort = %v, %v", left, err)
	}
	if qi := queueInfo(); qi.Size != 0 {
		t.Fatalf("after Abort the queue holds %d tasks, want none", qi.Size)
	}
	// A sentinel enqueued after the abort runs; nothing of the batch ran before it.
	sentinel := holdSMS(9)
	if _, err := tasks.Enqueue(ctx, client, nil, sentinel, asynq.Queue(holdQueue)); err != nil {
		t.Fatal(err)
	}
	c.wait(t, sentinel.ID)
	if got := c.seen(); !slices.Equal(got, []string{sentinel.ID}) {
		t.Fatalf("ran %v; want only the sentinel (aborted: %v)", got, aborted)
	}
	// Released: all of it, in order.
	b = tasks.NewBatch(client, rdb, nil)
	var released []string
	for i := range 5 {
		n := holdSMS(i)
		if _, err := b.Add(ctx, n, holdQueue); err != nil {
			t.Fatal(err)
		}
		released = append(released, n.ID)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	c.wait(t, released[len(released)-1])
	if got := c.seen()[1:]; !slices.Equal(got, released) {
		t.Fatalf("ran %v after the release, want %v in that order", got, released)
	}
}

// An id enqueued (held) by an earlier attempt is adopted: released with
// the batch, and never deleted by an Abort.
func TestBatchAdopt(t *testing.T) {
	_, rdb := redistest.New(t)
	ctx := context.Background()
	client := asynq.NewClientFromRedisClient(rdb)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	first := tasks.NewBatch(client, rdb, nil)
	n := holdSMS(1)
	if _, err := first.Add(ctx, n, holdQueue); err != nil {
		t.Fatal(err)
	}
	// The attempt ended without Release or Abort (its process died).
	retry := tasks.NewBatch(client, rdb, nil)
	if _, err := retry.Add(ctx, n, holdQueue); err == nil {
		t.Fatal("the same id enqueued twice")
	}
	retry.Adopt(holdQueue, n.Tenant, n.ID)
	if _, err := retry.Abort(); err != nil {
		t.Fatal(err)
	}
	if _, err := insp.GetTaskInfo(holdQueue, n.ID); err != nil {
		t.Fatalf("Abort deleted an adopted task: %v", err)
	}
	retry.Adopt(holdQueue, n.Tenant, n.ID)
	if err := retry.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ti, err := insp.GetTaskInfo(holdQueue, n.ID); err != nil || ti.State != asynq.TaskStateAggregating || ti.Group != n.Tenant {
		t.Fatalf("adopted task after Release: %+v, %v; want waiting in its tenant's room", ti, err)
	}
}
