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
	iter := rdb.Scan(ctx, 0, "sl1:{bench}:n:*", 10_000).Iterator()
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

// counters: the memory of one full key of a bucketed rule against a log,
// and checks/s of a bucketed rule against a log at limit 1,000.
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
	var lg, bk, lgCPU, bkCPU, lgOwn, bkOwn, lgBatch, bkBatch, lgFn, bkFn []float64
	// measure is one run's checks/s, Redis CPU per check (INFO cpu, µs) and
	// this process's CPU per check (getrusage: the client side, µs).
	// It also gives checks per script call (the batches' size) and the
	// function's own time per check (INFO commandstats).
	measure := func(rule throttle.Rule) (rate, cpu, own, batch, fn float64) {
		rdb.FlushAll(ctx)
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			log.Fatal(err)
		}
		cpu0, own0 := redisCPU(ctx, rdb), ownCPU()
		rate, n := run(ctx, 32, steady(rule))
		cpu, own = us(redisCPU(ctx, rdb)-cpu0)/float64(n), us(ownCPU()-own0)/float64(n)
		f := commandStats(ctx, rdb)["fcall"]
		return rate, cpu, own, float64(n) / f.calls, f.usec / float64(n)
	}
	logRun := func() {
		r, c, o, b, f := measure(throttle.Rule{Limit: 1000, Window: time.Second})
		lg, lgCPU, lgOwn, lgBatch, lgFn = append(lg, r), append(lgCPU, c), append(lgOwn, o), append(lgBatch, b), append(lgFn, f)
	}
	bucketRun := func() {
		r, c, o, b, f := measure(throttle.Rule{Limit: 1000, Window: time.Second, Buckets: 60})
		bk, bkCPU, bkOwn, bkBatch, bkFn = append(bk, r), append(bkCPU, c), append(bkOwn, o), append(bkBatch, b), append(bkFn, f)
	}
	for r := range *rounds {
		// A B, then B A: a drift in the machine's load falls on both alike.
		if r%2 == 0 {
			logRun()
			bucketRun()
		} else {
			bucketRun()
			logRun()
		}
	}
	ratio := median(bk) / median(lg)
	add(row{"counters", "checks/s at limit 1000: bucketed ~60 vs log", fmt.Sprintf("%.0f vs %.0f", median(bk), median(lg)), fmt.Sprintf("%.2f", ratio), "≥ 1.0×", verdict(ratio >= 1.0)})
	add(row{"counters", "Redis CPU per check at limit 1000: bucketed ~60 vs log", fmt.Sprintf("%.1f vs %.1f µs", median(bkCPU), median(lgCPU)), f2(median(bkCPU) / median(lgCPU)), "(report: INFO cpu delta / checks)", ""})
	add(row{"counters", "client CPU per check at limit 1000: bucketed ~60 vs log", fmt.Sprintf("%.1f vs %.1f µs", median(bkOwn), median(lgOwn)), f2(median(bkOwn) / median(lgOwn)), "(report: getrusage delta / checks)", ""})
	add(row{"counters", "checks per FCALL at limit 1000: bucketed ~60 vs log", fmt.Sprintf("%.1f vs %.1f", median(bkBatch), median(lgBatch)), f2(median(bkBatch) / median(lgBatch)), "(report: INFO commandstats)", ""})
	add(row{"counters", "FCALL time per check at limit 1000: bucketed ~60 vs log", fmt.Sprintf("%.1f vs %.1f µs", median(bkFn), median(lgFn)), f2(median(bkFn) / median(lgFn)), "(report: INFO commandstats)", ""})
	rdb.FlushAll(ctx)
}
