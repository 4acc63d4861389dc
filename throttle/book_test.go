package throttle_test

import (
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

func TestBookSlots(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 2, Window: 10 * time.Second})
	slack := throttle.BookOptions{Slack: time.Second}
	t0 := b.clock.Now()
	for _, m := range []string{"a", "b"} {
		if d, err := b.lim.Book(ctx, b.group, m, slack, lim); err != nil || !d.Allowed {
			t.Fatalf("%s: %+v %v", m, d, err)
		}
	}
	want := map[string]time.Duration{"c": 11001 * time.Millisecond, "d": 11001 * time.Millisecond, "e": 22002 * time.Millisecond}
	for _, m := range []string{"c", "d", "e"} {
		d, err := b.lim.Book(ctx, b.group, m, slack, lim)
		if err != nil || d.Allowed || !d.Booked || d.RetryAfter != want[m] || d.DeniedBy != 0 {
			t.Fatalf("%s: %+v %v; want booked in %v", m, d, err, want[m])
		}
	}
	// Asking again before the slot keeps the booking.
	b.clock.Set(t0.Add(5 * time.Second))
	if d, _ := b.lim.Book(ctx, b.group, "c", slack, lim); !d.Booked || d.RetryAfter != 6001*time.Millisecond {
		t.Fatalf("early wake: %+v", d)
	}
	// Slightly early (a host clock ahead of Redis) is admitted when no window
	// suffers: c and d sit 11 001 ms after a and b, the window is 10 000 ms.
	u, _ := b.lim.Usage(ctx, b.group, lim)
	if u[0].Used != 2 || u[0].Booked != 3 {
		t.Fatalf("usage %+v", u[0])
	}
	b.clock.Set(t0.Add(10950 * time.Millisecond))
	if d, _ := b.lim.Book(ctx, b.group, "c", slack, lim); !d.Allowed {
		t.Fatalf("c 51 ms early: %+v", d)
	}
	// d, 900 ms late (within the slack), is admitted too.
	b.clock.Set(t0.Add(11901 * time.Millisecond))
	if d, _ := b.lim.Book(ctx, b.group, "d", slack, lim); !d.Allowed {
		t.Fatalf("d at its slot: %+v", d)
	}
	// A newcomer queues behind e's booking instead of taking a slot now.
	if d, _ := b.lim.Book(ctx, b.group, "f", slack, lim); !d.Booked {
		t.Fatalf("newcomer: %+v", d)
	}
	// Re-asking for an admitted member is a duplicate, as with Allow.
	if d, _ := b.lim.Book(ctx, b.group, "c", slack, lim); !d.Allowed || !d.Duplicate {
		t.Fatalf("re-run: %+v", d)
	}
	// Release drops a booking.
	if n, _ := b.lim.Release(ctx, b.group, "f", lim); n != 1 {
		t.Fatalf("release of a booking removed %d", n)
	}
	if _, err := b.lim.Book(ctx, b.group, "book:x", slack, lim); err == nil {
		t.Fatal("a member with the booking prefix was accepted")
	}
}

type wake struct {
	at     time.Time
	member string
	idx    int
}
type wakeQueue []wake

func (q wakeQueue) Len() int           { return len(q) }
func (q wakeQueue) Less(i, j int) bool { return q[i].at.Before(q[j].at) }
func (q wakeQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *wakeQueue) Push(x any)        { *q = append(*q, x.(wake)) }
func (q *wakeQueue) Pop() any          { o := *q; x := o[len(o)-1]; *q = o[:len(o)-1]; return x }

// checkTimeline fails if any window of actual admission times holds more than limit.
func checkTimeline(t *testing.T, what string, times []time.Time, rule throttle.Rule) {
	t.Helper()
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	for i := 0; i+rule.Limit < len(times); i++ {
		if span := times[i+rule.Limit].Sub(times[i]); span <= rule.Window {
			t.Fatalf("%s: %d admissions within %v (from %v), limit %s", what, rule.Limit+1, span, times[i], rule)
		}
	}
}

// A backlog driven through Book with random wake lateness — mostly within
// the slack, sometimes beyond it, sometimes early — never admits more than
// the limit in any window of ACTUAL admission times, over many seeds, with
// a recipient rule and a shared tenant rule.
func TestBookKeepsActualTimelineExact(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	slack := throttle.BookOptions{Slack: 2 * time.Second}
	perRcpt := throttle.Rule{Limit: 5, Window: 10 * time.Second}
	tenant := throttle.Rule{Limit: 8, Window: 15 * time.Second}
	for seed := uint64(1); seed <= 12; seed++ {
		rng := rand.New(rand.NewPCG(seed, 42))
		group := fmt.Sprintf("%s-%d", b.group, seed)
		start := newManualClock().Now().Add(time.Duration(seed) * 24 * time.Hour)
		rcpts := []string{"+14155550001", "+14155550002"}
		limitsOf := func(idx int) []throttle.Limit {
			return []throttle.Limit{
				{Scope: "sms:recipient", Subject: rcpts[idx%2], Rule: perRcpt},
				{Scope: "sms:tenant", Rule: tenant},
			}
		}
		q := &wakeQueue{}
		const members = 60
		for i := 0; i < members; i++ {
			heap.Push(q, wake{at: start.Add(time.Duration(i) * 150 * time.Millisecond), member: fmt.Sprintf("m%d", i), idx: i})
		}
		admitted := map[int][]time.Time{}
		var all []time.Time
		calls := 0
		for q.Len() > 0 {
			w := heap.Pop(q).(wake)
			b.clock.Set(w.at)
			d, err := b.lim.Book(ctx, group, w.member, slack, limitsOf(w.idx)...)
			calls++
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				if d.Duplicate {
					t.Fatalf("seed %d: %s admitted twice", seed, w.member)
				}
				admitted[w.idx%2] = append(admitted[w.idx%2], d.Now)
				all = append(all, d.Now)
				continue
			}
			if !d.Booked {
				t.Fatalf("seed %d: %s neither admitted nor booked: %+v", seed, w.member, d)
			}
			late := time.Duration(rng.Int64N(int64(slack.Slack)))
			switch r := rng.IntN(10); {
			case r == 0:
				late = slack.Slack + time.Duration(rng.Int64N(int64(3*slack.Slack))) // beyond the slack
			case r == 1:
				late = -time.Duration(rng.Int64N(int64(time.Second))) // early wake
			}
			heap.Push(q, wake{at: w.at.Add(d.RetryAfter + late), member: w.member, idx: w.idx})
		}
		if len(all) != members {
			t.Fatalf("seed %d: %d of %d admitted", seed, len(all), members)
		}
		for r, times := range admitted {
			checkTimeline(t, fmt.Sprintf("seed %d recipient %d", seed, r), times, perRcpt)
		}
		checkTimeline(t, fmt.Sprintf("seed %d tenant", seed), all, tenant)
		if perMsg := float64(calls) / members; perMsg > 3 {
			t.Fatalf("seed %d: %.2f calls per admission", seed, perMsg)
		}
	}
}

// Book under real concurrency on Redis TIME: 40 members, 16 goroutines,
// wake-ups driven by the decisions; admissions are exact on their times.
func TestBookConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	rule := throttle.Rule{Limit: 5, Window: 400 * time.Millisecond}
	lim := recipient(rule)
	slack := throttle.BookOptions{Slack: 150 * time.Millisecond}
	var mu sync.Mutex
	var times []time.Time
	var calls int
	work := make(chan string)
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range work {
				for {
					d, err := b.lim.Book(ctx, b.group, m, slack, lim)
					mu.Lock()
					calls++
					mu.Unlock()
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						mu.Lock()
						times = append(times, d.Now)
						mu.Unlock()
						break
					}
					time.Sleep(d.RetryAfter) // the wake-up the decision asked for
				}
			}
		}()
	}
	for i := 0; i < 40; i++ {
		work <- fmt.Sprintf("m%d", i)
	}
	close(work)
	wg.Wait()
	if len(times) != 40 {
		t.Fatalf("%d admitted", len(times))
	}
	checkTimeline(t, "concurrent", times, rule)
	t.Logf("40 members, limit %s: %.2f calls per admission", rule, float64(calls)/40)
}

func TestBookGranularity(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	b.clock.Set(time.UnixMilli(1_716_873_600_123))
	lim := recipient(throttle.Rule{Limit: 1, Window: 2 * time.Second})
	opts := throttle.BookOptions{Slack: 300 * time.Millisecond, Granularity: time.Second}
	b.lim.Book(ctx, b.group, "a", opts, lim)
	for _, m := range []string{"b", "c"} {
		d, err := b.lim.Book(ctx, b.group, m, opts, lim)
		if err != nil || !d.Booked {
			t.Fatalf("%s: %+v %v", m, d, err)
		}
		if slot := d.Now.Add(d.RetryAfter); slot.UnixMilli()%1000 != 0 {
			t.Fatalf("%s: slot %v is not a whole second", m, slot)
		}
	}
	if _, err := b.lim.Book(ctx, b.group, "x", throttle.BookOptions{Slack: -time.Second}, lim); !errors.Is(err, throttle.ErrInvalidRule) {
		t.Fatalf("negative slack: %v", err)
	}
}
