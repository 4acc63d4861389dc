package worker_test

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// hogs starts n processes that spin on a core each until the test ends: a
// loaded machine, where a task's goroutine can be starved for longer than
// the gap between two notifications.
func hogs(t *testing.T, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	}
}

// stall holds the first command that names key for d before it goes.
type stall struct {
	key  string
	d    time.Duration
	once *sync.Once
}

func (s stall) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s stall) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.hold([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (s stall) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		s.hold(cmds)
		return next(ctx, cmds)
	}
}
func (s stall) hold(cmds []redis.Cmder) {
	for _, c := range cmds {
		for _, a := range c.Args() {
			if a == s.key {
				s.once.Do(func() { time.Sleep(s.d) })
				return
			}
		}
	}
}

// The lesson's demo, twenty times at once beside two CPU hogs: 8 SMS to one
// recipient, 100 ms apart, under 5 per 10 s, at concurrency 10. Every trial
// admits #1–#5 and books #6–#8: a later notification to a recipient is
// never admitted ahead of an earlier one its rules would admit too, however
// the processors' goroutines are scheduled.
func TestOneRecipientsNotificationsKeepTheirOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=5/10s,sms:tenant=100000/1h")
	hogs(t, 2)
	const trials = 20
	ids := make([][]string, trials)
	for trial := range ids {
		for range 8 {
			ids[trial] = append(ids[trial], tasks.NewID())
		}
	}
	// One trial's #5 is starved on its way to the limiter for 300 ms, past
	// #6's enqueue: what a loaded machine did to the demo.
	lim, err := throttle.New(b.rdb, throttle.Options{Secret: []byte(b.cfg.SubjectSecret), CompactMembers: b.cfg.CompactMembers})
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(b.rdb.Options())
	t.Cleanup(func() { rdb.Close() })
	rdb.AddHook(stall{key: lim.StateKey("acme", ids[0][4]), d: 300 * time.Millisecond, once: new(sync.Once)})
	var mu sync.Mutex
	first := map[string]throttle.Status{} // the first decision of each notification
	b.startWith(t, b.cfg, app.WorkerOptions{Redis: rdb, OnDecision: func(n tasks.Notification, d throttle.Decision) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := first[n.ID]; !ok {
			first[n.ID] = d.Status
		}
	}})
	var wg sync.WaitGroup
	for trial := range trials {
		wg.Go(func() {
			to := fmt.Sprintf("+1415555%04d", 1000+trial)
			for i := range 8 {
				n := tasks.NewSMS("acme", to, fmt.Sprintf("#%d", i+1))
				n.ID = ids[trial][i]
				b.enqueue(t, n)
				time.Sleep(100 * time.Millisecond) // the demo's pace
			}
		})
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		mu.Lock()
		n := len(first)
		mu.Unlock()
		if n == trials*8 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d of %d notifications checked in 30 s", n, trials*8)
		case <-time.After(20 * time.Millisecond):
		}
	}
	mu.Lock()
	defer mu.Unlock()
	bad := 0
	for trial, list := range ids {
		var got []string
		wrong := false
		for i, id := range list {
			st := first[id]
			got = append(got, st.String())
			admitted := st == throttle.StatusAdmitted
			if admitted != (i < 5) {
				wrong = true
			}
		}
		if wrong {
			bad++
			t.Errorf("trial %d: first decisions %v; want #1–#5 admitted, #6–#8 not", trial, got)
		}
	}
	t.Logf("%d trials of 8 notifications beside two CPU hogs: %d out of order", trials, bad)
}
