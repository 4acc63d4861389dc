package throttle_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// The earliest-fit search has three ways through a key (scripts/limiter_log.lua,
// log_earliest): room at the start (one ZCOUNT), a full window with nothing
// after the start (the limit-th newest entry read alone), and the walk by
// rank in doubling chunks (bookings ahead, gaps among them, a start after
// now). This drives all three with large limits, dense windows, deep
// booking queues with gaps released inside them, starts in the future and
// two rules a key apart, through denials, bookings and wake-ups, and checks
// every slot against the brute-force model (modelSlot).
func TestReserveSearchPathsMatchModel(t *testing.T) {
	t.Parallel()
	_, c := setupRedis(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 23))
	var denied, booked, woken, chunked int
	for trial := 0; trial < 40; trial++ {
		clock := newManualClock()
		compact := trial%2 == 0
		lim, err := throttle.New(c, throttle.Options{Secret: testSecret, Now: clock.Now, CompactMembers: compact})
		if err != nil {
			t.Fatal(err)
		}
		group := fmt.Sprintf("paths-%d", trial)
		slack := time.Duration(rng.IntN(3)*50) * time.Millisecond
		rules := []throttle.Limit{{Scope: "sms:recipient", Subject: "+14155550100",
			Rule: throttle.Rule{Limit: 3 + rng.IntN(30), Window: time.Duration(1+rng.IntN(4)) * time.Second}}}
		if trial%3 == 0 { // a second rule: the search's passes move c between keys
			rules = append(rules, throttle.Limit{Scope: "sms:tenant", Rule: throttle.Rule{Limit: rules[0].Rule.Limit + rng.IntN(10), Window: time.Duration(2+rng.IntN(4)) * time.Second}})
		}
		keys := make([]string, len(rules))
		for i, r := range rules {
			if keys[i], err = lim.Key(group, r); err != nil {
				t.Fatal(err)
			}
		}
		model := func(own string, at int64) []modelKey {
			var mk []modelKey
			for i, r := range rules {
				span := (r.Rule.Window + slack).Milliseconds()
				var es []int64
				for m, sc := range snapshot(t, c, keys[i]) {
					if m == own || sc < at-span {
						continue
					}
					es = append(es, sc)
				}
				mk = append(mk, modelKey{entries: es, limit: r.Rule.Limit, span: span})
			}
			return mk
		}
		type held struct {
			id      string
			attempt int
			slot    int64
		}
		var queue []held
		start := clock.Now().UnixMilli()
		for step := 0; step < 150; step++ {
			// Dense arrivals: a few ms apart, so windows fill and queues grow.
			clock.Set(clock.Now().Add(time.Duration(rng.IntN(40)) * time.Millisecond))
			now := clock.Now().UnixMilli()
			o := throttle.ReserveOptions{Slack: slack, Book: rng.IntN(3) > 0}
			var from int64 = now
			if rng.IntN(6) == 0 {
				tmin := now + int64(rng.IntN(3000))
				o.NotBefore, from = time.UnixMilli(tmin), tmin
			}
			id, own := fmt.Sprintf("s%d-%d", trial, step), ""
			wake := len(queue) > 0 && rng.IntN(4) == 0
			if wake { // a booked id asks again, from up to a second before its slot
				h := queue[0]
				queue = queue[1:]
				clock.Set(time.UnixMilli(max(now, h.slot-int64(rng.IntN(1000)))))
				now, from = clock.Now().UnixMilli(), clock.Now().UnixMilli()
				id = h.id
				o.NotBefore = time.Time{}
				own = h.id
				if compact {
					own = compactMember(h.id)
				}
				if h.attempt > 1 {
					own += fmt.Sprintf("#%d", h.attempt)
				}
			}
			if !wake && len(queue) > 3 && rng.IntN(8) == 0 { // a gap opens inside the queue
				j := rng.IntN(len(queue))
				if _, err := lim.Release(ctx, group, queue[j].id, queue[j].attempt, rules...); err != nil {
					t.Fatal(err)
				}
				queue = append(queue[:j:j], queue[j+1:]...)
			}
			mk := model(own, now)
			for _, k := range mk {
				if len(k.entries) > k.limit+4 {
					chunked++
				}
			}
			d, err := lim.Reserve(ctx, group, id, o, rules...)
			if err != nil {
				t.Fatal(err)
			}
			want := modelSlot(mk, from, nil)
			if got := d.At.UnixMilli(); got != want {
				t.Fatalf("trial %d step %d (%s, wake=%v, book=%v): slot +%d ms, the model says +%d ms\nrules %v\nentries %v",
					trial, step, d.Status, wake, o.Book, got-start, want-start, rules, mk)
			}
			switch d.Status {
			case throttle.StatusDenied:
				denied++
			case throttle.StatusBooked:
				booked++
				queue = append(queue, held{id, d.Attempt, d.At.UnixMilli()})
			case throttle.StatusAdmitted:
				if wake {
					woken++
				}
			default:
				t.Fatalf("trial %d step %d: unexpected %s", trial, step, d.Status)
			}
		}
		lim.Close()
	}
	if denied < 100 || booked < 100 || woken < 20 || chunked < 100 {
		t.Fatalf("the workload missed a path: %d denied, %d booked, %d woken and admitted, %d checks over deep keys", denied, booked, woken, chunked)
	}
	t.Logf("%d denied, %d booked, %d woken and admitted, %d checks over keys deeper than limit+4: all slots equal to the model's", denied, booked, woken, chunked)
}
