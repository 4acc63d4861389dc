package throttle_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/throttle"
)

// modelKey is one rule's window as the reference model sees it.
type modelKey struct {
	entries []int64 // scores, any order
	limit   int
	span    int64 // window + slack, ms
}

// fits is the definition, by brute force: one more entry at x keeps every
// span of k.span ms that contains x within k.limit. Sliding a span right
// until its start meets an entry or x loses nothing, so only spans starting
// at x or at an entry in [x−span, x] are counted.
func (k modelKey) fits(x int64) bool {
	starts := []int64{x}
	for _, e := range k.entries {
		if e >= x-k.span && e <= x {
			starts = append(starts, e)
		}
	}
	for _, s := range starts {
		n := 1 // the new entry at x
		for _, e := range k.entries {
			if e >= s && e <= s+k.span {
				n++
			}
		}
		if n > k.limit {
			return false
		}
	}
	return true
}

// modelSlot is the reference scheduler: the earliest x ≥ from, outside
// every closed interval, at which every key takes one more entry. Fitness
// only changes right after a blocked span ends (an entry's score + span + 1)
// or at a closed interval's end, so those are the only candidates.
func modelSlot(keys []modelKey, from int64, closed [][2]int64) int64 {
	cands := []int64{from}
	for _, k := range keys {
		for _, e := range k.entries {
			cands = append(cands, e+k.span+1)
		}
	}
	for _, c := range closed {
		cands = append(cands, c[1])
	}
	slices.Sort(cands)
next:
	for _, x := range cands {
		if x < from {
			continue
		}
		for _, c := range closed {
			if x >= c[0] && x < c[1] {
				continue next
			}
		}
		for _, k := range keys {
			if !k.fits(x) {
				continue next
			}
		}
		return x
	}
	panic("no slot: the largest candidate always fits")
}

// snapshot reads a key's entries (and their members) as Redis holds them.
func snapshot(t testing.TB, c redis.UniversalClient, key string) map[string]int64 {
	t.Helper()
	zs, err := c.ZRangeWithScores(ctx, key, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]int64, len(zs))
	for _, z := range zs {
		out[z.Member.(string)] = int64(z.Score)
	}
	return out
}

// verifySpacing checks a key's actual send times: any limit+1 of them span
// more than window (each may be up to slack after its slot; the slots keep
// window+slack apart, so the sends keep window apart).
func verifySpacing(t testing.TB, what string, times []int64, limit int, window int64) {
	t.Helper()
	s := slices.Clone(times)
	slices.Sort(s)
	for i := 0; i+limit < len(s); i++ {
		if s[i+limit]-s[i] <= window {
			t.Fatalf("%s: %d sends within %d ms (window %d ms): %v", what, limit+1, s[i+limit]-s[i], window, s[i:i+limit+1])
		}
	}
}

type simSend struct {
	id      string
	limits  []int // indexes into the trial's rules
	tmin    int64
	closed  [][2]int64
	slot    int64 // booked or admitted slot
	attempt int
}

type simRule struct {
	lim  throttle.Limit
	key  string
	sent []int64 // actual send times
}

// runModelTrial drives Reserve through a random workload on a manual clock —
// arrivals, early and late wake-ups, sends within the slack, quiet spans —
// and checks every slot against modelSlot and every window against the
// actual send times.
func runModelTrial(t *testing.T, c redis.UniversalClient, rng *rand.Rand, trial int) (checks, booked int) {
	clock := newManualClock()
	lim, err := throttle.New(c, throttle.Options{Secret: testSecret, Now: clock.Now, CompactMembers: trial%2 == 0})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	group := fmt.Sprintf("model-%d", trial)
	slack := time.Duration(rng.IntN(4)*100) * time.Millisecond
	opts := throttle.ReserveOptions{Slack: slack, Horizon: time.Duration(rng.IntN(3)) * time.Second, Book: true}
	// 2–3 recipients, each with 1–2 recipient rules, and 0–2 tenant rules: 1–4 rules per check.
	var rules []*simRule
	nr := 2 + rng.IntN(2)
	var perRecipient [][]int
	var tenant []int
	for r := 0; r < nr; r++ {
		var idx []int
		for j := 0; j < 1+rng.IntN(2); j++ {
			rule := throttle.Rule{Limit: 1 + rng.IntN(4), Window: time.Duration(1+rng.IntN(12)) * time.Second / 2}
			rules = append(rules, &simRule{lim: throttle.Limit{Scope: fmt.Sprintf("sms:r%d", j), Subject: fmt.Sprintf("+1415555%04d", r), Rule: rule}})
			idx = append(idx, len(rules)-1)
		}
		perRecipient = append(perRecipient, idx)
	}
	for j := 0; j < rng.IntN(3); j++ {
		rule := throttle.Rule{Limit: 2 + rng.IntN(6), Window: time.Duration(2+rng.IntN(8)) * time.Second}
		rules = append(rules, &simRule{lim: throttle.Limit{Scope: fmt.Sprintf("sms:t%d", j), Rule: rule}})
		tenant = append(tenant, len(rules)-1)
	}
	for _, r := range rules {
		r.key, err = lim.Key(group, r.lim)
		if err != nil {
			t.Fatal(err)
		}
	}
	start := clock.Now().UnixMilli()
	type event struct {
		at   int64
		send *simSend
		wake bool // a booked send waking (else an arrival, or a committed send going out)
		out  bool
	}
	var events []event
	for i := 0; i < 25+rng.IntN(30); i++ {
		r := rng.IntN(nr)
		s := &simSend{id: fmt.Sprintf("n%d-%d", trial, i), limits: append(append([]int(nil), perRecipient[r]...), tenant...)}
		at := start + int64(rng.IntN(20000))
		if rng.IntN(6) == 0 { // a quiet span ahead of some sends
			q0 := at + int64(rng.IntN(3000))
			s.closed = [][2]int64{{q0, q0 + 1000 + int64(rng.IntN(5000))}}
		}
		if rng.IntN(8) == 0 {
			s.tmin = at + int64(rng.IntN(4000))
		}
		events = append(events, event{at: at, send: s})
	}
	for len(events) > 0 {
		sort.SliceStable(events, func(i, j int) bool { return events[i].at < events[j].at })
		ev := events[0]
		events = events[1:]
		clock.Set(time.UnixMilli(ev.at))
		s := ev.send
		if ev.out { // a send admitted for a later instant goes out, up to slack late
			for _, i := range s.limits {
				rules[i].sent = append(rules[i].sent, ev.at)
			}
			continue
		}
		limits := make([]throttle.Limit, len(s.limits))
		var mkeys []modelKey
		stored := map[string]bool{}
		for j, i := range s.limits {
			limits[j] = rules[i].lim
		}
		// The model sees every entry but this send's own booking, which the
		// script takes back before placing it again.
		own := ""
		if ev.wake {
			own = ownMember(trial%2 == 0, s)
		}
		for _, i := range s.limits {
			var es []int64
			for m, sc := range snapshot(t, c, rules[i].key) {
				stored[m] = true
				if m == own {
					continue
				}
				if sc < ev.at-(rules[i].lim.Rule.Window+slack).Milliseconds() {
					continue // trimmed by the script before it looks
				}
				es = append(es, sc)
			}
			mkeys = append(mkeys, modelKey{entries: es, limit: rules[i].lim.Rule.Limit, span: (rules[i].lim.Rule.Window + slack).Milliseconds()})
		}
		if ev.wake && !stored[own] {
			t.Fatalf("trial %d: %s woke but holds no booking", trial, s.id)
		}
		o := opts
		if s.tmin > 0 {
			o.NotBefore = time.UnixMilli(s.tmin)
		}
		for _, q := range s.closed {
			o.Closed = append(o.Closed, throttle.Interval{Start: time.UnixMilli(q[0]), End: time.UnixMilli(q[1])})
		}
		d, err := lim.Reserve(ctx, group, s.id, o, limits...)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		checks++
		want := modelSlot(mkeys, max(ev.at, s.tmin), s.closed)
		if got := d.At.UnixMilli(); got != want {
			t.Fatalf("trial %d, %s at +%d ms (%s, wake=%v): slot +%d ms, the model says +%d ms\nrules %v\nentries %v",
				trial, s.id, ev.at-start, d.Status, ev.wake, got-start, want-start, limits, mkeys)
		}
		s.attempt = d.Attempt
		s.slot = d.At.UnixMilli()
		late := int64(0)
		if slack > 0 {
			late = rng.Int64N(slack.Milliseconds() + 1)
		}
		switch d.Status {
		case throttle.StatusAdmitted:
			if d.Wait == 0 {
				for _, i := range s.limits {
					rules[i].sent = append(rules[i].sent, ev.at+late)
				}
			} else {
				events = append(events, event{at: s.slot + late, send: s, out: true})
			}
		case throttle.StatusBooked:
			booked++
			// Woken by a coarse scheduler: up to a second early or up to slack late.
			at := s.slot - int64(rng.IntN(1000)) + late
			if rng.IntN(2) == 0 {
				at = s.slot + late
			}
			events = append(events, event{at: max(at, ev.at+1), send: s, wake: true})
		default:
			t.Fatalf("trial %d: unexpected %s", trial, d.Status)
		}
	}
	for _, r := range rules {
		verifySpacing(t, fmt.Sprintf("trial %d %s", trial, r.lim), r.sent, r.lim.Rule.Limit, r.lim.Rule.Window.Milliseconds())
	}
	return checks, booked
}

// ownMember is the member a send's booking is stored as.
func ownMember(compact bool, s *simSend) string {
	m := s.id
	if compact {
		m = compactMember(s.id)
	}
	if s.attempt > 1 {
		m += fmt.Sprintf("#%d", s.attempt)
	}
	return m
}

// The script's slot equals the reference scheduler's earliest valid slot,
// through arrivals, bookings, early and late wake-ups and quiet spans, with
// 1–4 rules per check; replaying the actual send times breaks no window.
func TestReserveMatchesModel(t *testing.T) {
	t.Parallel()
	_, c := setupRedis(t)
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 15))
	checks, booked := 0, 0
	for trial := 0; trial < 120; trial++ {
		c1, b1 := runModelTrial(t, c, rng, trial)
		checks, booked = checks+c1, booked+b1
	}
	if booked < checks/10 {
		t.Fatalf("only %d of %d checks booked: the workload does not exercise bookings", booked, checks)
	}
	t.Logf("%d checks, %d bookings, all slots equal to the model's", checks, booked)
}

// Past the entries the script reads ahead (limit + 64), a gap is not looked
// for: the slot goes after the key's end. It is never earlier than the
// model's slot, and it fits.
func TestReserveLongQueueFallsBackSafely(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 2, Window: 10 * time.Second})
	o := throttle.ReserveOptions{Book: true}
	for i := 0; i < 300; i++ {
		if _, err := b.lim.Reserve(ctx, b.group, fmt.Sprintf("q%d", i), o, lim); err != nil {
			t.Fatal(err)
		}
	}
	// Open a gap far ahead (bookings 200 and 201, about 1,000 s out) and one near (4 and 5).
	for _, i := range []int{200, 201} {
		b.lim.Release(ctx, b.group, fmt.Sprintf("q%d", i), 1, lim)
	}
	key := b.key(t, lim)
	entries := func() modelKey {
		var es []int64
		for _, sc := range snapshot(t, b.client, key) {
			es = append(es, sc)
		}
		return modelKey{entries: es, limit: 2, span: 10_000}
	}
	now := b.clock.Now().UnixMilli()
	mk := entries()
	want := modelSlot([]modelKey{mk}, now, nil)
	d, err := b.lim.Reserve(ctx, b.group, "late", o, lim)
	if err != nil {
		t.Fatal(err)
	}
	got := d.At.UnixMilli()
	if got < want || !mk.fits(got) {
		t.Fatalf("slot +%d ms, model +%d ms; fits=%v", got-now, want-now, mk.fits(got))
	}
	t.Logf("gap %d s ahead, past the lookahead: the model finds it, the script books after the queue (+%d s)", (want-now)/1000, (got-now)/1000)
	// A gap within the lookahead is found exactly.
	for _, i := range []int{4, 5} {
		b.lim.Release(ctx, b.group, fmt.Sprintf("q%d", i), 1, lim)
	}
	mk = entries()
	want = modelSlot([]modelKey{mk}, now, nil)
	if d, _ := b.lim.Reserve(ctx, b.group, "near", o, lim); d.At.UnixMilli() != want {
		t.Fatalf("near gap: slot +%d ms, model +%d ms", d.At.UnixMilli()-now, want-now)
	}
}
