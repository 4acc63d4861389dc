package main

import (
	"context"
	"fmt"
	"log"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// dataMemory is INFO used_memory less the clients' buffers
// (mem_clients_normal): connections opened or buffers grown during a run
// are not what the data costs.
func dataMemory(ctx context.Context, rdb *redis.Client) int64 {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		log.Fatal(err)
	}
	used, _ := strconv.ParseInt(field(info, "used_memory"), 10, 64)
	clients, _ := strconv.ParseInt(field(info, "mem_clients_normal"), 10, 64)
	return used - clients
}

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
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte(secret), CompactMembers: compact,
		Now: func() time.Time { return base.Add(time.Duration(tick.Add(1)) * time.Microsecond) }})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
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

func memory(ctx context.Context, addr string, rdb *redis.Client) {
	n := 5000
	if *quick {
		n = 1000
	}
	leftover(ctx, addr, rdb, n)
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
		{false, 1000, keys1000, "128", 0}, {true, 1000, keys1000, "128", 0}, {true, 1000, keys1000, "1024", 25},
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
	lim := newLimiter(rdb, throttle.Options{})
	defer lim.Close()
	steady := func(ctx context.Context, i int64) error {
		l := throttle.Limit{Scope: "sms:recipient", Subject: "+1420" + strconv.FormatInt(1_000_000+i%100, 10), Rule: throttle.Rule{Limit: 1000, Window: time.Second}}
		_, err := lim.Allow(ctx, "bench", uuid.NewString(), l)
		return err
	}
	var sk, lp []float64
	for r := 0; r < *rounds; r++ {
		rdb.FlushAll(ctx)
		rdb.ConfigSet(ctx, "zset-max-listpack-entries", "128")
		sk = append(sk, throughput(ctx, 32, steady))
		rdb.FlushAll(ctx)
		rdb.ConfigSet(ctx, "zset-max-listpack-entries", "1024")
		lp = append(lp, throughput(ctx, 32, steady))
	}
	add(row{"memory", "checks/s at limit 1000: listpack ≤1024 vs skiplist", fmt.Sprintf("%.0f vs %.0f", median(lp), median(sk)), fmt.Sprintf("%.2f", median(lp)/median(sk)), "(CPU cost of the setting)", ""})
	rdb.FlushAll(ctx)
}

// leftover sends n SMS (distinct recipients) through one in-process worker
// with 1 s windows, waits until every window has expired, and returns what
// stays in Redis per sent notification (INFO used_memory delta / n), the
// keys left by kind, and the TTL of a sent notification's record.
func leftover(ctx context.Context, addr string, rdb *redis.Client, n int) {
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		log.Fatal(err)
	}
	const rules = "sms:recipient=10/1s,sms:tenant=1000000/1s"
	q := queueName("leftover")
	cfg := workerConfig(addr, q, rules, nil)
	// A warm-up batch first: connections, script caches and Asynq's own keys
	// reach their size before the baseline is read.
	warm := n / 5
	rec := newRecorder(warm + n)
	_, stop := startWorker(addr, cfg, rec)
	defer stop()
	client := asynq.NewClientFromRedisClient(rdb)
	mk := func(from, count int) []tasks.Notification {
		ns := make([]tasks.Notification, count)
		for i := range ns {
			ns[i] = tasks.NewSMS("bench", fmt.Sprintf("+1421%07d", from+i), "bench "+strconv.Itoa(i))
		}
		return ns
	}
	enqueueAll(ctx, client, q, mk(0, warm))
	for len(rec.sends()) < warm {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(cfg.SendSlack + 3*time.Second)
	before, beforeData := usedMemory(ctx, rdb), dataMemory(ctx, rdb)
	keysBefore, _ := rdb.DBSize(ctx).Result()
	enqueueAll(ctx, client, q, mk(warm, n))
	<-rec.done
	time.Sleep(cfg.SendSlack + 3*time.Second) // every window (1 s + slack) has expired
	after, afterData := usedMemory(ctx, rdb), dataMemory(ctx, rdb)
	kinds := map[string]int{}
	var sample string
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		kind := "other"
		switch {
		case strings.Contains(k, "}:n:"):
			kind, sample = "sent-notification record", k
		case strings.HasPrefix(k, throttle.DefaultPrefix+":"):
			kind = "window"
		case strings.HasPrefix(k, "asynq:"):
			kind = "asynq"
		}
		kinds[kind]++
	}
	ttl := time.Duration(0)
	var val string
	var usage int64
	if sample != "" {
		ttl, _ = rdb.PTTL(ctx, sample).Result()
		val, _ = rdb.Get(ctx, sample).Result()
		usage, _ = rdb.MemoryUsage(ctx, sample).Result()
	}
	keysAfter, _ := rdb.DBSize(ctx).Result()
	per, perData := float64(after-before)/float64(n), float64(afterData-beforeData)/float64(n)
	fmt.Printf("  keys before %d, after %d: %v; a record: %q = %q, TTL %v, MEMORY USAGE %d B\n", keysBefore, keysAfter, kinds, sample, val, ttl.Round(time.Second), usage)
	add(row{"memory", fmt.Sprintf("left per sent notification after its windows expired (%d sent)", n),
		fmt.Sprintf("%.0f B for %v (used_memory %.0f B with client buffers; MEMORY USAGE of one record %d B)", perData, ttl.Round(time.Minute), per, usage),
		"", "(report: one record per id, TTL = SLUICE_DEDUPE_TTL)", ""})
	add(row{"memory", "… at 1,000,000 sends a day, held for SLUICE_DEDUPE_TTL (24h)", fmt.Sprintf("%.0f MB", perData), "", "(report)", ""})
}
