package api_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/testkit/apienv"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// failNthEnqueue fails the n-th script that enqueues a batch's items held
// (tasks' fair_enqueue.lua with a hold: one per queue, sent in one
// pipeline) as if Redis had gone away before it ran — it is not sent, the
// others are — but first gives a running worker up to 2 s to send what
// the batch enqueued before it.
type failNthEnqueue struct {
	n, seen atomic.Int32
	sent    func() int
}

func (h *failNthEnqueue) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *failNthEnqueue) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *failNthEnqueue) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		kept := cmds[:0:0]
		for _, cmd := range cmds {
			if !heldEnqueue(cmd) || h.seen.Add(1) != h.n.Load() {
				kept = append(kept, cmd)
				continue
			}
			// The fake signals nothing this hook could wait on; a send
			// would be the bug, so none by the timeout is the usual
			// outcome, not an error.
			_ = sluicetest.Wait(2*time.Second, "a send of the batch's first items", func() bool { return h.sent() > 0 })
			cmd.SetErr(errors.New("injected: connection reset by peer"))
		}
		return next(ctx, kept)
	}
}

// heldEnqueue recognises fair_enqueue.lua enqueueing held notifications:
// KEYS groups, fair, clock, scheduled, …; ARGV n, a hold, id, tenant, a message.
func heldEnqueue(cmd redis.Cmder) bool {
	args := cmd.Args()
	if name, _ := args[0].(string); (name != "evalsha" && name != "eval") || len(args) < 12 {
		return false
	}
	k0, _ := args[3].(string)
	k3, _ := args[6].(string)
	n, _ := args[2].(int)
	hold, _ := args[3+n+1].(string)
	return strings.HasSuffix(k0, "}:groups") && strings.HasSuffix(k3, "}:scheduled") && hold != ""
}

// A batch is all or nothing even with a worker running: of a batch in two
// lanes (three standard SMS, two OTPs: one script per queue), Redis fails
// at the second queue's, after the worker had its chance to take the
// first's. The answer is 503; nothing of the batch reaches the provider (a
// notification sent after it arrives alone) and no task of it is left.
func TestBatchAllOrNothingWithAWorkerRunning(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms:recipient=10/1m,sms.otp:exempt", map[string]string{"SLUICE_POLL_INTERVAL": "20ms"})
	b.RunWorker(t, app.WorkerOptions{})

	// A second API on a client whose third enqueue fails.
	o := *b.RDB.Options()
	faulty := redis.NewClient(&o)
	t.Cleanup(func() { faulty.Close() })
	hook := &failNthEnqueue{sent: b.SMS.Attempts}
	hook.n.Store(2)
	faulty.AddHook(hook)
	faultyAPI := b.another(t, app.APIOptions{Redis: faulty})

	var items []map[string]any
	for i := range 5 {
		item := apienv.NewSMS("+1415555020"+string(rune('0'+i)), "part of a batch")
		if i >= 3 {
			item["category"] = "otp"
		}
		items = append(items, item)
	}
	r := faultyAPI.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], map[string]any{"notifications": items})
	if r.Status != http.StatusServiceUnavailable {
		t.Fatalf("batch with Redis failing at its second queue: %d %s, want 503", r.Status, r.Body)
	}
	if hook.seen.Load() < 2 {
		t.Fatalf("the fault never fired (%d enqueues)", hook.seen.Load())
	}
	// A notification after the failed batch: once it arrives, the worker
	// has had every chance to send what the batch left.
	b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], apienv.NewSMS("+14155550299", "after the batch"))
	ds := b.SMS.WaitCount(t, 1, 10*time.Second)
	if len(ds) != 1 || ds[0].To != "+14155550299" {
		var to []string
		for _, d := range ds {
			to = append(to, d.To)
		}
		t.Fatalf("the provider received %v; want only the notification sent after the failed batch", to)
	}
	// The sentinel's task goes once its send completes (no retention).
	sluicetest.Eventually(t, 5*time.Second, "no task of the failed batch left in any queue", func() bool { return len(b.Queued(t)) == 0 })
}

// loseAllReply runs fair_enqueue.lua in its all-or-none mode (a keyed
// batch that fits one script: tasks.Producer.EnqueueAll) and then loses
// its reply, once, as a connection reset after Redis ran it would: the
// items are enqueued, the API does not know. (The script goes in a
// pipeline as EVALSHA, or alone as EVAL where Redis did not have it yet.)
type loseAllReply struct{ lost atomic.Int32 }

func (h *loseAllReply) lose(cmd redis.Cmder) bool {
	if allEnqueue(cmd) && cmd.Err() == nil && h.lost.Add(1) == 1 {
		cmd.SetErr(errors.New("injected: connection reset by peer"))
		return true
	}
	return false
}

func (h *loseAllReply) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *loseAllReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.lose(cmd) {
			return cmd.Err()
		}
		return err
	}
}
func (h *loseAllReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			h.lose(cmd)
		}
		return err
	}
}

// allEnqueue recognises fair_enqueue.lua in its all-or-none mode: KEYS
// groups, …; ARGV n, "all", ….
func allEnqueue(cmd redis.Cmder) bool {
	args := cmd.Args()
	if name, _ := args[0].(string); (name != "evalsha" && name != "eval") || len(args) < 8 {
		return false
	}
	k0, _ := args[3].(string)
	n, _ := args[2].(int)
	return strings.HasSuffix(k0, "}:groups") && len(args) > 3+n+1 && args[3+n+1] == "all"
}

// A keyed batch goes into its rooms in one script, all or none. When its
// reply is lost (the script ran) the answer is 503; the retry with the same
// Idempotency-Key finds every item enqueued, answers 202 with their states,
// and the provider receives each notification exactly once.
func TestKeyedBatchReplyLostThenRetried(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=10/1m", map[string]string{"SLUICE_POLL_INTERVAL": "20ms"})
	b.RunWorker(t, app.WorkerOptions{})
	o := *b.RDB.Options()
	faulty := redis.NewClient(&o)
	t.Cleanup(func() { faulty.Close() })
	hook := &loseAllReply{}
	faulty.AddHook(hook)
	faultyAPI := b.another(t, app.APIOptions{Redis: faulty})

	var items []map[string]any
	for i := range 4 {
		items = append(items, apienv.NewSMS("+1415555030"+string(rune('0'+i)), "keyed batch"))
	}
	body := map[string]any{"notifications": items}
	r := faultyAPI.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], body, "Idempotency-Key", "campaign-7")
	if r.Status != http.StatusServiceUnavailable || hook.lost.Load() != 1 {
		t.Fatalf("batch whose reply was lost: %d %s (replies lost: %d), want 503", r.Status, r.Body, hook.lost.Load())
	}
	r = faultyAPI.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], body, "Idempotency-Key", "campaign-7")
	var ba api.BatchAccepted
	r.JSON(t, &ba)
	if r.Status != http.StatusAccepted || len(ba.Notifications) != 4 {
		t.Fatalf("retry: %d %s", r.Status, r.Body)
	}
	ds := b.SMS.WaitCount(t, 4, 10*time.Second)
	// A notification after the batch: once it arrives, the worker has had
	// every chance to send a fifth copy of the batch's.
	b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], apienv.NewSMS("+14155550399", "after the batch"))
	ds = b.SMS.WaitCount(t, 5, 10*time.Second)
	seen := map[string]int{}
	for _, d := range ds {
		seen[d.To]++
	}
	for i, a := range ba.Notifications {
		if to := items[i]["to"].(string); seen[to] != 1 || a.State == "" {
			t.Errorf("%s (%s, %s) received %d times, want once", to, a.ID, a.State, seen[to])
		}
	}
	if len(ds) != 5 {
		t.Fatalf("the provider received %d messages, want 5", len(ds))
	}
}
