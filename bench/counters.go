package main

import (
	"context"
	"fmt"
	"log"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/throttle"
)

// fillOne admits limit ids into one key of rule through the real limiter (64
// callers), on a clock that walks through the window so that every bucket
// fills, and returns what deleting the key frees (INFO used_memory, data
// only).
func fillOne(ctx context.Context, rdb *redis.Client, rule throttle.Rule) int64 {
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		log.Fatal(err)
	}
	var tick atomic.Int64
	base := time.Now().Truncate(24 * time.Hour)
	step := rule.Window / time.Duration(rule.Limit+1)
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte(secret), CompactMembers: true,
		Now: func() time.Time { return base.Add(time.Duration(tick.Load()) * step) }})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	l := throttle.Limit{Scope: "sms:sender", Subject: "+14155550100", Rule: rule}
	var wg sync.WaitGroup
	var bad atomic.Int64
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for tick.Add(1) <= int64(rule.Limit) {
				id, _ := uuid.NewV7()
				d, err := lim.Reserve(ctx, "bench", id.String(), throttle.ReserveOptions{StateTTL: time.Millisecond}, l)
				if err != nil {
					log.Fatal(err)
				}
				if d.Status != throttle.StatusAdmitted {
					bad.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	// The ids' records go, and the keyspace's tables settle (Redis shrinks
	// and rehashes them in its cron: no signal but the figure itself), so
	// deleting the one key is all that changes between the two readings.
	var keys []string
	iter := rdb.Scan(ctx, 0, keyspace.Space{}.State("bench", "*"), 10_000).Iterator()
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == 10_000 {
			rdb.Del(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		rdb.Del(ctx, keys...)
	}
	settle(ctx, rdb)
	if n := bad.Load(); n > 0 {
		log.Printf("counters: %d of %d not admitted on the walking clock (%v)", n, rule.Limit, rule)
	}
	// What the key costs: INFO used_memory with it, less without it.
	key, _ := lim.Key("bench", l)
	with := dataMemory(ctx, rdb)
	if n := rdb.Del(ctx, key).Val(); n != 1 {
		log.Fatalf("counters: key %s not found", key)
	}
	return with - dataMemory(ctx, rdb)
}

// settle waits until used_memory reads the same three times 200 ms apart (at most 20 s).
func settle(ctx context.Context, rdb *redis.Client) {
	last, same := int64(-1), 0
	for i := 0; i < 100 && same < 3; i++ {
		m := dataMemory(ctx, rdb)
		if m == last {
			same++
		} else {
			last, same = m, 0
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ctrSample is one run of the steady check: checks/s, Redis CPU per check
// (INFO cpu, µs), this process's CPU per check (getrusage: the client side,
// µs), checks per FCALL (the batches' size) and the function's own time per
// check (INFO commandstats, µs).
type ctrSample struct{ rate, cpu, own, batch, fn float64 }

// counters: the memory of one full key of a bucketed rule against a log,
// and checks/s of a bucketed rule against a log at limit 1,000, with what
// Redis and the client spend per check.
func counters(ctx context.Context, rdb *redis.Client) {
	for _, c := range []struct {
		rule   throttle.Rule
		target int64
	}{
		{throttle.Rule{Limit: 200_000, Window: 24 * time.Hour, Buckets: 60}, 64 << 10},
		{throttle.Rule{Limit: 10_000, Window: time.Hour, Buckets: 60}, 16 << 10},
		{throttle.PerCalendar(200_000, throttle.Day, "America/Los_Angeles"), 16 << 10},
		{throttle.Rule{Limit: 10_000, Window: time.Hour}, 0},
		{throttle.Rule{Limit: 200_000, Window: 24 * time.Hour}, 0},
	} {
		if *quick && c.rule.Limit > 10_000 && !c.rule.Counter() {
			continue
		}
		b := fillOne(ctx, rdb, c.rule)
		target, v := "(reference: the log)", ""
		if c.target > 0 {
			target, v = fmt.Sprintf("≤ %d KB", c.target>>10), verdict(b <= c.target)
		}
		add(row{"counters", fmt.Sprintf("one full key, %s", c.rule), fmt.Sprintf("%.1f KB", float64(b)/1024), "", target, v})
	}
	// Checks/s at limit 1,000 on 100 keys, steady sliding state (window 1 s), log vs bucketed.
	lim := newLimiter(rdb, throttle.Options{})
	defer lim.Close()
	steady := func(rule throttle.Rule) func(context.Context, int64) error {
		return func(ctx context.Context, i int64) error {
			l := throttle.Limit{Scope: "sms:recipient", Subject: "+1421" + strconv.FormatInt(1_000_000+i%100, 10), Rule: rule}
			_, err := lim.Reserve(ctx, "bench", uuid.NewString(), throttle.ReserveOptions{StateTTL: time.Second}, l)
			return err
		}
	}
	// measure is one run's figures.
	measure := func(rule throttle.Rule) ctrSample {
		rdb.FlushAll(ctx)
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			log.Fatal(err)
		}
		cpu0, own0 := redisCPU(ctx, rdb), ownCPU()
		rate, n := run(ctx, 32, steady(rule))
		cpu, own := us(redisCPU(ctx, rdb)-cpu0), us(ownCPU()-own0)
		f := commandStats(ctx, rdb)["fcall"]
		return ctrSample{rate: rate, cpu: cpu / float64(n), own: own / float64(n), batch: float64(n) / f.calls, fn: f.usec / float64(n)}
	}
	logRule, bucketRule := throttle.Rule{Limit: 1000, Window: time.Second}, throttle.Rule{Limit: 1000, Window: time.Second, Buckets: 60}
	var lg, bk []ctrSample
	for r := range *rounds {
		// A B, then B A: a drift in the machine's load falls on both alike.
		if r%2 == 0 {
			lg = append(lg, measure(logRule))
			bk = append(bk, measure(bucketRule))
		} else {
			bk = append(bk, measure(bucketRule))
			lg = append(lg, measure(logRule))
		}
	}
	rate := func(s ctrSample) float64 { return s.rate }
	ratio := medianOf(bk, rate) / medianOf(lg, rate)
	add(row{"counters", "checks/s at limit 1000: bucketed ~60 vs log", fmt.Sprintf("%.0f vs %.0f", medianOf(bk, rate), medianOf(lg, rate)), fmt.Sprintf("%.2f", ratio), "≥ 1.0×", verdict(ratio >= 1.0)})
	for _, f := range []struct {
		what, format, source string
		of                   func(ctrSample) float64
	}{
		{"Redis CPU per check", "%.1f vs %.1f µs", "INFO cpu delta / checks", func(s ctrSample) float64 { return s.cpu }},
		{"client CPU per check", "%.1f vs %.1f µs", "getrusage delta / checks", func(s ctrSample) float64 { return s.own }},
		{"checks per FCALL", "%.1f vs %.1f", "INFO commandstats", func(s ctrSample) float64 { return s.batch }},
		{"FCALL time per check", "%.1f vs %.1f µs", "INFO commandstats", func(s ctrSample) float64 { return s.fn }},
	} {
		b, l := medianOf(bk, f.of), medianOf(lg, f.of)
		add(row{"counters", f.what + " at limit 1000: bucketed ~60 vs log", fmt.Sprintf(f.format, b, l), f2(b / l), "(report: " + f.source + ")", ""})
	}
	rdb.FlushAll(ctx)
}
