package tasks_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
)

func TestEnqueueRejectsDuplicateID(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	c := asynq.NewClientFromRedisClient(rdb)
	ctx := context.Background()
	n := tasks.NewSMS("acme", "+14155550100", "hi")
	info, err := tasks.Enqueue(ctx, c, nil, n)
	if err != nil {
		t.Fatal(err)
	}
	route := tasks.DefaultLayout.Route("acme", tasks.LaneStandard, nil)
	if info.ID != n.ID || info.Queue != route || info.MaxRetry != tasks.DefaultMaxRetry+1 {
		t.Fatalf("info = %+v", info)
	}
	if _, err := tasks.Enqueue(ctx, c, nil, n); !errors.Is(err, tasks.ErrDuplicate) {
		t.Fatalf("second enqueue: %v, want ErrDuplicate", err)
	}
	bad := tasks.NewSMS("acme", "not-a-number", "hi")
	if _, err := tasks.Enqueue(ctx, c, nil, bad); !errors.Is(err, tasks.ErrInvalid) {
		t.Fatalf("invalid enqueue: %v", err)
	}
	insp := asynq.NewInspectorFromRedisClient(rdb)
	qi, err := insp.GetQueueInfo(route)
	if err != nil || qi.Size != 1 {
		t.Fatalf("queue holds %+v (%v), want exactly the one task", qi, err)
	}
}

// EnqueueAll enqueues every item, or none: a duplicate id among them, an
// invalid one, or items of two queues enqueue nothing (false), and the
// queue is left as it was.
func TestEnqueueAllIsAllOrNothing(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	ctx := context.Background()
	p := tasks.NewProducer(rdb, nil)
	std := tasks.DefaultLayout.Route("acme", tasks.LaneStandard, nil)
	items := func(k int, to string) []tasks.Item {
		var out []tasks.Item
		for range k {
			out = append(out, tasks.Item{N: tasks.NewSMS("acme", to, "hi"), Opts: []asynq.Option{asynq.Queue(std)}})
		}
		return out
	}
	waiting := func() int64 {
		w, err := tasks.ReadWaiting(ctx, rdb, std)
		if err != nil {
			t.Fatal(err)
		}
		return w.Count
	}
	first := items(3, "+14155550100")
	res, ok, err := p.EnqueueAll(ctx, first)
	if err != nil || !ok || len(res) != 3 || waiting() != 3 {
		t.Fatalf("EnqueueAll of 3 fresh: %v %v %v; %d waiting", res, ok, err, waiting())
	}
	for i, r := range res {
		if r.Err != nil || r.Info == nil || r.Info.ID != first[i].N.ID || r.Info.State != asynq.TaskStateAggregating {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	otp := tasks.Item{N: tasks.NewSMS("acme", "+14155550101", "hi"), Opts: []asynq.Option{asynq.Queue(tasks.DefaultLayout.Route("acme", tasks.LanePriority, nil))}}
	bad := tasks.Item{N: tasks.NewSMS("acme", "not-a-number", "hi"), Opts: []asynq.Option{asynq.Queue(std)}}
	for name, batch := range map[string][]tasks.Item{
		"a duplicate id":     append(items(2, "+14155550102"), first[1]),
		"an invalid item":    append(items(2, "+14155550103"), bad),
		"two queues":         append(items(2, "+14155550104"), otp),
		"more than one call": items(tasks.MaxRoomBatch+1, "+14155550105"),
	} {
		if res, ok, err := p.EnqueueAll(ctx, batch); ok || err != nil || res != nil {
			t.Errorf("%s: %v %v %v, want nothing enqueued (false)", name, res, ok, err)
		}
		if w := waiting(); w != 3 {
			t.Fatalf("%s: %d waiting, want the first 3 only", name, w)
		}
	}
	// The items of a refused call go through EnqueueMany as before.
	again, err := p.EnqueueMany(ctx, append(items(2, "+14155550102"), first[1]))
	if err != nil || again[0].Err != nil || !errors.Is(again[2].Err, tasks.ErrDuplicate) || waiting() != 5 {
		t.Fatalf("EnqueueMany after: %+v, %v; %d waiting", again, err, waiting())
	}
}
