package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/apienv"
)

// BenchmarkCreateBatch: POST /v1/notifications with 500 SMS per request to
// the API on loopback (a real redis-server), and, on the same Redis, the
// library's tasks.Producer.EnqueueMany of 500 of the same notifications
// (api: without an Idempotency-Key, held and released; api-keyed: with
// one, in one script):
// their ratio is what the API costs beyond the enqueue itself (JSON, the
// checks, the held batch and its release, the rate and cap accounting).
// Both report notifications/s.
func BenchmarkCreateBatch(b *testing.B) {
	e := apienv.New(b, "sms:recipient=1/1s", map[string]string{
		"SLUICE_API_RATE": "1000000/1s", "SLUICE_API_NOTIFICATION_RATE": "1000000/1s"})
	const size = 500
	var runs atomic.Int64
	var part []map[string]any
	for i := range size {
		part = append(part, apienv.NewSMS(fmt.Sprintf("+1415555%04d", i), fmt.Sprintf("bench %d", i)))
	}
	body, err := json.Marshal(map[string]any{"notifications": part})
	if err != nil {
		b.Fatal(err)
	}
	for _, keyed := range []bool{false, true} {
		name := "api"
		if keyed {
			name = "api-keyed" // with an Idempotency-Key: one script, no hold
		}
		b.Run(name, func(b *testing.B) {
			// A tenant of its own for each run: the default cap on queued
			// work (100,000) is not reached.
			path := fmt.Sprintf("/v1/notifications?tenant=bench-%d", runs.Add(1))
			defer redisUsage(b, e.RDB, size)()
			for i := 0; b.Loop(); i++ {
				var h []string
				if keyed {
					h = []string{"Idempotency-Key", fmt.Sprintf("bench-%s-%d", b.Name(), i)}
				}
				if r := e.Do(b, http.MethodPost, path, apienv.AdminToken, body, h...); r.Status != http.StatusAccepted {
					b.Fatalf("answer %d: %s", r.Status, r.Body)
				}
			}
			b.ReportMetric(float64(size*b.N)/b.Elapsed().Seconds(), "notifications/s")
		})
	}
	b.Run("library", func(b *testing.B) {
		p := tasks.NewProducer(e.RDB, e.Keys)
		defer redisUsage(b, e.RDB, size)()
		queue := e.Config.Layout().Route("acme", tasks.DefaultLane(""), nil)
		for b.Loop() {
			items := make([]tasks.Item, size)
			for i := range items {
				items[i] = tasks.Item{N: tasks.NewSMS("acme", fmt.Sprintf("+1415555%04d", i), fmt.Sprintf("bench %d", i)), Opts: []asynq.Option{asynq.Queue(queue)}}
			}
			res, err := p.EnqueueMany(context.Background(), items)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range res {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
		}
		b.ReportMetric(float64(size*b.N)/b.Elapsed().Seconds(), "notifications/s")
	})
}

// redisUsage resets Redis's command statistics; the function it returns
// reports the Redis time and calls of every command since, per
// notification (redis-µs/notification, calls/notification), and logs them
// by command.
func redisUsage(b *testing.B, rdb *redis.Client, perOp int) func() {
	ctx := context.Background()
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		b.Fatal(err)
	}
	return func() {
		b.StopTimer()
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		n := float64(perOp * b.N)
		var us, calls float64
		var by []string
		for _, line := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":")
			if !ok || strings.HasPrefix(line, "#") || name == "config" || name == "info" {
				continue
			}
			var c, u float64
			for _, f := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(f, "calls="); ok {
					c, _ = strconv.ParseFloat(v, 64)
				}
				if v, ok := strings.CutPrefix(f, "usec="); ok {
					u, _ = strconv.ParseFloat(v, 64)
				}
			}
			us, calls = us+u, calls+c
			by = append(by, fmt.Sprintf("%s %.3f calls %.2f µs", name, c/n, u/n))
		}
		b.ReportMetric(us/n, "redis-µs/notification")
		b.ReportMetric(calls/n, "calls/notification")
		b.Logf("per notification: %s", strings.Join(by, "; "))
	}
}
