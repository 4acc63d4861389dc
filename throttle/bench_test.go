package throttle_test

import (
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/throttle"
)

// bareScript is the floor: one EVALSHA round trip that does nothing.
var bareScript = redis.NewScript("return 1")

// The limiter's cost is reported against BenchmarkBareEvalsha, measured by
// the same harness in the same run: compare ns/op of the pairs
//
//	go test -run '^$' -bench . ./throttle/
//
// Each also reports redis-µs/op: the Redis time of its script calls
// (FCALL, EVALSHA, EVAL in INFO commandstats, the script's own commands
// included) per operation, which a busy client machine does not blur.
func BenchmarkBareEvalsha(b *testing.B) {
	bb := setup(b, false)
	b.Run("Serial", func(b *testing.B) {
		defer redisTime(b, bb.client)()
		for b.Loop() {
			if err := bareScript.Run(ctx, bb.client, []string{"k"}).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Parallel", func(b *testing.B) {
		defer redisTime(b, bb.client)()
		b.SetParallelism(16) // 32 callers on 2 cores
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := bareScript.Run(ctx, bb.client, []string{"k"}).Err(); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

func BenchmarkAllow(b *testing.B) {
	bb := setup(b, false)
	one := []throttle.Limit{{Scope: "sms:recipient", Subject: "+14155550100", Rule: throttle.Rule{Limit: 100, Window: time.Minute}}}
	keys := make([][]throttle.Limit, 10_000)
	for i := range keys {
		keys[i] = []throttle.Limit{{Scope: "sms:recipient", Subject: "+1415" + strconv.Itoa(5_000_000+i), Rule: throttle.Rule{Limit: 100, Window: time.Minute}}}
	}
	three := func(i int) []throttle.Limit {
		s := "+1415" + strconv.Itoa(5_000_000+i%10_000)
		return []throttle.Limit{
			{Scope: "sms:recipient", Subject: s, Rule: throttle.Rule{Limit: 100, Window: time.Minute}},
			{Scope: "sms:recipient", Subject: s, Rule: throttle.Rule{Limit: 500, Window: 24 * time.Hour}},
			{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 1_000_000, Window: time.Hour}},
		}
	}
	run := func(b *testing.B, parallel bool, limits func(i int) []throttle.Limit) {
		defer redisTime(b, bb.client)()
		var n atomic.Int64
		op := func() {
			i := int(n.Add(1))
			if _, err := bb.lim.Allow(ctx, bb.group, uuid.NewString(), limits(i)...); err != nil {
				b.Fatal(err)
			}
		}
		if !parallel {
			for b.Loop() {
				op()
			}
			return
		}
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				op()
			}
		})
	}
	for _, par := range []bool{false, true} {
		name := map[bool]string{false: "Serial", true: "Parallel"}[par]
		b.Run("HotKey/"+name, func(b *testing.B) { run(b, par, func(int) []throttle.Limit { return one }) })
		b.Run("10kKeys/"+name, func(b *testing.B) { run(b, par, func(i int) []throttle.Limit { return keys[i%len(keys)] }) })
		b.Run("ThreeRules10kKeys/"+name, func(b *testing.B) { run(b, par, three) })
	}
}

// TestMemoryPerEntry measures MEMORY USAGE of a window full at several
// limits, with notification ids (UUIDv7 strings) as members and with compact
// 8-byte members, beside the often-quoted 70 B/entry estimate. Run with -v to see
// the figures.
func TestMemoryPerEntry(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	compact, err := throttle.New(b.client, throttle.Options{Secret: testSecret, Now: b.clock.Now, CompactMembers: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		lim  *throttle.Limiter
	}{{"uuid", b.lim}, {"compact", compact}} {
		perEntry := map[int]float64{}
		for _, limit := range []int{10, 100, 128, 129, 200, 1000} {
			lim := throttle.Limit{Scope: "sms:recipient", Subject: fmt.Sprint(tc.name, limit), Rule: throttle.Rule{Limit: limit, Window: time.Hour}}
			for i := 0; i < limit; i++ {
				id, _ := uuid.NewV7()
				if d, err := tc.lim.Allow(ctx, b.group, id.String(), lim); err != nil || !d.Allowed {
					t.Fatalf("limit %d fill %d: %+v %v", limit, i, d, err)
				}
				b.clock.Add(time.Millisecond)
			}
			key := b.key(t, lim)
			bytes, err := b.client.MemoryUsage(ctx, key, 0).Result()
			if err != nil {
				t.Fatal(err)
			}
			enc := b.client.ObjectEncoding(ctx, key).Val()
			perEntry[limit] = float64(bytes) / float64(limit)
			t.Logf("%-7s limit %4d: %7d B, %6.1f B/entry (%s); often-quoted estimate 70 B/entry", tc.name, limit, bytes, perEntry[limit], enc)
		}
		// Redis switches a sorted set from listpack to skiplist above 128
		// entries: the cost per entry must jump there, or we are not measuring.
		if perEntry[129] < 1.5*perEntry[128] {
			t.Fatalf("%s: no listpack→skiplist jump: %.1f B/entry at 128, %.1f at 129", tc.name, perEntry[128], perEntry[129])
		}
	}
}

func TestCompactMembersStayIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	l, _ := throttle.New(b.client, throttle.Options{Secret: testSecret, Now: b.clock.Now, CompactMembers: true})
	lim := recipient(throttle.Rule{Limit: 2, Window: time.Minute})
	d1, _ := l.Allow(ctx, b.group, "n-1", lim)
	d2, _ := l.Allow(ctx, b.group, "n-1", lim)
	d3, _ := l.Allow(ctx, b.group, "n-2", lim)
	d4, _ := l.Allow(ctx, b.group, "n-3", lim)
	if !d1.Allowed || !d2.Duplicate || !d3.Allowed || d4.Allowed {
		t.Fatalf("%+v %+v %+v %+v", d1, d2, d3, d4)
	}
	for _, m := range b.client.ZRange(ctx, b.key(t, lim), 0, -1).Val() {
		if len(m) != 6 {
			t.Fatalf("stored member %q is %d bytes, want 6", m, len(m))
		}
	}
	if n, _ := l.Release(ctx, b.group, "n-1", 1, lim); n != 1 {
		t.Fatalf("release removed %d", n)
	}
}

// A bucketed rule against a log at limit 1,000 (window 1 s, 100 keys, a
// steady sliding state): compare ns/op of the pair in one run.
func BenchmarkReserveBucketedVsLog(b *testing.B) {
	bb := setup(b, false)
	for _, r := range []throttle.Rule{{Limit: 1000, Window: time.Second}, {Limit: 1000, Window: time.Second, Buckets: 60}} {
		b.Run(r.String(), func(b *testing.B) {
			defer redisTime(b, bb.client)()
			b.SetParallelism(16)
			var n atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					l := throttle.Limit{Scope: "sms:recipient", Subject: "+1422" + strconv.FormatInt(1_000_000+i%100, 10), Rule: r}
					if _, err := bb.lim.Reserve(ctx, bb.group, "m"+strconv.FormatInt(i, 10), throttle.ReserveOptions{StateTTL: time.Second}, l); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// redisTime starts counting the script calls' Redis time; the function it
// returns reports it per operation as redis-µs/op.
func redisTime(b *testing.B, c *redis.Client) func() {
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	return func() {
		b.StopTimer()
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		us, _ := scriptStats(info)
		b.ReportMetric(us/float64(b.N), "redis-µs/op")
	}
}

// scriptStats sums the Redis time (µs) and the number of the limiter's
// script calls (FCALL, EVALSHA, EVAL) in an INFO commandstats reply.
func scriptStats(info string) (usec, calls float64) {
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"fcall", "evalsha", "eval"} {
			rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
			if !ok {
				continue
			}
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "usec="); ok {
					n, _ := strconv.ParseFloat(v, 64)
					usec += n
				}
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					n, _ := strconv.ParseFloat(v, 64)
					calls += n
				}
			}
		}
	}
	return usec, calls
}
