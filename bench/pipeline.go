package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/worker"
)

// recorder is a no-op sender that notes when each send happened.
type recorder struct {
	mu    sync.Mutex
	times []time.Time
	want  int
	done  chan struct{}
}

func newRecorder(want int) *recorder { return &recorder{want: want, done: make(chan struct{})} }

func (r *recorder) Send(context.Context, tasks.Notification) error {
	r.mu.Lock()
	r.times = append(r.times, time.Now())
	if len(r.times) == r.want {
		close(r.done)
	}
	r.mu.Unlock()
	return nil
}

var runSeq int

func queueName(prefix string) string { runSeq++; return prefix + "-" + strconv.Itoa(runSeq) }

func workerConfig(addr, queue, rules, policy string) worker.Config {
	cfg, err := worker.ParseConfig(map[string]string{
		"SLUICE_REDIS_URL":      "redis://" + addr,
		"SLUICE_QUEUE":          queue,
		"SLUICE_RULES":          rules,
		"SLUICE_SUBJECT_SECRET": "bench-secret-0123456789",
		"SLUICE_HTTP_ADDR":      "off",
		"SLUICE_RESCHEDULE":     policy,
		"SLUICE_LOG_LEVEL":      "error",
	})
	if err != nil {
		log.Fatal(err)
	}
	return cfg
}

// startWorker runs a Sluice worker in-process until stop is called.
func startWorker(addr string, cfg worker.Config, s worker.Sender) (reg *prometheus.Registry, stop func()) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	reg = prometheus.NewRegistry()
	w, err := worker.New(cfg, worker.Options{Redis: rdb, Registry: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Senders: map[tasks.Channel]worker.Sender{tasks.SMS: s, tasks.Email: s}})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return reg, func() {
		cancel()
		if err := <-done; err != nil {
			log.Fatal(err)
		}
		rdb.Close()
	}
}

func enqueueSMS(ctx context.Context, c *asynq.Client, queue string, n int, to func(i int) string) {
	for i := 0; i < n; i++ {
		if _, err := tasks.Enqueue(ctx, c, tasks.NewSMS("bench", to(i), "bench "+strconv.Itoa(i)), asynq.Queue(queue)); err != nil {
			log.Fatal(err)
		}
	}
}

func decisions(reg *prometheus.Registry) float64 {
	mfs, _ := reg.Gather()
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == "sluice_throttle_decisions_total" {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// workerOverhead compares tasks/s of a Sluice worker (throttle middleware,
// every send allowed, distinct recipients) with a bare Asynq server running
// the same decode and no-op send.
func workerOverhead(ctx context.Context, addr string) {
	n := 3000
	if *quick {
		n = 1000
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	defer rdb.Close()
	client := asynq.NewClientFromRedisClient(rdb)
	rules := "sms:recipient=100/1m,sms:recipient=500/1d,sms:tenant=1000000/1h"
	var with, without []float64
	for r := 0; r < *rounds; r++ {
		// With the middleware.
		q := queueName("ovh-with")
		enqueueSMS(ctx, client, q, n, func(i int) string { return fmt.Sprintf("+1416%07d", r*n+i) })
		rec := newRecorder(n)
		start := time.Now()
		_, stop := startWorker(addr, workerConfig(addr, q, rules, "booked"), rec)
		<-rec.done
		with = append(with, float64(n)/time.Since(start).Seconds())
		stop()

		// Bare Asynq: same concurrency and poll settings, decode + no-op send.
		q = queueName("ovh-without")
		enqueueSMS(ctx, client, q, n, func(i int) string { return fmt.Sprintf("+1417%07d", r*n+i) })
		rec = newRecorder(n)
		cfg := workerConfig(addr, q, rules, "booked")
		srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: cfg.Concurrency, Queues: map[string]int{q: 1},
			TaskCheckInterval: cfg.PollInterval, DelayedTaskCheckInterval: cfg.DelayedCheckInterval, LogLevel: asynq.ErrorLevel})
		mux := asynq.NewServeMux()
		mux.HandleFunc(tasks.TypeSMS, func(ctx context.Context, t *asynq.Task) error {
			nt, err := tasks.Decode(t.Payload())
			if err != nil {
				return err
			}
			return rec.Send(ctx, nt)
		})
		start = time.Now()
		if err := srv.Start(mux); err != nil {
			log.Fatal(err)
		}
		<-rec.done
		without = append(without, float64(n)/time.Since(start).Seconds())
		srv.Shutdown()
	}
	w, wo := median(with), median(without)
	add(row{"worker", fmt.Sprintf("tasks/s with vs without middleware (%d tasks)", n), fmt.Sprintf("%.0f vs %.0f", w, wo), fmt.Sprintf("%.2f", w/wo), "≥ 0.9×", verdict(w/wo >= 0.9)})
}

type backlogResult struct {
	policy           string
	n, limit         int
	window           time.Duration
	callsPerMsg      float64
	drain, ideal     time.Duration
	violations       int
	lateP50, lateP99 time.Duration
}

// backlog sends n SMS to one recipient under limit per window through two
// workers and measures limiter calls per delivered message, drain time
// against the ideal n/limit × window, and the window on actual send times.
func backlog(ctx context.Context, addr, policy string, n, limit int, window time.Duration) backlogResult {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	client := asynq.NewClientFromRedisClient(rdb)
	q := queueName("backlog-" + policy)
	rules := fmt.Sprintf("sms:recipient=%d/%s,sms:tenant=1000000/1h", limit, window)
	to := fmt.Sprintf("+1418%07d", runSeq)
	rec := newRecorder(n)
	cfg := workerConfig(addr, q, rules, policy)
	reg1, stop1 := startWorker(addr, cfg, rec)
	reg2, stop2 := startWorker(addr, cfg, rec)
	start := time.Now()
	enqueueSMS(ctx, client, q, n, func(int) string { return to })
	select {
	case <-rec.done:
	case <-time.After(time.Duration(n/limit+5) * window * 4):
		log.Fatalf("backlog %s: %d of %d sent before the time limit", policy, len(rec.times), n)
	}
	calls := decisions(reg1) + decisions(reg2)
	stop1()
	stop2()
	rec.mu.Lock()
	times := append([]time.Time(nil), rec.times...)
	rec.mu.Unlock()
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	res := backlogResult{policy: policy, n: n, limit: limit, window: window, callsPerMsg: calls / float64(n),
		drain: times[n-1].Sub(start), ideal: time.Duration(float64(n) / float64(limit) * float64(window))}
	var late []time.Duration
	for i := limit; i < n; i++ {
		gap := times[i].Sub(times[i-limit])
		if gap <= window-20*time.Millisecond { // send-time jitter allowance: the recorder runs right after admission
			res.violations++
		}
		late = append(late, max(0, gap-window))
	}
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	if len(late) > 0 {
		res.lateP50, res.lateP99 = late[len(late)/2], late[len(late)*99/100]
	}
	return res
}

var backlogResults []backlogResult

func backlogs(ctx context.Context, addr string) {
	type sc struct {
		n, limit int
		window   time.Duration
	}
	scenarios := []sc{{200, 10, 2 * time.Second}}
	if !*quick {
		scenarios = []sc{{50, 10, 2 * time.Second}, {100, 10, 2 * time.Second}, {200, 10, 2 * time.Second}, {1000, 50, 10 * time.Second}}
	}
	for _, s := range scenarios {
		for _, policy := range []string{"naive", "booked"} {
			r := backlog(ctx, addr, policy, s.n, s.limit, s.window)
			backlogResults = append(backlogResults, r)
			name := fmt.Sprintf("%s: %d under %d/%v", policy, s.n, s.limit, s.window)
			target, ok := "", true
			if s.n == 1000 && policy == "booked" {
				target, ok = "≤ 1.5 calls/msg, drain ≤ 1.25× ideal, 0 violations", r.callsPerMsg <= 1.5 && r.drain <= r.ideal*5/4 && r.violations == 0
			} else if policy == "booked" {
				target, ok = "0 violations", r.violations == 0
			}
			add(row{"backlog", name, fmt.Sprintf("%.2f calls/msg, drain %v (%.2f× ideal), %d violations, gap beyond window p50 %v p99 %v",
				r.callsPerMsg, r.drain.Round(time.Second), float64(r.drain)/float64(r.ideal), r.violations, r.lateP50.Round(time.Millisecond), r.lateP99.Round(time.Millisecond)),
				fmt.Sprintf("%.2f", r.callsPerMsg), target, map[bool]string{true: verdict(ok), false: ""}[target != ""]})
		}
	}
}
