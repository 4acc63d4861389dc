package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/tasks"
)

// Issue 38: producers. Each producer enqueues n SMS of 16 tenants (about
// 300 B of payload each) into a fresh redis-server; the peer, in the same
// run, is a plain Asynq client calling Enqueue in a loop (one goroutine,
// 8 queues), as a team would write around a bare client.

// enqueueRound is one producer's rate, notifications per second.
type enqueueRound struct{ plain, cli, library, api, keyed float64 }

func enqueueSMS(n int) []tasks.Notification {
	ns := make([]tasks.Notification, n)
	body := strings.Repeat("Your order has shipped and is on its way. ", 5)[:200]
	for i := range ns {
		ns[i] = tasks.NewSMS(fmt.Sprintf("tenant-%02d", i%16), fmt.Sprintf("+1415%07d", i), body)
		ns[i].ID = tasks.NewID()
	}
	return ns
}

func freshRedis(dir string) (*redistest.Server, *redis.Client) {
	srv, err := redistest.Launch(must(os.MkdirTemp(dir, "redis-")))
	if err != nil {
		log.Fatal(err)
	}
	return srv, redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
}

// plainLoop: asynq.Client.Enqueue of each notification's sealed task, one
// after the other, over 8 queues.
func plainLoop(ctx context.Context, dir string, ns []tasks.Notification) float64 {
	srv, rdb := freshRedis(dir)
	defer srv.Stop()
	defer rdb.Close()
	client := asynq.NewClientFromRedisClient(rdb)
	start := time.Now()
	for i, n := range ns {
		t, opts := plainTask(n, fmt.Sprintf("plain.%d", i%8))
		if _, err := client.EnqueueContext(ctx, t, opts...); err != nil {
			log.Fatal(err)
		}
	}
	return float64(len(ns)) / time.Since(start).Seconds()
}

// cliFile: `sluice enqueue --file` of ns, the real binary, from its start
// to its exit.
func cliFile(dir, bin string, ns []tasks.Notification) float64 {
	srv, rdb := freshRedis(dir)
	defer srv.Stop()
	defer rdb.Close()
	file := filepath.Join(dir, "campaign.jsonl")
	var b bytes.Buffer
	for _, n := range ns {
		line, err := json.Marshal(n)
		if err != nil {
			log.Fatal(err)
		}
		b.Write(append(line, '\n'))
	}
	if err := os.WriteFile(file, b.Bytes(), 0o600); err != nil {
		log.Fatal(err)
	}
	cmd := exec.Command(bin, "enqueue", "--file", file)
	cmd.Env = cleanEnv(map[string]string{"SLUICE_REDIS_URL": "redis://" + srv.Addr, "SLUICE_PAYLOAD_KEYS": keySpec, "SLUICE_SUBJECT_SECRET": secret})
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		log.Fatalf("sluice enqueue --file: %v\n%s", err, out)
	}
	return float64(len(ns)) / time.Since(start).Seconds()
}

// libraryBatches: tasks.Producer.EnqueueMany in batches of 500.
func libraryBatches(ctx context.Context, dir string, ns []tasks.Notification) float64 {
	srv, rdb := freshRedis(dir)
	defer srv.Stop()
	defer rdb.Close()
	start := time.Now()
	enqueueRooms(ctx, rdb, ns, route(tasks.LaneStandard), true)
	return float64(len(ns)) / time.Since(start).Seconds()
}

// apiBatches: POST /v1/notifications of batches of 500 to `sluice api`
// (the real binary), the admin token naming each batch's tenant; one
// tenant per batch, 16 tenants in turn; keyed: each with an
// Idempotency-Key of its own (enqueued in one script, without a hold).
func apiBatches(dir, bin string, ns []tasks.Notification, keyed bool) float64 {
	srv, rdb := freshRedis(dir)
	defer srv.Stop()
	defer rdb.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	const admin = "bench-admin-token-0123456789abcdef0123"
	cmd := exec.Command(bin, "api")
	cmd.Env = cleanEnv(map[string]string{"SLUICE_REDIS_URL": "redis://" + srv.Addr, "SLUICE_PAYLOAD_KEYS": keySpec, "SLUICE_SUBJECT_SECRET": secret,
		"SLUICE_API_ADDR": addr, "SLUICE_API_TOKEN_KEY": "bench-token-key-0123456789abcdef0123", "SLUICE_API_ADMIN_TOKEN": admin,
		"SLUICE_API_RATE": "100000/1s", "SLUICE_API_NOTIFICATION_RATE": "1000000/1s", "SLUICE_LOG_LEVEL": "warn"})
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			log.Fatalf("the API did not start: %s", stderr.String())
		}
		time.Sleep(50 * time.Millisecond) // nothing signals readiness but the port
	}
	byTenant := map[string][]map[string]any{}
	var order []string
	for _, n := range ns {
		if _, ok := byTenant[n.Tenant]; !ok {
			order = append(order, n.Tenant)
		}
		byTenant[n.Tenant] = append(byTenant[n.Tenant], map[string]any{"channel": "sms", "to": n.To, "body": n.Body})
	}
	start := time.Now()
	for len(order) > 0 {
		for _, t := range order {
			items := byTenant[t]
			part := items[:min(len(items), 500)]
			byTenant[t] = items[len(part):]
			body, _ := json.Marshal(map[string]any{"notifications": part})
			req, _ := http.NewRequest("POST", "http://"+addr+"/v1/notifications?tenant="+t, bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+admin)
			req.Header.Set("Content-Type", "application/json")
			if keyed {
				req.Header.Set("Idempotency-Key", fmt.Sprintf("bench-%s-%d", t, len(byTenant[t])))
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil || resp.StatusCode != http.StatusAccepted {
				log.Fatalf("POST batch: %v %v", err, resp)
			}
			resp.Body.Close()
		}
		order = slicesDeleteEmpty(order, byTenant)
	}
	return float64(len(ns)) / time.Since(start).Seconds()
}

func slicesDeleteEmpty(order []string, by map[string][]map[string]any) []string {
	out := order[:0]
	for _, t := range order {
		if len(by[t]) > 0 {
			out = append(out, t)
		}
	}
	return out
}

// producers runs issue 38's producer rows: two rounds, each producer
// after the plain loop on a fresh Redis.
func producers(ctx context.Context) {
	dir, err := os.MkdirTemp("", "sluice-enqueue-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := buildBinary(dir)
	n := 20_000
	if *quick {
		n = 5_000
	}
	ns := enqueueSMS(n)
	var rounds []enqueueRound
	for range 2 {
		var r enqueueRound
		r.plain = plainLoop(ctx, dir, ns)
		r.cli = cliFile(dir, bin, ns)
		r.library = libraryBatches(ctx, dir, ns)
		r.api = apiBatches(dir, bin, ns, false)
		r.keyed = apiBatches(dir, bin, ns, true)
		fmt.Printf("    round: plain loop %.0f/s, sluice enqueue --file %.0f/s, Producer.EnqueueMany(500) %.0f/s, API batches of 500 %.0f/s, with Idempotency-Keys %.0f/s\n", r.plain, r.cli, r.library, r.api, r.keyed)
		rounds = append(rounds, r)
	}
	for _, pr := range []struct {
		name, target string
		min          float64
		rate         func(enqueueRound) float64
	}{
		{fmt.Sprintf("sluice enqueue --file, %d SMS of 16 tenants, vs a plain Asynq loop", n), "≥ 2×", 2, func(r enqueueRound) float64 { return r.cli }},
		{"tasks.Producer.EnqueueMany, batches of 500, vs the plain loop", "≥ 3×", 3, func(r enqueueRound) float64 { return r.library }},
		{"POST /v1/notifications, batches of 500, vs the plain loop", "≥ 3×", 3, func(r enqueueRound) float64 { return r.api }},
		{"POST /v1/notifications, batches of 500 with an Idempotency-Key, vs the plain loop", "≥ 3×", 3, func(r enqueueRound) float64 { return r.keyed }},
	} {
		var vals, ratios []string
		worst := 1e9
		for _, r := range rounds {
			ratio := pr.rate(r) / r.plain
			worst = min(worst, ratio)
			vals = append(vals, fmt.Sprintf("%.0f vs %.0f/s", pr.rate(r), r.plain))
			ratios = append(ratios, f2(ratio))
		}
		add(row{"enqueue", pr.name, strings.Join(vals, "; "), strings.Join(ratios, ", "), pr.target, verdict(worst >= pr.min)})
	}
}
