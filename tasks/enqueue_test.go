package tasks_test

import (
	"context"
	"errors"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/tasks"
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
