package throttle_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

// The reference model of counter rules (calendar and bucketed) next to the
// log, by brute force over the slots the model itself holds: the script's
// hashes keep counts, not members, so the model keeps the members.

type cmRule struct {
	lim     throttle.Limit
	entries map[string]int64 // member → slot
	sent    []int64          // actual send times
}

// span is the rule's window + slack in ms.
func (r *cmRule) span(slack time.Duration) int64 { return (r.lim.Rule.Window + slack).Milliseconds() }

// fits: one more entry at x keeps the rule.
func (r *cmRule) fits(x int64, slack time.Duration) bool {
	rule := r.lim.Rule
	switch {
	case rule.Calendar != "":
		loc, _ := rule.Location()
		s := throttle.PeriodStart(time.UnixMilli(x), rule.Calendar, loc).UnixMilli()
		e := throttle.NextPeriod(time.UnixMilli(x), rule.Calendar, loc).UnixMilli()
		if x+slack.Milliseconds() >= e {
			return false
		}
		n := 1
		for _, v := range r.entries {
			if v >= s && v < e {
				n++
			}
		}
		return n <= rule.Limit
	case rule.Buckets > 0:
		w := rule.BucketLen().Milliseconds()
		sp := r.span(slack)
		m := (sp + w - 1) / w
		k := floorDiv(x, w)
		for j := k - m; j <= k; j++ {
			n := 1
			for _, v := range r.entries {
				if b := floorDiv(v, w); b >= j && b <= j+m {
					n++
				}
			}
			if n > rule.Limit {
				return false
			}
		}
		return true
	}
	return r.logKey(r.span(slack)).fits(x)
}

func (r *cmRule) logKey(span int64) modelKey {
	es := make([]int64, 0, len(r.entries))
	for _, v := range r.entries {
		es = append(es, v)
	}
	return modelKey{entries: es, limit: r.lim.Rule.Limit, span: span}
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// cmSlot: the earliest x ≥ from outside closed at which every rule fits.
// Fitness changes only at: an entry's span end (logs), a bucket start, a
// period start, a closed interval's end.
func cmSlot(rules []*cmRule, from int64, closed [][2]int64, slack time.Duration) int64 {
	cands := []int64{from}
	var top int64 = from
	for _, r := range rules {
		for _, v := range r.entries {
			cands = append(cands, v+r.span(slack)+1)
			top = max(top, v)
		}
	}
	for _, c := range closed {
		cands = append(cands, c[1])
		top = max(top, c[1])
	}
	for _, r := range rules {
		rule := r.lim.Rule
		switch {
		case rule.Calendar != "":
			loc, _ := rule.Location()
			end := time.UnixMilli(top).Add(2 * rule.Window)
			for t := throttle.NextPeriod(time.UnixMilli(from), rule.Calendar, loc); !t.After(end); t = throttle.NextPeriod(t, rule.Calendar, loc) {
				cands = append(cands, t.UnixMilli())
			}
		case rule.Buckets > 0:
			w := rule.BucketLen().Milliseconds()
			for k := floorDiv(from, w) + 1; k*w <= top+r.span(slack)+3*w; k++ {
				cands = append(cands, k*w)
			}
		}
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
		for _, r := range rules {
			if !r.fits(x, slack) {
				continue next
			}
		}
		return x
	}
	panic("no slot")
}

// Zones whose days the calendar trials cross a DST change in (the trial
// starts a day before it), and one with a half-hour offset.
var dstStarts = []struct {
	zone string
	at   string // local midnight a day before a change
}{
	{"America/New_York", "2026-03-07"}, {"America/New_York", "2026-10-31"},
	{"Europe/London", "2026-03-28"}, {"Europe/London", "2026-10-24"},
	{"America/Los_Angeles", "2026-03-07"}, {"Asia/Kolkata", "2026-03-07"}, {"", "2026-02-27"},
}

// runCounterTrial drives Reserve and Release through a random workload of
// calendar (kind 1) or bucketed-and-log rules (kind 0) and checks every slot
// against cmSlot. A bucketed rule's slot also lies between the exact log's
// (never earlier: it never admits what the log would not) and that of a log
// one bucket wider than its window + slack rounded up to buckets (the
// stated under-admission bound). Replayed sends keep every exact window and
// every calendar period.
func runCounterTrial(t *testing.T, c redis.UniversalClient, rng *rand.Rand, trial int) (checks, booked, released int) {
	clock := newManualClock()
	kind := trial % 2
	var zoneName string
	var period throttle.Period
	if kind == 1 {
		ds := dstStarts[rng.IntN(len(dstStarts))]
		zoneName = ds.zone
		loc := time.UTC
		if zoneName != "" {
			loc, _ = time.LoadLocation(zoneName)
		}
		day, _ := time.ParseInLocation("2006-01-02", ds.at, loc)
		period = []throttle.Period{throttle.Minute, throttle.Hour, throttle.Day, throttle.Day, throttle.Week}[rng.IntN(5)]
		start := day
		if period == throttle.Minute || period == throttle.Hour {
			start = day.Add(24*time.Hour + time.Duration(rng.IntN(4))*time.Hour) // around the change's hours
		}
		clock.Set(start.Add(-time.Duration(rng.IntN(3600)) * time.Second))
	}
	lim, err := throttle.New(c, throttle.Options{Secret: testSecret, Now: clock.Now, CompactMembers: trial%4 < 2})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	group := fmt.Sprintf("cmodel-%d-%d", trial, rng.Int64())
	slack := time.Duration(rng.IntN(4)*100) * time.Millisecond
	opts := throttle.ReserveOptions{Slack: slack, Horizon: time.Duration(rng.IntN(3)) * time.Second, Book: true}
	var rules []*cmRule
	var unit time.Duration
	nr := 1 + rng.IntN(3)
	for j := range nr {
		var rule throttle.Rule
		if kind == 1 {
			rule = throttle.PerCalendar(1+rng.IntN(4), period, zoneName)
			if j == 1 { // a log beside it
				rule = throttle.Rule{Limit: 1 + rng.IntN(3), Window: period.Nominal() / time.Duration(2+rng.IntN(4))}
			}
			unit = period.Nominal()
		} else {
			rule = throttle.Rule{Limit: 1 + rng.IntN(8), Window: time.Duration(1+rng.IntN(12)) * time.Second / 2}
			if j != 1 {
				rule.Buckets = 2 + rng.IntN(7)
			}
			unit = 10 * time.Second
		}
		rules = append(rules, &cmRule{lim: throttle.Limit{Scope: fmt.Sprintf("sms:c%d", j), Rule: rule}, entries: map[string]int64{}})
	}
	limits := make([]throttle.Limit, len(rules))
	for i, r := range rules {
		limits[i] = r.lim
	}
	start := clock.Now().UnixMilli()
	type event struct {
		at   int64
		send *simSend
		wake bool
		out  bool
	}
	var events []event
	span := 3 * unit.Milliseconds()
	for i := range 10 + rng.IntN(20) {
		s := &simSend{id: fmt.Sprintf("c%d-%d", trial, i)}
		at := start + rng.Int64N(span)
		if rng.IntN(6) == 0 {
			q0 := at + rng.Int64N(unit.Milliseconds()/4+1)
			s.closed = [][2]int64{{q0, q0 + 1000 + rng.Int64N(unit.Milliseconds()/2+1)}}
		}
		if rng.IntN(8) == 0 {
			s.tmin = at + rng.Int64N(unit.Milliseconds()/2+1)
		}
		events = append(events, event{at: at, send: s})
	}
	own := func(s *simSend) string {
		if s.attempt > 1 {
			return fmt.Sprintf("%s#%d", s.id, s.attempt)
		}
		return s.id
	}
	for len(events) > 0 {
		sort.SliceStable(events, func(i, j int) bool { return events[i].at < events[j].at })
		ev := events[0]
		events = events[1:]
		clock.Set(time.UnixMilli(ev.at))
		s := ev.send
		if ev.out {
			for _, r := range rules {
				r.sent = append(r.sent, ev.at)
			}
			continue
		}
		if ev.wake {
			for _, r := range rules {
				if _, ok := r.entries[own(s)]; !ok {
					t.Fatalf("trial %d: %s woke but the model holds no booking", trial, s.id)
				}
				delete(r.entries, own(s))
			}
		}
		o := opts
		if s.tmin > 0 {
			o.NotBefore = time.UnixMilli(s.tmin)
		}
		for _, q := range s.closed {
			o.Closed = append(o.Closed, throttle.Interval{Start: time.UnixMilli(q[0]), End: time.UnixMilli(q[1])})
		}
		from := max(ev.at, s.tmin)
		want := cmSlot(rules, from, s.closed, slack)
		d, err := lim.Reserve(ctx, group, s.id, o, limits...)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		checks++
		if got := d.At.UnixMilli(); got != want {
			t.Fatalf("trial %d (%s %s), %s at %s (%s, wake=%v): slot %s, the model says %s\nrules %v",
				trial, zoneName, period, s.id, time.UnixMilli(ev.at).UTC().Format(time.RFC3339Nano), d.Status, ev.wake,
				d.At.UTC().Format(time.RFC3339Nano), time.UnixMilli(want).UTC().Format(time.RFC3339Nano), limits)
		}
		for _, r := range rules {
			if r.lim.Rule.Buckets == 0 {
				continue
			}
			// Alone, this rule's slot is never before the exact log's nor after the wider log's.
			w := r.lim.Rule.BucketLen().Milliseconds()
			sp := r.span(slack)
			wide := ((sp+w-1)/w)*w + w
			alone := cmSlot([]*cmRule{r}, from, s.closed, slack)
			exact := modelSlot([]modelKey{r.logKey(sp)}, from, s.closed)
			bound := modelSlot([]modelKey{r.logKey(wide)}, from, s.closed)
			if alone < exact || alone > bound {
				t.Fatalf("trial %d: %v alone: slot +%d, exact log +%d, log of %d ms +%d", trial, r.lim, alone-start, exact-start, wide, bound-start)
			}
		}
		s.attempt = d.Attempt
		s.slot = d.At.UnixMilli()
		for _, r := range rules {
			r.entries[own(s)] = s.slot
		}
		late := int64(0)
		if slack > 0 {
			late = rng.Int64N(slack.Milliseconds() + 1)
		}
		if rng.IntN(7) == 0 { // a definite non-send: the slot goes back
			n, err := lim.Release(ctx, group, s.id, s.attempt, limits...)
			if err != nil || n != len(rules) {
				t.Fatalf("trial %d: release %s: %d, %v", trial, s.id, n, err)
			}
			for _, r := range rules {
				delete(r.entries, own(s))
			}
			s.attempt = 0
			released++
			continue
		}
		switch d.Status {
		case throttle.StatusAdmitted:
			if d.Wait == 0 {
				for _, r := range rules {
					r.sent = append(r.sent, ev.at+late)
				}
			} else {
				events = append(events, event{at: s.slot + late, send: s, out: true})
			}
		case throttle.StatusBooked:
			booked++
			at := s.slot - rng.Int64N(1000) + late
			if rng.IntN(2) == 0 {
				at = s.slot + late
			}
			events = append(events, event{at: max(at, ev.at+1), send: s, wake: true})
		default:
			t.Fatalf("trial %d: unexpected %s", trial, d.Status)
		}
	}
	for _, r := range rules {
		rule := r.lim.Rule
		if rule.Calendar == "" {
			verifySpacing(t, fmt.Sprintf("trial %d %s", trial, r.lim), r.sent, rule.Limit, rule.Window.Milliseconds())
			continue
		}
		loc, _ := rule.Location()
		per := map[int64]int{}
		for _, x := range r.sent {
			p := throttle.PeriodStart(time.UnixMilli(x), rule.Calendar, loc).UnixMilli()
			if per[p]++; per[p] > rule.Limit {
				t.Fatalf("trial %d %s: %d sends in the period from %s", trial, r.lim, per[p], time.UnixMilli(p).In(loc))
			}
		}
	}
	return checks, booked, released
}

func runCounterModel(t *testing.T, c redis.UniversalClient, trials int) {
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 22))
	checks, booked, released := 0, 0, 0
	for trial := range trials {
		c1, b1, r1 := runCounterTrial(t, c, rng, trial)
		checks, booked, released = checks+c1, booked+b1, released+r1
	}
	if booked < checks/10 || released == 0 {
		t.Fatalf("%d checks, %d bookings, %d releases: the workload does not exercise bookings and releases", checks, booked, released)
	}
	t.Logf("seed %d: %d checks, %d bookings, %d releases, every slot the model's", seed, checks, booked, released)
}

// Calendar and bucketed rules, with a log beside them: the script's slot is
// the reference scheduler's through arrivals, bookings, early and late
// wake-ups, releases, quiet spans and DST changes.
func TestCounterRulesMatchModel(t *testing.T) {
	t.Parallel()
	_, c := setupRedis(t)
	runCounterModel(t, c, 160)
}

// The same on a 3-master Cluster (each check's keys in its group's slot).
func TestCounterRulesMatchModelCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Cluster")
	}
	t.Parallel()
	_, cc := redistest.NewCluster(t, 3, 0)
	runCounterModel(t, cc, 60)
}
