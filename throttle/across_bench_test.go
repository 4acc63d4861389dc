package throttle_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

// What a check costs when its rules live in several groups — several slots
// of a Cluster, reserved together by reserveAcross — against the same three
// rules (recipient, sender, provider) in the tenant's one group, one script
// call, on a 3-master Cluster in the same run:
//
//	go test -run '^$' -bench ReserveAcross ./throttle/
//
// Besides ns/op each reports redis-µs/op (the Redis time of the limiter's
// script calls on every master, per check), calls/op (script calls per
// check; batching puts several checks' calls in one) and busiest-% (the
// busiest master's share of that time).
func BenchmarkReserveAcross(b *testing.B) {
	_, cc := redistest.NewCluster(b, 3, 0)
	l, err := throttle.New(cc, throttle.Options{Secret: testSecret})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	wide := throttle.Rule{Limit: 1_000_000, Window: time.Minute}
	limits := func(i int, sender, provider string) []throttle.Limit {
		return []throttle.Limit{
			{Scope: "sms:recipient", Subject: "+1415" + strconv.Itoa(5_000_000+i%10_000), Rule: throttle.Rule{Limit: 100, Window: time.Minute}},
			{Scope: "sms:sender", Subject: "+15005550006", Group: sender, Rule: wide},
			{Scope: "sms:provider", Group: provider, Rule: wide},
		}
	}
	for _, tc := range []struct{ name, sender, provider string }{
		{"OneGroup", "", ""},
		{"TwoGroups", "~sender", "~sender"},
		{"ThreeGroups", "~sender", "~provider"},
	} {
		for _, par := range []bool{false, true} {
			name := map[bool]string{false: "Serial", true: "Parallel"}[par]
			b.Run(tc.name+"/"+name, func(b *testing.B) {
				defer clusterRedisTime(b, cc)()
				var n atomic.Int64
				op := func() {
					i := int(n.Add(1))
					d, err := l.Reserve(ctx, "acme", uuid.NewString(), throttle.ReserveOptions{Book: true, Horizon: time.Second}, limits(i, tc.sender, tc.provider)...)
					if err != nil {
						b.Fatal(err)
					}
					if d.Status != throttle.StatusAdmitted {
						b.Fatalf("%s, want admitted (no rule is near its limit)", d.Status)
					}
				}
				if !par {
					for b.Loop() {
						op()
					}
					return
				}
				b.SetParallelism(16) // 32 callers on 2 cores
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						op()
					}
				})
			})
		}
	}
}

// clusterRedisTime is redisTime over every master of a Cluster, with the
// script calls per operation and the busiest master's share of the time.
func clusterRedisTime(b *testing.B, cc *redis.ClusterClient) func() {
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		return c.ConfigResetStat(ctx).Err()
	})
	if err != nil {
		b.Fatal(err)
	}
	return func() {
		b.StopTimer()
		var mu sync.Mutex
		var total, busiest, calls float64
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			info, err := c.Info(ctx, "commandstats").Result()
			if err != nil {
				return err
			}
			us, n := scriptStats(info)
			mu.Lock()
			defer mu.Unlock()
			total, busiest, calls = total+us, max(busiest, us), calls+n
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(total/float64(b.N), "redis-µs/op")
		b.ReportMetric(calls/float64(b.N), "calls/op")
		if total > 0 {
			b.ReportMetric(100*busiest/total, "busiest-%")
		}
	}
}
