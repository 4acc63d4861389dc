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
	"github.com/sluicehq/sluice/testkit/sluicetest"
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
// the processors' goroutines are scheduled. Judged exactly, by Redis's
// clock: each notification's slot (its first decision's) is at or after
// the one enqueued before it, and each of #6–#8 is booked unless its check
// came when the recipient's window, holding #1 to the one before it, had
// room (sluicetest.EarliestFit): a machine loaded enough to check it 10 s
// late admits it then, rightly, and its order still holds.
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
	first := map[string]throttle.Decision{} // the first decision of each notification
	b.startWith(t, b.cfg, app.WorkerOptions{Redis: rdb, OnDecision: func(n tasks.Notification, d throttle.Decision) {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := first[n.ID]; !ok {
			first[n.ID] = d
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
	bad, late := 0, 0
	span := 10*time.Second + b.cfg.SendSlack
	for trial, list := range ids {
		var got []string
		var wrong []string
		var slots []time.Time
		for i, id := range list {
			d := first[id]
			at := d.At.Add(-d.Wait) // the check's instant, by Redis's clock
			got = append(got, fmt.Sprintf("%s %+dms", d.Status, d.At.Sub(first[list[0]].At).Milliseconds()))
			room := sluicetest.EarliestFit(slots, 5, span, at).Equal(at)
			admitted := d.Status == throttle.StatusAdmitted
			switch {
			case i < 5 && !admitted:
				wrong = append(wrong, fmt.Sprintf("#%d not admitted", i+1))
			case i >= 5 && admitted && !room:
				wrong = append(wrong, fmt.Sprintf("#%d admitted while #1–#%d filled the window", i+1, i))
			case i >= 5 && room:
				late++ // checked once the window had room: admitted, rightly
			}
			if i > 0 && d.At.Before(slots[i-1]) {
				wrong = append(wrong, fmt.Sprintf("#%d's slot before #%d's", i+1, i))
			}
			slots = append(slots, d.At)
		}
		if len(wrong) > 0 {
			bad++
			t.Errorf("trial %d: first decisions (slots from #1's) %v: %v; want #1–#5 admitted, #6–#8 booked while the window is full, slots in order", trial, got, wrong)
		}
	}
	t.Logf("%d trials of 8 notifications beside two CPU hogs: %d out of order; %d of #6–#8 checked only once the window had room", trials, bad, late)
}
