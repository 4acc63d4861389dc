package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
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

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
)

// Issue 38: producers. Each producer enqueues n SMS of 16 tenants (about
// 300 B of payload each) into a fresh redis-server; the peer, in the same
// run, is a plain Asynq client calling Enqueue in a loop (one goroutine,
// 8 queues), as a team would write around a bare client.

// enqueueRound is one producer's rate, notifications per second.
type enqueueRound struct{ plain, cli, library, floor, api, keyed float64 }

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
	return postBatches(addr, admin, ns, keyed)
}

// postBatches POSTs ns to addr's /v1/notifications in batches of 500,
// one tenant per batch, 16 tenants in turn, one request after the other
// (as the plain loop enqueues one task after the other), and returns
// notifications/s. The client encodes each batch and reads each answer
// to its end, inside the clock.
func postBatches(addr, token string, ns []tasks.Notification, keyed bool) float64 {
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
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			if keyed {
				req.Header.Set("Idempotency-Key", fmt.Sprintf("bench-%s-%d", t, len(byTenant[t])))
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				log.Fatalf("POST batch: %v", err)
			}
			answer, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusAccepted {
				log.Fatalf("POST batch: %v %s: %s", err, resp.Status, answer)
			}
		}
		order = slicesDeleteEmpty(order, byTenant)
	}
	return float64(len(ns)) / time.Since(start).Seconds()
}

// jsonFloor: the least any JSON-over-HTTP front of the library does, as
// a bound on the API's rows. A handler on loopback (in this process)
// reads the body, decodes it with encoding/json into notifications,
// validates each, gives it the request's tenant, an id and its enqueue
// time, enqueues the batch with tasks.Producer.EnqueueMany, and answers
// the ids. None of the API's own work is in it: no token, no rate or
// cap accounting, no duplicate-member or plan check, no hold, no
// all-or-nothing. The client is postBatches, as for the API.
func jsonFloor(ctx context.Context, dir string, ns []tasks.Notification) float64 {
	srv, rdb := freshRedis(dir)
	defer srv.Stop()
	defer rdb.Close()
	p := tasks.NewProducer(rdb, keyring)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Notifications []tasks.Notification `json:"notifications"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		tenant, now := r.URL.Query().Get("tenant"), time.Now().UTC().Truncate(time.Millisecond)
		items := make([]tasks.Item, len(req.Notifications))
		for i, n := range req.Notifications {
			n.Tenant, n.ID, n.EnqueuedAt = tenant, tasks.NewID(), now
			if err := n.Validate(); err != nil {
				http.Error(w, err.Error(), http.StatusUnprocessableEntity)
				return
			}
			items[i] = tasks.Item{N: n, Opts: []asynq.Option{asynq.Queue(route(tasks.LaneStandard)(n))}}
		}
		res, err := p.EnqueueMany(ctx, items)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		type accepted struct{ ID, Tenant, State string }
		out := make([]accepted, len(res))
		for i, r := range res {
			if r.Err != nil {
				http.Error(w, r.Err.Error(), http.StatusServiceUnavailable)
				return
			}
			out[i] = accepted{items[i].N.ID, tenant, "queued"}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(map[string]any{"notifications": out})
	})}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()
	return postBatches(ln.Addr().String(), "", ns, false)
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
		r.floor = jsonFloor(ctx, dir, ns)
		r.api = apiBatches(dir, bin, ns, false)
		r.keyed = apiBatches(dir, bin, ns, true)
		fmt.Printf("    round: plain loop %.0f/s, sluice enqueue --file %.0f/s, Producer.EnqueueMany(500) %.0f/s, its JSON floor %.0f/s, API batches of 500 %.0f/s, with Idempotency-Keys %.0f/s\n", r.plain, r.cli, r.library, r.floor, r.api, r.keyed)
		rounds = append(rounds, r)
	}
	for _, pr := range []struct {
		name, target string
		min          float64
		rate         func(enqueueRound) float64
	}{
		{fmt.Sprintf("sluice enqueue --file, %d SMS of 16 tenants, vs a plain Asynq loop", n), "≥ 2×", 2, func(r enqueueRound) float64 { return r.cli }},
		{"tasks.Producer.EnqueueMany, batches of 500, vs the plain loop", "≥ 3×", 3, func(r enqueueRound) float64 { return r.library }},
		{"the API's floor: a bare JSON handler over EnqueueMany (decode, validate, enqueue, answer ids), batches of 500, vs the plain loop", "(bounds the API rows)", 0, func(r enqueueRound) float64 { return r.floor }},
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
		met := verdict(worst >= pr.min)
		if pr.min == 0 {
			met = "" // a bound, reported
		}
		add(row{"enqueue", pr.name, strings.Join(vals, "; "), strings.Join(ratios, ", "), pr.target, met})
	}
}
