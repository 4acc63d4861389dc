package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/throttle"
)

// The cross-slot reservation (a check whose rules live in several groups,
// so several slots of a Cluster) against the brute-force limiter of
// model_test.go: random rules in random groups, quiet spans and earliest
// slots, one checker (every slot equal to the model's earliest common slot)
// or several at once, with calls failed before they reach Redis between the
// parts. After every wave, Redis holds exactly what the answers say: every
// admitted or booked send at its slot in each of its windows, nothing of a
// check that failed or was denied; and no window, over the whole run, ever
// holds more than its limit.
func TestReserveAcrossMatchesModel(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	cl, _ := redistest.NewCluster(t, 3, 0)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SLUICE_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (SLUICE_SEED=%[1]d repeats this run)", seed)
	rng := rand.New(rand.NewPCG(seed, 52))
	var st acrossStats
	for trial := range 12 {
		runAcrossTrial(t, cl.Addrs, rng, trial, &st)
		if t.Failed() {
			return
		}
	}
	// The run must have exercised what it claims to.
	if st.exact == 0 || st.concurrent == 0 || st.failed == 0 || st.booked == 0 || st.moved == 0 {
		t.Fatalf("a thin run: %+v", st)
	}
	t.Logf("%+v", st)
}

// acrossStats counts what a run of runAcrossTrial did.
type acrossStats struct {
	exact, concurrent int64 // checks compared with the model's slot; checks made side by side
	booked            int64 // answered booked
	failed            int64 // answered with the injected failure
	moved             int64 // slots later than the check's first possible instant
	noAgreement       int64 // ErrNoAgreement (nothing left: checked like a failure)
}

// acrossRule is one rule of a trial and the slots it gave out.
type acrossRule struct {
	lim   throttle.Limit // Group "" lives in the check's own group
	own   bool
	slots map[string]map[string]int64 // key → member → slot
}

// acrossCheck is one check's question and answer.
type acrossCheck struct {
	id     string
	group  string
	keys   []string
	rules  []*acrossRule
	tmin   int64
	closed [][2]int64
	hz     time.Duration
	d      throttle.Decision
	err    error
}

func runAcrossTrial(t *testing.T, addrs []string, rng *rand.Rand, trial int, st *acrossStats) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer cc.Close()
	inject := &failForward{rng: rand.New(rand.NewPCG(rng.Uint64(), 1))}
	if trial%2 == 1 {
		inject.p = 0.12
	}
	cc.AddHook(inject)
	clock := newManualClock()
	lim, err := throttle.New(cc, throttle.Options{Secret: testSecret, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	slack := time.Duration(rng.IntN(3)*100) * time.Millisecond
	span := func(r *acrossRule) int64 { return (r.lim.Rule.Window + slack).Milliseconds() }
	tenants := []string{fmt.Sprintf("x%d-acme", trial), fmt.Sprintf("x%d-globex", trial)}
	shared := []string{fmt.Sprintf("~x%d-s0", trial), fmt.Sprintf("~x%d-s1", trial), tenants[1]}
	// Rules of the check's own group (per recipient) and rules that live
	// in other groups (a sender or provider shared by tenants; globex's
	// tenant rule, which acme's checks count too).
	var own, other []*acrossRule
	for r := range 3 {
		own = append(own, &acrossRule{own: true, lim: throttle.Limit{Scope: "sms:recipient", Subject: fmt.Sprintf("+1415555%04d", r),
			Rule: throttle.Rule{Limit: 1 + rng.IntN(3), Window: time.Duration(2+rng.IntN(8)) * time.Second / 2}}})
	}
	for r := range 3 + rng.IntN(2) {
		other = append(other, &acrossRule{lim: throttle.Limit{Scope: fmt.Sprintf("sms:s%d", r), Subject: "+15005550006", Group: shared[rng.IntN(len(shared))],
			Rule: throttle.Rule{Limit: 1 + rng.IntN(4), Window: time.Duration(2+rng.IntN(10)) * time.Second / 2}}})
	}
	other[0].lim.Group = shared[0] // in no tenant's group: every check has a rule elsewhere
	for _, r := range slices.Concat(own, other) {
		r.slots = map[string]map[string]int64{}
	}
	keyOf := func(group string, r *acrossRule) string {
		k, err := lim.Key(group, r.lim)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	newCheck := func(id string, now int64) *acrossCheck {
		c := &acrossCheck{id: id, group: tenants[rng.IntN(2)], hz: time.Duration(rng.IntN(3)) * time.Second / 2}
		c.rules = append(c.rules, own[rng.IntN(len(own))])
		for _, r := range other {
			if rng.IntN(2) == 0 && r.lim.Group != c.group {
				c.rules = append(c.rules, r)
			}
		}
		if len(c.rules) == 1 { // at least one rule in another group
			for _, r := range other {
				if r.lim.Group != c.group {
					c.rules = append(c.rules, r)
					break
				}
			}
		}
		for _, r := range c.rules {
			c.keys = append(c.keys, keyOf(c.group, r))
		}
		if rng.IntN(6) == 0 {
			q0 := now + int64(rng.IntN(2000))
			c.closed = [][2]int64{{q0, q0 + 500 + int64(rng.IntN(3000))}}
		}
		if rng.IntN(6) == 0 {
			c.tmin = now + int64(rng.IntN(3000))
		}
		return c
	}
	reserve := func(c *acrossCheck) {
		o := throttle.ReserveOptions{Slack: slack, Horizon: c.hz, Book: true}
		if c.tmin > 0 {
			o.NotBefore = time.UnixMilli(c.tmin)
		}
		for _, q := range c.closed {
			o.Closed = append(o.Closed, throttle.Interval{Start: time.UnixMilli(q[0]), End: time.UnixMilli(q[1])})
		}
		limits := make([]throttle.Limit, len(c.rules))
		for i, r := range c.rules {
			limits[i] = r.lim
		}
		c.d, c.err = lim.Reserve(ctx, c.group, c.id, o, limits...)
	}
	// record keeps what an answer gave out, and counts it.
	record := func(c *acrossCheck, now int64) {
		switch {
		case errors.Is(c.err, errInjected):
			st.failed++
			return
		case errors.Is(c.err, throttle.ErrNoAgreement):
			st.noAgreement++
			return
		case c.err != nil:
			t.Errorf("trial %d, %s: %v", trial, c.id, c.err)
			return
		}
		switch c.d.Status {
		case throttle.StatusBooked:
			st.booked++
		case throttle.StatusAdmitted:
		default:
			t.Errorf("trial %d, %s: %s, want admitted or booked", trial, c.id, c.d.Status)
			return
		}
		if c.d.At.UnixMilli() > firstAim(now, c.tmin) {
			st.moved++
		}
		for i, r := range c.rules {
			if r.slots[c.keys[i]] == nil {
				r.slots[c.keys[i]] = map[string]int64{}
			}
			r.slots[c.keys[i]][c.id] = c.d.At.UnixMilli()
		}
	}
	now := clock.Now().UnixMilli()
	for wave := range 12 {
		now += int64(rng.IntN(2500))
		clock.Set(time.UnixMilli(now))
		if trial%4 < 2 {
			// One checker: each slot is the model's earliest common slot.
			for i := range 2 + rng.IntN(4) {
				c := newCheck(fmt.Sprintf("x%d-%d-%d", trial, wave, i), now)
				var mkeys []modelKey
				for i, r := range c.rules {
					var es []int64
					for _, s := range r.slots[c.keys[i]] {
						if s >= now-span(r) {
							es = append(es, s)
						}
					}
					mkeys = append(mkeys, modelKey{entries: es, limit: r.lim.Rule.Limit, span: span(r)})
				}
				reserve(c)
				record(c, now)
				if c.err != nil {
					continue
				}
				st.exact++
				if want := modelSlot(mkeys, firstAim(now, c.tmin), c.closed); c.d.At.UnixMilli() != want {
					t.Fatalf("trial %d, %s (%s): slot +%d ms, the model says +%d ms\nrules %v\nclosed %v, not before %v\nentries %v",
						trial, c.id, c.d.Status, c.d.At.UnixMilli()-now, want-now, c.keys, c.closed, c.tmin, mkeys)
				}
			}
		} else {
			// Several checkers at once, on the same instant.
			var checks []*acrossCheck
			for i := range 4 + rng.IntN(9) {
				checks = append(checks, newCheck(fmt.Sprintf("x%d-%d-%d", trial, wave, i), now))
			}
			var wg sync.WaitGroup
			for _, c := range checks {
				wg.Go(func() { reserve(c) })
			}
			wg.Wait()
			for _, c := range checks {
				record(c, now)
			}
			st.concurrent += int64(len(checks))
		}
		// Redis holds what the answers gave out, and nothing else.
		for _, r := range slices.Concat(own, other) {
			for _, g := range tenants {
				k := keyOf(g, r)
				have := snapshot(t, cc, k)
				for m, s := range have {
					if want, ok := r.slots[k][m]; !ok || want != s {
						t.Fatalf("trial %d, wave %d: %s holds %s at %d; the answers gave it %d (given: %v)", trial, wave, k, m, s, want, ok)
					}
				}
				for m, s := range r.slots[k] {
					if _, ok := have[m]; !ok && s >= now-span(r) {
						t.Fatalf("trial %d, wave %d: %s lacks %s, admitted or booked at %d", trial, wave, k, m, s)
					}
				}
			}
		}
	}
	// No window over its limit, over the whole run.
	for _, r := range slices.Concat(own, other) {
		for k, ms := range r.slots {
			s := slices.Sorted(maps.Values(ms))
			for i := 0; i+r.lim.Rule.Limit < len(s); i++ {
				if s[i+r.lim.Rule.Limit]-s[i] <= span(r) {
					t.Fatalf("trial %d: %s (%s): %d slots within %d ms: %v", trial, k, r.lim.Rule, r.lim.Rule.Limit+1, span(r), s[i:i+r.lim.Rule.Limit+1])
				}
			}
		}
	}
}

// firstAim is where a check across groups aims first: the earliest slot
// asked for, else 20 ms (agreeLead) past now, so that the last group can
// still admit that instant.
func firstAim(now, tmin int64) int64 {
	if tmin > 0 {
		return tmin
	}
	return now + 20
}

var errInjected = errors.New("injected: the call never reached Redis")

// failForward fails, before it is sent and with chance p, a call of the
// limiter's library (or a pipeline of them) that carries only forward
// parts of a check — state reads (S), placements (P), reservations (R) —
// never one that gives a reservation back (X): what the test checks is
// that a failed part leaves nothing, which a lost give-back could not.
type failForward struct {
	mu  sync.Mutex
	rng *rand.Rand
	p   float64
}

func (f *failForward) roll() bool {
	if f.p == 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rng.Float64() < f.p
}

func (f *failForward) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *failForward) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if forwardOnly(cmd) && f.roll() {
			cmd.SetErr(errInjected)
			return errInjected
		}
		return next(ctx, cmd)
	}
}

func (f *failForward) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if !forwardOnly(c) {
				return next(ctx, cmds)
			}
		}
		if !f.roll() {
			return next(ctx, cmds)
		}
		for _, c := range cmds {
			c.SetErr(errInjected)
		}
		return errInjected
	}
}

// forwardOnly reports whether cmd is a call of the limiter's library whose
// every operation is S, P or R (batch.go's encoding: now, the number of
// calls, then per call its code, key count, argument count and arguments).
func forwardOnly(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 3 {
		return false
	}
	switch strings.ToLower(fmt.Sprint(args[0])) {
	case "fcall", "evalsha", "eval":
	default:
		return false
	}
	num := func(v any) int { n, _ := strconv.Atoi(fmt.Sprint(v)); return n }
	argv := args[3+num(args[2]):]
	if len(argv) < 2 {
		return false
	}
	calls := num(argv[1])
	i := 2
	for range calls {
		if i+2 >= len(argv) {
			return false
		}
		switch fmt.Sprint(argv[i]) {
		case "S", "P", "R":
		default:
			return false
		}
		i += 3 + num(argv[i+2])
	}
	return calls > 0
}
