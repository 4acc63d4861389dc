package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/throttle"
)

// The throttled section measures what a throttled system spends its time
// on — the calls of a backlog rather than of an idle system — against
// redis_rate's denial in the same run (redis_rate has no booking: its
// denial is all a GCRA caller pays while throttled):
//
//   - denied: Allow on a full window (100 entries spread over the last
//     30 s of a 100/min rule, 2,000 recipients): the earliest-fit search
//     says when the entry that must leave has left;
//   - booking: Reserve{Book} of a fresh id on the same full windows (the
//     worker's options: slack 100 ms, at-least-once), each booking adding
//     to the recipient's queue;
//   - wake: the booked id asking again once its slot has come (the worker's
//     wake-and-admit): it takes its booking back and is admitted now;
//   - mixed: one throttled message's limiter calls in turn — its booking,
//     its wake-and-admit, its done record (MarkDone).
//
// Every scenario gets an emptied Redis and its own setup before its timed
// run; peers are interleaved A B C … C B A over the rounds.

// throttledRule is the full windows' rule: the check section's.
var throttledRule = throttle.Rule{Limit: 100, Window: time.Minute}

const throttledRecipients = 2000

func fullSubject(i int64) string {
	return "+1417" + strconv.FormatInt(5_000_000+i%throttledRecipients, 10)
}

func fullLimit(i int64) throttle.Limit {
	return throttle.Limit{Scope: "sms:recipient", Subject: fullSubject(i), Rule: throttledRule}
}

// bookOpts are the worker's options for a booked backlog.
var bookOpts = throttle.ReserveOptions{Policy: throttle.AtLeastOnce, Slack: 100 * time.Millisecond, Book: true}

// fillWindows writes limit entries into every recipient's window, scored
// over the last 30 s (so a denial's slot is up to 30 s ahead).
func fillWindows(ctx context.Context, rdb *redis.Client, lim *throttle.Limiter) {
	now := time.Now().UnixMilli()
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for r := int64(0); r < throttledRecipients; r++ {
			key, err := lim.Key("bench", fullLimit(r))
			if err != nil {
				return err
			}
			zs := make([]redis.Z, throttledRule.Limit)
			for j := range zs {
				zs[j] = redis.Z{Score: float64(now - 30_000 + int64(j)*300 + r%300), Member: fmt.Sprintf("p%d", j)}
			}
			p.ZAdd(ctx, key, zs...)
			p.PExpire(ctx, key, 2*time.Minute)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// fillRate exhausts redis_rate's allowance for every recipient (100/h: GCRA frees one every
// 36 s, so nothing is admitted during a run; its denial costs the same at any rate).
func fillRate(ctx context.Context, rl *redis_rate.Limiter) {
	for r := int64(0); r < throttledRecipients; r++ {
		if _, err := rl.AllowN(ctx, fullSubject(r), redis_rate.PerHour(throttledRule.Limit), throttledRule.Limit); err != nil {
			log.Fatal(err)
		}
	}
}

// wakePool books ids whose slots have come: a limiter on a clock 70 s
// behind fills each recipient's window and books a window's worth of ids
// behind it; on the real clock those slots are 10–11 s past, and each id
// asking again is admitted now (its booking taken back).
type wakePool struct {
	ids  []wakeID
	next atomic.Int64
}

type wakeID struct {
	id  string
	lim throttle.Limit
}

func newWakePool(ctx context.Context, rdb *redis.Client, n int) *wakePool {
	behind := newLimiter(rdb, throttle.Options{Now: func() time.Time { return time.Now().Add(-70 * time.Second) }})
	defer behind.Close()
	recipients := (n + throttledRule.Limit - 1) / throttledRule.Limit
	fake := time.Now().Add(-70 * time.Second).UnixMilli()
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for r := 0; r < recipients; r++ {
			key, _ := behind.Key("bench", wakeLimit(r))
			zs := make([]redis.Z, throttledRule.Limit)
			for j := range zs {
				zs[j] = redis.Z{Score: float64(fake - 1000 + int64(j)*10), Member: fmt.Sprintf("p%d", j)}
			}
			p.ZAdd(ctx, key, zs...)
			p.PExpire(ctx, key, 2*time.Minute)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	pool := &wakePool{ids: make([]wakeID, n)}
	var wg sync.WaitGroup
	var k atomic.Int64
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(k.Add(1) - 1)
				if i >= n {
					return
				}
				w := wakeID{id: "w" + strconv.Itoa(i) + "-" + strconv.FormatInt(memberSeq.Add(1), 36), lim: wakeLimit(i % recipients)}
				d, err := behind.Reserve(ctx, "bench", w.id, bookOpts, w.lim)
				if err != nil {
					log.Fatal(err)
				}
				if d.Status != throttle.StatusBooked {
					log.Fatalf("wake pool: %s, want booked", d.Status)
				}
				pool.ids[i] = w
			}
		}()
	}
	wg.Wait()
	return pool
}

func wakeLimit(r int) throttle.Limit {
	return throttle.Limit{Scope: "sms:recipient", Subject: "+1419" + strconv.Itoa(5_000_000+r), Rule: throttledRule}
}

// take returns the next booked id, or false when the pool is used up.
func (p *wakePool) take() (wakeID, bool) {
	i := p.next.Add(1) - 1
	if i >= int64(len(p.ids)) {
		return wakeID{}, false
	}
	return p.ids[i], true
}

var errPoolDone = errors.New("pool used up")

// tscenario is a peer with its setup (run on an emptied Redis, untimed).
type tscenario struct {
	name    string
	callers int
	setup   func(ctx context.Context) op
	calls   int // limiter calls per op (0: 1)
}

// interleaveSetup is interleave with a setup per scenario; an op returning
// errPoolDone ends its run early (pooled scenarios), counted up to there.
func interleaveSetup(ctx context.Context, rdb *redis.Client, scs []tscenario) results {
	res, cpu := results{}, map[string][]float64{}
	for r := 0; r < *rounds; r++ {
		for k := range scs {
			s := scs[k]
			if r%2 == 1 {
				s = scs[len(scs)-1-k]
			}
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				log.Fatal(err)
			}
			f := s.setup(ctx)
			before := redisCPU(ctx, rdb)
			rate, n := runUntil(ctx, s.callers, f)
			if s.calls > 1 {
				rate, n = rate*float64(s.calls), n*int64(s.calls)
			}
			res[s.name] = append(res[s.name], rate)
			cpu[s.name] = append(cpu[s.name], (redisCPU(ctx, rdb)-before).Seconds()/float64(n))
		}
	}
	for name := range res {
		serverCPU[name] = time.Duration(median(cpu[name]) * 1e9)
	}
	return res
}

// runUntil is run, ending early when f reports errPoolDone.
func runUntil(ctx context.Context, callers int, f op) (float64, int64) {
	var n, started atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	deadline := time.Now().Add(*dur)
	start := time.Now()
	for g := 0; g < callers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() && time.Now().Before(deadline) {
				err := f(ctx, started.Add(1))
				if err == errPoolDone {
					stop.Store(true)
					return
				}
				if err != nil {
					log.Fatal(err)
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds(), n.Load()
}

// throttledBench is what the throttled scenarios share: the limiters
// measured and the size of the wake pools.
type throttledBench struct {
	rdb      *redis.Client
	coal     *throttle.Limiter // coalescing, as workers run it
	plain    *throttle.Limiter // one script call per check
	rl       *redis_rate.Limiter
	poolSize int
}

func throttled(ctx context.Context, rdb *redis.Client) {
	coal := newLimiter(rdb, throttle.Options{})
	defer coal.Close()
	plain := newLimiter(rdb, throttle.Options{Direct: true})
	defer plain.Close()
	tb := throttledBench{rdb: rdb, coal: coal, plain: plain, rl: redis_rate.NewLimiter(rdb), poolSize: 60_000}
	if *quick {
		tb.poolSize = 30_000
	}
	for _, c := range []int{1, 32} {
		scs := []tscenario{
			{"redis_rate denied", c, tb.rateDenied, 0},
			{"sluice denied coalesced", c, tb.denied(coal), 0},
			{"sluice denied plain", c, tb.denied(plain), 0},
		}
		if c == 32 {
			scs = append(scs, tscenario{"sluice booking", c, tb.booking, 0}, tscenario{"sluice wake-and-admit", c, tb.wake, 0},
				tscenario{"sluice mixed (book, wake, done)", c, tb.mixed, 3})
		}
		reportThrottled(c, scs, interleaveSetup(ctx, rdb, scs))
	}
}

// reportThrottled prints one caller count's results and adds its rows:
// each scenario against redis_rate's denial, and Redis's CPU per call.
func reportThrottled(callers int, scs []tscenario, m results) {
	fmt.Printf("  %2d callers:", callers)
	for _, s := range scs {
		fmt.Printf("  %s %.0f/s (Redis %.1f µs/call)", s.name, m.med(s.name), us(serverCPU[s.name]))
	}
	fmt.Println()
	for _, s := range scs[1:] {
		target, v := "(report)", ""
		if s.name == "sluice denied coalesced" {
			r := m.ratio(s.name, "redis_rate denied")
			target, v = "≥ 0.8×", verdict(r >= 0.8)
		}
		add(row{"throttled", fmt.Sprintf("%s vs redis_rate denied, %d callers", s.name, callers), fmt.Sprintf("%.0f vs %.0f", m.med(s.name), m.med("redis_rate denied")),
			f2(m.ratio(s.name, "redis_rate denied")), target, v})
	}
	var cpus string
	for i, s := range scs {
		if i > 0 {
			cpus += " / "
		}
		cpus += fmt.Sprintf("%.1f", us(serverCPU[s.name]))
	}
	add(row{"throttled", fmt.Sprintf("Redis CPU per call, %d callers (same order)", callers), cpus + " µs", "", "(INFO cpu delta / calls)", ""})
}

// expectStatus is an error unless d has the status want.
func expectStatus(d throttle.Decision, want throttle.Status) error {
	if d.Status != want {
		return fmt.Errorf("throttled bench: %s, want %s", d.Status, want)
	}
	return nil
}

// denied sets up full windows; its op is lim's Allow, denied.
func (tb throttledBench) denied(lim *throttle.Limiter) func(context.Context) op {
	return func(ctx context.Context) op {
		fillWindows(ctx, tb.rdb, lim)
		return func(ctx context.Context, i int64) error {
			d, err := lim.Allow(ctx, "bench", member(i), fullLimit(i))
			if err != nil {
				return err
			}
			return expectStatus(d, throttle.StatusDenied)
		}
	}
}

// rateDenied sets up full redis_rate keys; its op is redis_rate's denial.
func (tb throttledBench) rateDenied(ctx context.Context) op {
	fillRate(ctx, tb.rl)
	return func(ctx context.Context, i int64) error {
		res, err := tb.rl.Allow(ctx, fullSubject(i), redis_rate.PerHour(throttledRule.Limit))
		if err != nil {
			return err
		}
		if res.Allowed != 0 {
			return fmt.Errorf("redis_rate admitted a full key")
		}
		return nil
	}
}

// booking sets up full windows; its op books a fresh id on them.
func (tb throttledBench) booking(ctx context.Context) op {
	fillWindows(ctx, tb.rdb, tb.coal)
	return func(ctx context.Context, i int64) error {
		d, err := tb.coal.Reserve(ctx, "bench", member(i), bookOpts, fullLimit(i))
		if err != nil {
			return err
		}
		return expectStatus(d, throttle.StatusBooked)
	}
}

// wake sets up a pool of bookings whose slot has come; its op is one
// booked id's wake-and-admit.
func (tb throttledBench) wake(ctx context.Context) op {
	pool := newWakePool(ctx, tb.rdb, tb.poolSize)
	return func(ctx context.Context, i int64) error {
		w, ok := pool.take()
		if !ok {
			return errPoolDone
		}
		d, err := tb.coal.Reserve(ctx, "bench", w.id, bookOpts, w.lim)
		if err != nil {
			return err
		}
		return expectStatus(d, throttle.StatusAdmitted)
	}
}

// mixed sets up both; one op is one throttled message's three calls, in
// turn: its booking, its wake-and-admit, its done record.
func (tb throttledBench) mixed(ctx context.Context) op {
	pool := newWakePool(ctx, tb.rdb, tb.poolSize)
	fillWindows(ctx, tb.rdb, tb.coal)
	return func(ctx context.Context, i int64) error {
		d, err := tb.coal.Reserve(ctx, "bench", member(i), bookOpts, fullLimit(i))
		if err != nil {
			return err
		}
		if err := expectStatus(d, throttle.StatusBooked); err != nil {
			return err
		}
		w, ok := pool.take()
		if !ok {
			return errPoolDone
		}
		if d, err = tb.coal.Reserve(ctx, "bench", w.id, bookOpts, w.lim); err != nil {
			return err
		}
		if err := expectStatus(d, throttle.StatusAdmitted); err != nil {
			return err
		}
		return tb.coal.MarkDone(ctx, "bench", w.id, d.Attempt, 24*time.Hour)
	}
}
