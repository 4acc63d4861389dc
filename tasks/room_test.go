package tasks_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/fairq"
	"github.com/sluicehq/sluice/internal/pollgate"
	"github.com/sluicehq/sluice/scripts"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
)

// fairClient is a client for Asynq servers on queues, with the fair
// dispatch of the waiting rooms a worker puts on its own.
func fairClient(t *testing.T, rdb *redis.Client, queues ...string) redis.UniversalClient {
	t.Helper()
	d := fairq.New(rdb, fairq.Options{Queues: queues, Recheck: 20 * time.Millisecond})
	c, err := pollgate.Clone(rdb, d.Hook())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// What a Producer writes is what asynq.Client writes for the same
// notification and options into a tenant's group: Asynq's inspector reads
// the same task from both (the id aside). This pins the message encoding
// and the room's keys to the Asynq version in go.mod.
func TestAsynqReadsRoomMessages(t *testing.T) {
	_, rdb := redistest.New(t)
	ctx := context.Background()
	keys, _ := tasks.ParseKeyring(tasks.NewKeySpec("room"))
	insp := asynq.NewInspectorFromRedisClient(rdb)
	deadline := time.Now().Add(time.Hour).Truncate(time.Second)
	for _, opts := range [][]asynq.Option{
		{asynq.Queue(holdQueue)},
		{asynq.Queue(holdQueue), asynq.MaxRetry(3), asynq.Timeout(time.Minute), asynq.Retention(time.Hour)},
		{asynq.Queue(holdQueue), asynq.Deadline(deadline), asynq.Timeout(0)},
	} {
		theirs, ours := holdSMS(1), holdSMS(2)
		theirs.Headers = nil
		if _, err := tasks.Enqueue(ctx, asynq.NewClientFromRedisClient(rdb), keys, theirs, opts...); err != nil {
			t.Fatal(err)
		}
		info, err := tasks.NewProducer(rdb, keys).Enqueue(ctx, ours, opts...)
		if err != nil {
			t.Fatal(err)
		}
		a, err := insp.GetTaskInfo(holdQueue, theirs.ID)
		if err != nil {
			t.Fatal(err)
		}
		b, err := insp.GetTaskInfo(holdQueue, ours.ID)
		if err != nil {
			t.Fatal(err)
		}
		if a.State != asynq.TaskStateAggregating || a.Group != "acme" {
			t.Fatalf("asynq.Client's task: %+v, want aggregating in group acme", a)
		}
		norm := func(i *asynq.TaskInfo) *asynq.TaskInfo {
			c := *i
			c.ID, c.Payload, c.NextProcessAt = "", nil, time.Time{}
			delete(c.Headers, "traceparent")
			return &c
		}
		if d := cmp.Diff(norm(a), norm(b)); d != "" {
			t.Fatalf("options %v: the inspector reads another task (-asynq.Client +Producer):\n%s", opts, d)
		}
		if d := cmp.Diff(norm(b), norm(info)); d != "" {
			t.Fatalf("Enqueue's TaskInfo is not the stored task's (-stored +returned):\n%s", d)
		}
		if n, err := tasks.Open(keys, ours.ID, b.Type, b.Payload, false); err != nil || n.ID != ours.ID {
			t.Fatalf("the stored payload does not open: %v", err)
		}
	}
	waiting, err := insp.ListAggregatingTasks(holdQueue, "acme")
	if err != nil || len(waiting) != 6 {
		t.Fatalf("asynqmon's list of acme's waiting tasks: %d, %v", len(waiting), err)
	}
	if _, err := tasks.NewProducer(rdb, keys).Enqueue(ctx, holdSMS(3), asynq.Queue(holdQueue), asynq.ProcessIn(time.Minute)); err == nil {
		t.Fatal("a Producer took ProcessIn, which a room cannot hold")
	}
}

// A tenant's notifications leave its room in the order they came, one
// producer or many, and a duplicate id is refused while the first waits.
func TestRoomKeepsEnqueueOrder(t *testing.T) {
	_, rdb := redistest.New(t)
	ctx := context.Background()
	p := tasks.NewProducer(rdb, nil)
	var want []string
	var items []tasks.Item
	for i := range 50 {
		n := holdSMS(i % 10)
		n.ID = fmt.Sprintf("custom-%c-%d", 'z'-i%26, i) // ids in no order
		items = append(items, tasks.Item{N: n, Opts: []asynq.Option{asynq.Queue(holdQueue)}})
		want = append(want, n.ID)
	}
	res, err := p.EnqueueMany(ctx, items[:20])
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items[20:] {
		if _, err := p.Enqueue(ctx, it.N, it.Opts...); err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if _, err := p.Enqueue(ctx, items[3].N, items[3].Opts...); !errorsIsDuplicate(err) {
		t.Fatalf("a waiting id enqueued again: %v", err)
	}
	c := runServer(t, rdb)
	c.wait(t, want[len(want)-1])
	if got := c.seen(); !slices.Equal(got, want) {
		t.Fatalf("ran %v, want %v", got, want)
	}
}

func errorsIsDuplicate(err error) bool { return errors.Is(err, tasks.ErrDuplicate) }

// One script call for several tenants, interleaved: each tenant enters the
// room's sets once, and each group holds its tenant's ids in enqueue order
// with rising scores (a group's last score is read once per call).
func TestRoomCallOfSeveralTenants(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	ctx := context.Background()
	p := tasks.NewProducer(rdb, nil)
	tenants := []string{"acme", "globex", "initech"}
	want := map[string][]string{}
	var items []tasks.Item
	for round := range 2 { // the second call finds the groups' last scores in Redis
		items = items[:0]
		for i := range 30 {
			n := tasks.NewSMS(tenants[i%3], "+14155550100", "hi")
			n.ID = fmt.Sprintf("r%d-%c-%02d", round, 'z'-i%26, i) // ids in no order
			items = append(items, tasks.Item{N: n, Opts: []asynq.Option{asynq.Queue(holdQueue)}})
			want[n.Tenant] = append(want[n.Tenant], n.ID)
		}
		res, err := p.EnqueueMany(ctx, items)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	room := tasks.RoomOf(holdQueue)
	if got, err := rdb.SMembers(ctx, room.Groups).Result(); err != nil || len(got) != 3 {
		t.Fatalf("groups %v (%v), want the 3 tenants", got, err)
	}
	if got, err := rdb.ZCard(ctx, room.Fair).Result(); err != nil || got != 3 {
		t.Fatalf("%d tenants in the fair set (%v), want 3", got, err)
	}
	for _, tenant := range tenants {
		if ids := groupIDs(t, rdb, room.Group(tenant)); !slices.Equal(ids, want[tenant]) {
			t.Fatalf("%s's group %v, want %v", tenant, ids, want[tenant])
		}
	}
}

// The script takes any number of notifications in one call (the producers
// send at most MaxRoomBatch): 1,200 of one tenant enter its group in order,
// its ZADD sent in parts.
func TestFairEnqueueScriptOverABatch(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	ctx := context.Background()
	room := tasks.RoomOf(holdQueue)
	keys := []string{room.Groups, room.Fair, room.Clock, room.Scheduled}
	args := []any{1200, ""}
	var want []string
	for i := range 1200 {
		id := fmt.Sprintf("big-%c-%04d", 'z'-i%26, i) // ids in no order
		keys = append(keys, room.Task(id), room.Group("acme"))
		args = append(args, id, "acme", "msg")
		want = append(want, id)
	}
	added, err := scripts.FairEnqueue.Run(ctx, rdb, keys, args...).Int64Slice()
	if err != nil || len(added) != 1200 || slices.Contains(added, 0) {
		t.Fatalf("added %d (%v), a refusal: %v", len(added), err, slices.Contains(added, 0))
	}
	if ids := groupIDs(t, rdb, room.Group("acme")); !slices.Equal(ids, want) {
		t.Fatalf("the group holds %d ids, not the 1,200 in order", len(ids))
	}
}

// groupIDs is a tenant's group's ids in order, failing the test where a
// score does not rise.
func groupIDs(t *testing.T, rdb *redis.Client, group string) []string {
	t.Helper()
	zs, err := rdb.ZRangeWithScores(context.Background(), group, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i, z := range zs {
		ids = append(ids, z.Member.(string))
		if i > 0 && z.Score <= zs[i-1].Score {
			t.Fatalf("%s: score %f after %f", group, z.Score, zs[i-1].Score)
		}
	}
	return ids
}
