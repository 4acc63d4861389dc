package main

import (
	"context"
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

// The depth section (issue 38): what one booking costs in Redis on a key
// that already holds N bookings — a tenant rule with a deep backlog — at
// N = 100, 10,000 and 100,000, against redis_rate's check in the same run.
// A booking must find its slot without walking the backlog: the cost at
// 100,000 within 2× the cost at 100.

// depthRule is the tenant rule of the backlog: 1,000 an hour, so 100,000
// bookings reach 100 hours ahead.
var depthRule = throttle.Rule{Limit: 1000, Window: time.Hour}

// depthSample is one depth's figures per booking: Redis CPU (INFO cpu) and
// the limiter call's own time (INFO commandstats, FCALL), µs.
type depthSample struct{ cpu, fn float64 }

func depthLimit(k int) throttle.Limit {
	return throttle.Limit{Scope: "sms:tenant", Subject: "t" + strconv.Itoa(k), Rule: depthRule}
}

// fillDepth fills key 0 through the limiter — a full window admitted, then n
// bookings packed behind it: the real layout of a backlog — and copies it to
// keys 1..copies-1.
func fillDepth(ctx context.Context, rdb *redis.Client, lim *throttle.Limiter, n, copies int) {
	n += int(depthRule.Limit)
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		log.Fatal(err)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				if _, err := lim.Reserve(ctx, "bench", member(i), bookOpts, depthLimit(0)); err != nil {
					log.Fatal(err)
				}
			}
		})
	}
	wg.Wait()
	src, err := lim.Key("bench", depthLimit(0))
	if err != nil {
		log.Fatal(err)
	}
	if got := rdb.ZCard(ctx, src).Val(); got != int64(n) {
		log.Fatalf("depth: key holds %d entries, want %d", got, n)
	}
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k := 1; k < copies; k++ {
			dst, _ := lim.Key("bench", depthLimit(k))
			p.Copy(ctx, src, dst, 0, true)
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}

// measureDepth books m fresh ids, one caller, round robin over the copies
// (each key deepens by m/copies, under 1 %), every one of them booked.
func measureDepth(ctx context.Context, rdb *redis.Client, lim *throttle.Limiter, m, copies int) depthSample {
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		log.Fatal(err)
	}
	cpu0 := redisCPU(ctx, rdb)
	for i := range m {
		d, err := lim.Reserve(ctx, "bench", member(int64(i)), bookOpts, depthLimit(i%copies))
		if err != nil {
			log.Fatal(err)
		}
		if err := expectStatus(d, throttle.StatusBooked); err != nil {
			log.Fatal(err)
		}
	}
	cpu := us(redisCPU(ctx, rdb) - cpu0)
	f := commandStats(ctx, rdb)["fcall"]
	if f.calls < float64(m) {
		log.Fatalf("depth: %v FCALLs for %d bookings", f.calls, m)
	}
	return depthSample{cpu: cpu / float64(m), fn: f.usec / f.calls}
}

// measureRate is redis_rate's check on 100 keys, m calls, one caller: the
// script's own time per call.
func measureRate(ctx context.Context, rdb *redis.Client, m int) depthSample {
	rl := redis_rate.NewLimiter(rdb)
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		log.Fatal(err)
	}
	cpu0 := redisCPU(ctx, rdb)
	for i := range m {
		if _, err := rl.Allow(ctx, "t"+strconv.Itoa(i%100), redis_rate.PerHour(1000)); err != nil {
			log.Fatal(err)
		}
	}
	cpu := us(redisCPU(ctx, rdb) - cpu0)
	var calls, usec float64
	for name, st := range commandStats(ctx, rdb) {
		if name == "evalsha" || name == "eval" {
			calls, usec = calls+st.calls, usec+st.usec
		}
	}
	return depthSample{cpu: cpu / float64(m), fn: usec / calls}
}

func depth(ctx context.Context, rdb *redis.Client) {
	lim := newLimiter(rdb, throttle.Options{})
	defer lim.Close()
	m := 4000
	if *quick {
		m = 1000
	}
	depths := []int{100, 10_000, 100_000}
	by := map[int][]depthSample{}
	var rate []depthSample
	for range *rounds {
		for _, n := range depths {
			copies := max(2, 200_000/(n+int(depthRule.Limit)))
			start := time.Now()
			fillDepth(ctx, rdb, lim, n, copies)
			fill := time.Since(start)
			s := measureDepth(ctx, rdb, lim, m, copies)
			fmt.Printf("    depth %d: filled in %v; a booking: Redis CPU %.1f µs, FCALL %.1f µs\n", n, fill.Round(time.Millisecond), s.cpu, s.fn)
			by[n] = append(by[n], s)
		}
		rdb.FlushAll(ctx)
		rate = append(rate, measureRate(ctx, rdb, m))
	}
	cpu := func(s depthSample) float64 { return s.cpu }
	fn := func(s depthSample) float64 { return s.fn }
	rc, rf := medianOf(rate, cpu), medianOf(rate, fn)
	for _, n := range depths {
		c, f := medianOf(by[n], cpu), medianOf(by[n], fn)
		add(row{"depth", fmt.Sprintf("a booking on a key holding %d bookings: Redis CPU / FCALL time, µs (redis_rate's check: %.1f / %.1f)", n, rc, rf),
			fmt.Sprintf("%.1f / %.1f", c, f), f2(rf/f) + " of redis_rate", "(report)", ""})
	}
	deep, shallow := medianOf(by[100_000], fn), medianOf(by[100], fn)
	add(row{"depth", "a booking's FCALL time at 100,000 bookings vs at 100", fmt.Sprintf("%.1f vs %.1f µs", deep, shallow), f2(deep / shallow), "≤ 2×", verdict(deep <= 2*shallow)})
	rdb.FlushAll(ctx)
}
