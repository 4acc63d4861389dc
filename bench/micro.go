package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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

// lessonScript is the lesson's limiter as written: client clock, member
// "{now}:{8 hex}", EXPIRE in seconds.
var lessonScript = redis.NewScript(`
local now    = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local limit  = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], 0, now - window - 1)
local count = redis.call('ZCARD', KEYS[1])
if count < limit then
    redis.call('ZADD', KEYS[1], now, ARGV[4])
    redis.call('EXPIRE', KEYS[1], math.ceil(window / 1000))
    return 1
else
    return 0
end`)

var floorScript = redis.NewScript("return 1")

type op func(ctx context.Context, i int64) error

// throughput runs op from *callers goroutines for *dur and returns ops/s.
func throughput(ctx context.Context, f op) float64 {
	var n atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(*dur)
	start := time.Now()
	for g := 0; g < *callers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				i := n.Add(1)
				if err := f(ctx, i); err != nil {
					log.Fatal(err)
				}
			}
		}()
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds()
}

// interleave runs every scenario once per round, in turn, and returns medians.
func interleave(ctx context.Context, names []string, ops map[string]op) map[string]float64 {
	res := map[string][]float64{}
	for r := 0; r < *rounds; r++ {
		for _, name := range names {
			res[name] = append(res[name], throughput(ctx, ops[name]))
		}
	}
	out := map[string]float64{}
	for name, xs := range res {
		out[name] = median(xs)
	}
	return out
}

// member is a distinct notification id per call; ids come from the producer
// in production, so making one is not the limiter's cost.
func member(int64) string { return "n" + strconv.FormatInt(memberSeq.Add(1), 36) }

var memberSeq atomic.Int64

func hex8() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func micro(ctx context.Context, rdb *redis.Client) {
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte("bench-secret-0123456789"), CompactMembers: true})
	if err != nil {
		log.Fatal(err)
	}
	rl := redis_rate.NewLimiter(rdb)
	rule := throttle.Rule{Limit: 100, Window: time.Minute}
	subject := func(i int64, keys int64) string { return "+1415" + strconv.FormatInt(5_000_000+i%keys, 10) }
	one := func(keys int64) op {
		return func(ctx context.Context, i int64) error {
			_, err := lim.Allow(ctx, "bench", member(i), throttle.Limit{Scope: "sms:recipient", Subject: subject(i, keys), Rule: rule})
			return err
		}
	}
	rate := func(keys int64) op {
		return func(ctx context.Context, i int64) error {
			_, err := rl.Allow(ctx, "rate:"+subject(i, keys), redis_rate.PerMinute(100))
			return err
		}
	}
	lesson := func(keys int64) op {
		return func(ctx context.Context, i int64) error {
			now := time.Now().UnixMilli()
			return lessonScript.Run(ctx, rdb, []string{"rl:" + subject(i, keys)}, now, 60000, 100, strconv.FormatInt(now, 10)+":"+hex8()).Err()
		}
	}
	three := func(i int64) []throttle.Limit {
		s := subject(i, 10_000)
		return []throttle.Limit{
			{Scope: "sms:recipient", Subject: s, Rule: throttle.PerMinute(100)},
			{Scope: "sms:recipient", Subject: s, Rule: throttle.PerDay(500)},
			{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 1_000_000, Window: time.Hour}},
		}
	}
	ops := map[string]op{
		"floor": func(ctx context.Context, i int64) error {
			return floorScript.Run(ctx, rdb, []string{"floor"}).Err()
		},
		"sluice/1key":     one(1),
		"sluice/10k":      one(10_000),
		"redis_rate/1key": rate(1),
		"redis_rate/10k":  rate(10_000),
		"lesson/1key":     lesson(1),
		"lesson/10k":      lesson(10_000),
		"sluice/3rules": func(ctx context.Context, i int64) error {
			_, err := lim.Allow(ctx, "bench", member(i), three(i)...)
			return err
		},
		"sluice/3separate": func(ctx context.Context, i int64) error {
			for _, l := range three(i) {
				if _, err := lim.Allow(ctx, "bench", member(i), l); err != nil {
					return err
				}
			}
			return nil
		},
	}
	names := []string{"floor", "sluice/1key", "redis_rate/1key", "lesson/1key", "sluice/10k", "redis_rate/10k", "lesson/10k", "sluice/3rules", "sluice/3separate"}
	m := interleave(ctx, names, ops)
	f := m["floor"]
	show := func(name string) string { return fmt.Sprintf("%.0f", m[name]) }
	add(row{"micro", "bare EVALSHA return 1 (floor)", show("floor"), "1.00", "", ""})
	for _, keys := range []string{"1key", "10k"} {
		s, r, l := m["sluice/"+keys], m["redis_rate/"+keys], m["lesson/"+keys]
		add(row{"micro", "sluice single-rule, " + keys, fmt.Sprintf("%.0f", s), fmt.Sprintf("%.2f", s/f), "≥ 0.75× floor", verdict(s/f >= 0.75)})
		add(row{"micro", "sluice vs redis_rate (GCRA), " + keys, fmt.Sprintf("%.0f vs %.0f", s, r), fmt.Sprintf("%.2f", s/r), "≥ 1.0× redis_rate", verdict(s/r >= 1)})
		add(row{"micro", "lesson's script, " + keys, fmt.Sprintf("%.0f", l), fmt.Sprintf("%.2f", l/f), "(reference)", ""})
	}
	t3, sep := m["sluice/3rules"], m["sluice/3separate"]
	add(row{"micro", "sluice three-rule check (one script)", fmt.Sprintf("%.0f", t3), fmt.Sprintf("%.2f", t3/f), "≥ 0.6× floor", verdict(t3/f >= 0.6)})
	add(row{"micro", "three-rule vs three separate checks", fmt.Sprintf("%.0f vs %.0f", t3, sep), fmt.Sprintf("%.2f", t3/sep), "≥ 2×", verdict(t3/sep >= 2)})
}
