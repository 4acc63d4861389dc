package throttle_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// The reference model of distinct-count rules ("LIMIT/WINDOW@distinct"), by
// brute force: the model keeps every admitted send (subject, slot) and asks
// of every instant how many distinct subjects were sent to in the window
// ending there (invariant 26), and, without bookings, which answer the rule
// must give: a subject counted now goes at once; a new one goes when fewer
// than LIMIT others are counted, else at the instant the limit-th newest
// other leaves (one window after its latest send).

type distinctModel struct {
	limit int
	span  int64              // window + slack, ms
	sends map[string][]int64 // subject → admitted slots
}

func newDistinctModel(limit int, span int64) *distinctModel {
	return &distinctModel{limit: limit, span: span, sends: map[string][]int64{}}
}

func (m *distinctModel) latest(s string) (int64, bool) {
	v := m.sends[s]
	if len(v) == 0 {
		return 0, false
	}
	return slices.Max(v), true
}

// present: the subjects with a send in [t - span, t].
func (m *distinctModel) present(t int64) int {
	n := 0
	for _, v := range m.sends {
		for _, x := range v {
			if x <= t && x >= t-m.span {
				n++
				break
			}
		}
	}
	return n
}

// worst checks invariant 26 at every instant where the count can rise (each send).
func (m *distinctModel) worst() (int64, int) {
	var at int64
	most := 0
	for _, v := range m.sends {
		for _, x := range v {
			if n := m.present(x); n > most {
				at, most = x, n
			}
		}
	}
	return at, most
}

// expect is the rule's answer at now with no bookings and no admissions ahead:
// the slot (now when it goes at once).
func (m *distinctModel) expect(s string, now int64) int64 {
	if l, ok := m.latest(s); ok && l >= now-m.span {
		return now
	}
	var others []int64
	for x := range m.sends {
		if x == s {
			continue
		}
		if l, _ := m.latest(x); l >= now-m.span {
			others = append(others, l)
		}
	}
	if len(others) < m.limit {
		return now
	}
	slices.Sort(others)
	return others[len(others)-m.limit] + m.span + 1
}

// Against the model, without bookings: every answer, slot included, is the
// model's to the millisecond, and no window ever holds more than the limit.
func TestDistinctAgainstModel(t *testing.T) {
	for seed := range uint64(12) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			b := setup(t, true)
			rng := rand.New(rand.NewPCG(seed, 26))
			limit := 1 + rng.IntN(6)
			window := time.Duration(200+rng.IntN(2000)) * time.Millisecond
			slack := time.Duration(rng.IntN(3)*50) * time.Millisecond
			subjects := limit + 1 + rng.IntN(8)
			rule := throttle.Rule{Limit: limit, Window: window, Distinct: true}
			m := newDistinctModel(limit, (window + slack).Milliseconds())
			ctx := context.Background()
			for i := range 300 {
				b.clock.Add(time.Duration(rng.IntN(int(window.Milliseconds()/4)+1)) * time.Millisecond)
				now := b.clock.Now().UnixMilli()
				s := fmt.Sprintf("+1555%04d", rng.IntN(subjects))
				want := m.expect(s, now)
				lim := throttle.Limit{Scope: "whatsapp:tenant", Distinct: s, Rule: rule}
				d, err := b.lim.Reserve(ctx, b.group, fmt.Sprint("n", i), throttle.ReserveOptions{Slack: slack}, lim)
				if err != nil {
					t.Fatal(err)
				}
				if got := d.At.UnixMilli(); got != want || d.Allowed != (want == now) {
					t.Fatalf("check %d (%s at %d, limit %d, span %d): allowed %v at %d, the model says %d", i, s, now, limit, m.span, d.Allowed, got, want)
				}
				if d.Allowed {
					m.sends[s] = append(m.sends[s], now)
				}
			}
			if at, most := m.worst(); most > limit {
				t.Fatalf("%d distinct subjects in the window ending %d, limit %d", most, at, limit)
			}
		})
	}
}

// With bookings, admissions ahead (a horizon), booked sends coming back for
// their slots (late or early), repeats and releases: no window ever holds
// more distinct subjects than the limit, and every booked send is admitted
// in the end.
func TestDistinctBookingsKeepTheLimit(t *testing.T) {
	for seed := range uint64(10) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			b := setup(t, true)
			rng := rand.New(rand.NewPCG(seed, 2626))
			limit := 1 + rng.IntN(5)
			window := time.Duration(300+rng.IntN(1500)) * time.Millisecond
			slack := time.Duration(rng.IntN(3)*40) * time.Millisecond
			horizon := time.Duration(rng.IntN(3)) * window / 4
			rule := throttle.Rule{Limit: limit, Window: window, Distinct: true}
			m := newDistinctModel(limit, (window + slack).Milliseconds())
			type pending struct {
				id, subject string
				at          int64
			}
			var waiting []pending
			ctx := context.Background()
			ask := func(id, s string) throttle.Decision {
				t.Helper()
				lim := throttle.Limit{Scope: "whatsapp:tenant", Distinct: s, Rule: rule}
				d, err := b.lim.Reserve(ctx, b.group, id, throttle.ReserveOptions{Slack: slack, Horizon: horizon, Book: true}, lim)
				if err != nil {
					t.Fatal(err)
				}
				switch {
				case d.Allowed:
					if rng.IntN(8) == 0 { // the send did not happen: its slot is given back
						if _, err := b.lim.Release(ctx, b.group, id, d.Attempt, lim); err != nil {
							t.Fatal(err)
						}
						break
					}
					m.sends[s] = append(m.sends[s], d.At.UnixMilli())
					if err := b.lim.MarkDone(ctx, b.group, id, d.Attempt, time.Hour); err != nil {
						t.Fatal(err)
					}
				case d.Booked:
					waiting = append(waiting, pending{id, s, d.At.UnixMilli()})
				default:
					t.Fatalf("%s: status %v", id, d.Status)
				}
				return d
			}
			for i := range 250 {
				b.clock.Add(time.Duration(rng.IntN(int(window.Milliseconds()/5)+1)) * time.Millisecond)
				now := b.clock.Now().UnixMilli()
				// Booked sends whose slot came (give or take) ask again.
				var still []pending
				for _, p := range waiting {
					if p.at-int64(rng.IntN(50)) <= now {
						ask(p.id, p.subject)
						continue
					}
					still = append(still, p)
				}
				waiting = still
				ask(fmt.Sprint("n", i), fmt.Sprintf("+1555%04d", rng.IntN(limit+6)))
			}
			for range 10_000 {
				if len(waiting) == 0 {
					break
				}
				p := waiting[0]
				waiting = waiting[1:]
				if now := b.clock.Now(); time.UnixMilli(p.at).After(now) {
					b.clock.Set(time.UnixMilli(p.at))
				}
				ask(p.id, p.subject)
			}
			if len(waiting) > 0 {
				t.Fatalf("%d booked sends never admitted", len(waiting))
			}
			if at, most := m.worst(); most > limit {
				t.Fatalf("%d distinct subjects in the window ending %d, limit %d", most, at, limit)
			}
		})
	}
}

// The rule's answers, step by step: a new subject past the limit is booked
// for the instant the oldest counted subject leaves, the next one for the
// next exit; a repeat to a counted subject goes at once although bookings
// wait (bookings are a queue, never presence), and the booking it overtook
// waits again; a repeat that would stretch its subject's presence into an
// instant a send admitted ahead fills must wait too.
func TestDistinctBookingsAndRepeats(t *testing.T) {
	b := setup(t, true)
	ctx := context.Background()
	t0 := b.clock.Now()
	rule := throttle.Rule{Limit: 2, Window: time.Second, Distinct: true}
	ask := func(at time.Duration, id, s string, horizon time.Duration) throttle.Decision {
		t.Helper()
		b.clock.Set(t0.Add(at))
		d, err := b.lim.Reserve(ctx, b.group, id, throttle.ReserveOptions{Book: true, Horizon: horizon},
			throttle.Limit{Scope: "whatsapp:tenant", Distinct: s, Rule: rule})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	want := func(d throttle.Decision, status throttle.Status, at time.Duration) {
		t.Helper()
		if d.Status != status || !d.At.Equal(t0.Add(at)) {
			t.Fatalf("status %v at %v, want %v at %v", d.Status, d.At.Sub(t0), status, at)
		}
	}
	want(ask(0, "a1", "a", 0), throttle.StatusAdmitted, 0)
	want(ask(100*time.Millisecond, "b1", "b", 0), throttle.StatusAdmitted, 100*time.Millisecond)
	want(ask(200*time.Millisecond, "c1", "c", 0), throttle.StatusBooked, 1001*time.Millisecond)  // a's exit
	want(ask(300*time.Millisecond, "d1", "d", 0), throttle.StatusBooked, 1101*time.Millisecond)  // b's exit
	want(ask(400*time.Millisecond, "a2", "a", 0), throttle.StatusAdmitted, 400*time.Millisecond) // a repeat: free
	// c's exit is gone (a stays until 1400): c, first in the queue, waits
	// again for the first exit now, b's; d, booked for it, takes it when it
	// asks first, and c waits for the next, a's.
	want(ask(1001*time.Millisecond, "c1", "c", 0), throttle.StatusBooked, 1101*time.Millisecond)
	want(ask(1101*time.Millisecond, "d1", "d", 0), throttle.StatusAdmitted, 1101*time.Millisecond)
	want(ask(1101*time.Millisecond, "c1", "c", 0), throttle.StatusBooked, 1401*time.Millisecond)
	want(ask(1401*time.Millisecond, "c1", "c", 0), throttle.StatusAdmitted, 1401*time.Millisecond)
	// A second send to a subject that waits joins its place: e waits for
	// d's exit (2102), and so does e's second send, not for the next.
	want(ask(1500*time.Millisecond, "e1", "e", 0), throttle.StatusBooked, 2102*time.Millisecond)
	want(ask(1600*time.Millisecond, "e2", "e", 0), throttle.StatusBooked, 2102*time.Millisecond)

	// Limit 1: u is admitted ahead, for a's exit; a's repeat before its exit
	// would keep it counted then, so it waits for u's exit.
	b.group += "-2"
	rule.Limit = 1
	t0 = t0.Add(time.Hour)
	want(ask(0, "a1", "a", 0), throttle.StatusAdmitted, 0)
	want(ask(600*time.Millisecond, "u1", "u", 500*time.Millisecond), throttle.StatusAdmitted, 1001*time.Millisecond)
	want(ask(700*time.Millisecond, "a2", "a", 500*time.Millisecond), throttle.StatusBooked, 2002*time.Millisecond)
}
