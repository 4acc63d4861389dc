package worker_test

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// loseDequeue leaves Redis as Asynq's dequeue script does when Redis dies
// just after running it: the task active with a fresh 30 s lease, and no
// worker that received it.
var loseDequeue = redis.NewScript(`
local id = redis.call('RPOPLPUSH', KEYS[1], KEYS[2])
if not id then return redis.error_reply('nothing pending') end
redis.call('HSET', ARGV[1] .. id, 'state', 'active')
redis.call('HDEL', ARGV[1] .. id, 'pending_since')
redis.call('ZADD', KEYS[3], ARGV[2], id)
return id
`)

// A task Asynq holds as active that no worker runs (its dequeue reply lost)
// is put back by the worker's sweeper once its lease has stood still for
// ORPHAN_AFTER, not after Asynq's 60–120 s lease recovery, and is sent
// once.
func TestOrphanedTaskIsRequeued(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms:recipient=5/1m")
	n := tasks.NewSMS("acme", "+14155550190", "orphaned by a lost dequeue")
	b.enqueue(t, n)
	p := "asynq:{" + b.cfg.Layout().Route("acme", tasks.LaneStandard, nil) + "}:"
	dispatch(t, b.rdb, b.cfg.Layout().Route("acme", tasks.LaneStandard, nil)) // out of its room, as a worker would
	lease := time.Now().Add(30 * time.Second).Unix()
	if err := loseDequeue.Run(context.Background(), b.rdb, []string{p + "pending", p + "active", p + "lease"}, p+"t:", lease).Err(); err != nil {
		t.Fatal(err)
	}
	cfg := b.cfg
	cfg.OrphanAfter = 11 * time.Second
	start := time.Now()
	r := b.start(t, cfg)
	ds := b.sms.WaitCount(t, 1, 30*time.Second)
	took := ds[0].At.Sub(start)
	t.Logf("orphaned task delivered %v after the worker started (ORPHAN_AFTER %v; Asynq's own recovery: 60–120 s)", took.Round(100*time.Millisecond), cfg.OrphanAfter)
	if took < cfg.OrphanAfter {
		t.Fatalf("delivered %v after start: requeued before its lease had stood still for ORPHAN_AFTER", took)
	}
	if got := metric(t, r.reg, "sluice_orphans_requeued_total", nil); got != 1 {
		t.Fatalf("sluice_orphans_requeued_total = %v, want 1", got)
	}
	b.waitIdle(t, 10*time.Second)
	if a := b.sms.Attempts(); a != 1 {
		t.Fatalf("%d send attempts, want 1", a)
	}
}

// A live task whose send takes longer than ORPHAN_AFTER is never taken for
// an orphan: its server's heartbeat moves its lease. Two workers sweep.
func TestSlowLiveTaskIsNotRequeued(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms:recipient=5/1m")
	b.sms.SetLatency(16 * time.Second)
	cfg := b.cfg
	cfg.OrphanAfter = 11 * time.Second
	cfg = withEnv(cfg, "SLUICE_SMS_TIMEOUT", "40s")
	w1, w2 := b.start(t, cfg), b.start(t, cfg)
	n := tasks.NewSMS("acme", "+14155550191", "slow but alive")
	b.enqueue(t, n)
	b.sms.WaitCount(t, 1, 40*time.Second)
	b.waitIdle(t, 10*time.Second)
	if a := b.sms.Attempts(); a != 1 {
		t.Fatalf("%d send attempts, want 1: a live task was requeued", a)
	}
	for i, r := range []*running{w1, w2} {
		if got := metric(t, r.reg, "sluice_orphans_requeued_total", nil); got != 0 {
			t.Fatalf("worker %d requeued %v tasks, want 0", i, got)
		}
	}
}

// waitIdle polls Asynq (it offers no signal) until the queue has nothing
// waiting (in a room or pending) or active.
func (b *bundle) waitIdle(t *testing.T, timeout time.Duration) *asynq.QueueInfo {
	t.Helper()
	// Every 50 ms: a read of every queue's counters is costly.
	return sluicetest.EventuallyValueEvery(t, timeout, 50*time.Millisecond, "the queue to be idle (nothing pending or active)", func() (*asynq.QueueInfo, bool) {
		qi := b.queueStats(t)
		return qi, qi.Active == 0 && qi.Pending == 0 && qi.Aggregating == 0
	})
}
