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

func usedMemory(ctx context.Context, rdb *redis.Client) int64 {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		log.Fatal(err)
	}
	n, _ := strconv.ParseInt(field(info, "used_memory"), 10, 64)
	return n
}

// fill admits limit UUIDv7 members into each of keys subjects through the
// real limiter (64 callers) and returns the INFO used_memory delta per entry.
func fill(ctx context.Context, rdb *redis.Client, compact bool, keys, limit int) float64 {
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		log.Fatal(err)
	}
	var tick atomic.Int64
	base := time.Now().Truncate(time.Hour)
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte("bench-secret-0123456789"), CompactMembers: compact,
		Now: func() time.Time { return base.Add(time.Duration(tick.Add(1)) * time.Microsecond) }})
	if err != nil {
		log.Fatal(err)
	}
	before := usedMemory(ctx, rdb)
	work := make(chan int)
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range work {
				l := throttle.Limit{Scope: "sms:recipient", Subject: "+1419" + strconv.Itoa(1_000_000+k), Rule: throttle.Rule{Limit: limit, Window: time.Hour}}
				for i := 0; i < limit; i++ {
					id, _ := uuid.NewV7()
					d, err := lim.Allow(ctx, "bench", id.String(), l)
					if err != nil || !d.Allowed {
						log.Fatalf("fill: %+v %v", d, err)
					}
				}
			}
		}()
	}
	for k := 0; k < keys; k++ {
		work <- k
	}
	close(work)
	wg.Wait()
	return float64(usedMemory(ctx, rdb)-before) / float64(keys*limit)
}

var memPerEntry = map[string]float64{}

func memory(ctx context.Context, rdb *redis.Client) {
	keys100, keys1000 := 10_000, 1_000
	if *quick {
		keys100, keys1000 = 1_000, 100
	}
	defer rdb.ConfigSet(ctx, "zset-max-listpack-entries", "128")
	for _, c := range []struct {
		compact bool
		limit   int
		keys    int
		lp      string
		target  float64
	}{
		{false, 100, keys100, "128", 0}, {true, 100, keys100, "128", 21},
		{false, 1000, keys1000, "128", 0}, {true, 1000, keys1000, "128", 70}, {true, 1000, keys1000, "1024", 70},
	} {
		rdb.ConfigSet(ctx, "zset-max-listpack-entries", c.lp)
		b := fill(ctx, rdb, c.compact, c.keys, c.limit)
		format := map[bool]string{false: "UUID string", true: "compact 6 B"}[c.compact]
		name := fmt.Sprintf("limit %d, %s members, %d keys, listpack ≤ %s", c.limit, format, c.keys, c.lp)
		memPerEntry[fmt.Sprintf("%v/%d/%s", c.compact, c.limit, c.lp)] = b
		target, v := "(reference)", ""
		if c.target > 0 {
			target, v = fmt.Sprintf("≤ %.0f B/entry", c.target), verdict(b <= c.target)
		}
		add(row{"memory", name, fmt.Sprintf("%.1f B/entry", b), "", target, v})
	}
	// What raising zset-max-listpack-entries costs in CPU at limit 1000: a
	// sliding steady state (window 1 s) on 100 keys, skiplist vs listpack.
	rdb.FlushAll(ctx)
	lim, _ := throttle.New(rdb, throttle.Options{Secret: []byte("bench-secret-0123456789"), CompactMembers: true})
	steady := func(ctx context.Context, i int64) error {
		l := throttle.Limit{Scope: "sms:recipient", Subject: "+1420" + strconv.FormatInt(1_000_000+i%100, 10), Rule: throttle.Rule{Limit: 1000, Window: time.Second}}
		_, err := lim.Allow(ctx, "bench", uuid.NewString(), l)
		return err
	}
	var sk, lp []float64
	for r := 0; r < *rounds; r++ {
		rdb.FlushAll(ctx)
		rdb.ConfigSet(ctx, "zset-max-listpack-entries", "128")
		sk = append(sk, throughput(ctx, steady))
		rdb.FlushAll(ctx)
		rdb.ConfigSet(ctx, "zset-max-listpack-entries", "1024")
		lp = append(lp, throughput(ctx, steady))
	}
	add(row{"memory", "checks/s at limit 1000: listpack ≤1024 vs skiplist", fmt.Sprintf("%.0f vs %.0f", median(lp), median(sk)), fmt.Sprintf("%.2f", median(lp)/median(sk)), "(CPU cost of the setting)", ""})
	rdb.FlushAll(ctx)
}
