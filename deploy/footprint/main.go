// Command footprint measures what a real `sluice worker` and `sluice api`
// cost a pod: resident memory idle and while draining a backlog, and CPU
// seconds per send, read from their own process metrics. The chart's
// resource requests come from it (docs/kubernetes.md).
//
//	cd deploy && go run ./footprint [-n 20000]
//
// It builds the binary, starts its own redis-server (AOF with appendfsync
// always, as the chart's trial Redis), enqueues n SMS to distinct
// recipients (the log sender: no provider latency, so this is the worker's
// ceiling) and drains them with one worker at the default concurrency.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
)

func main() {
	n := flag.Int("n", 20000, "SMS to drain")
	flag.Parse()
	if err := run(*n); err != nil {
		log.Fatal(err)
	}
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// metrics reads a /metrics page's unlabelled and labelled samples.
func metrics(addr string) (map[string]float64, error) {
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

func waitUp(addr string) error {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, err := metrics(addr); err == nil {
			return nil
		}
	}
	return fmt.Errorf("%s did not come up", addr)
}

// run builds the binary, starts Redis, a worker and an API, and prints
// the footprint table for a drain of n SMS.
func run(n int) error {
	dir, err := os.MkdirTemp("", "sluice-footprint-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "sluice")
	build := exec.Command("go", "build", "-o", bin, "./cmd/sluice")
	build.Dir, build.Stdout, build.Stderr = "..", os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	srv, err := redistest.Launch(dir, "--appendonly", "yes", "--appendfsync", "always", "--zset-max-listpack-entries", "1024")
	if err != nil {
		return err
	}
	defer srv.Stop()
	keys := tasks.NewKeySpec("fp")
	waddr, aaddr := freeAddr(), freeAddr()
	env := append(os.Environ(), "SLUICE_REDIS_URL=redis://"+srv.Addr, "SLUICE_SUBJECT_SECRET=footprint-subject-secret",
		"SLUICE_PAYLOAD_KEYS="+keys, "SLUICE_RULES=sms:recipient=100/1m,sms:tenant=1000000/1h",
		"SLUICE_HTTP_ADDR="+waddr, "SLUICE_API_ADDR="+aaddr, "SLUICE_API_TOKEN_KEY=footprint-token-key-0123456789abcdef",
		"SLUICE_LOG_LEVEL=warn")
	stopWorker, err := startProcess(bin, env, "worker")
	if err != nil {
		return err
	}
	defer stopWorker()
	stopAPI, err := startProcess(bin, env, "api")
	if err != nil {
		return err
	}
	defer stopAPI()
	idleW, idleA, err := idleMetrics(waddr, aaddr)
	if err != nil {
		return err
	}
	// The worker starts draining while the backlog is enqueued: timed from
	// the first enqueue to the last send.
	t0, err := enqueueBacklog(srv.Addr, keys, n)
	if err != nil {
		return err
	}
	peak, last, err := awaitDrain(waddr, n, t0)
	if err != nil {
		return err
	}
	elapsed := time.Since(t0)
	cpu := last["process_cpu_seconds_total"] - idleW["process_cpu_seconds_total"]
	mib := func(b float64) string { return fmt.Sprintf("%.0f MiB", b/(1<<20)) }
	fmt.Printf("| worker RSS idle | %s |\n", mib(idleW["process_resident_memory_bytes"]))
	fmt.Printf("| worker RSS peak while draining %d SMS (concurrency 10) | %s |\n", n, mib(peak))
	fmt.Printf("| worker CPU per send | %.0f µs (%.1f s for %d sends) |\n", cpu/float64(n)*1e6, cpu, n)
	fmt.Printf("| enqueue + drain | %s, %.0f sends/s |\n", elapsed.Round(100*time.Millisecond), float64(n)/elapsed.Seconds())
	fmt.Printf("| api RSS idle | %s |\n", mib(idleA["process_resident_memory_bytes"]))
	return nil
}

// startProcess starts bin with args and env, its errors on our stderr;
// stop kills it and waits for it.
func startProcess(bin string, env []string, args ...string) (stop func(), err error) {
	c := exec.Command(bin, args...)
	c.Env, c.Stdout, c.Stderr = env, io.Discard, os.Stderr
	if err := c.Start(); err != nil {
		return nil, err
	}
	return func() { _ = c.Process.Kill(); _, _ = c.Process.Wait() }, nil
}

// idleMetrics waits for the worker's and the API's metrics pages, lets
// both settle, and reads them.
func idleMetrics(waddr, aaddr string) (worker, api map[string]float64, err error) {
	if err := waitUp(waddr); err != nil {
		return nil, nil, err
	}
	if err := waitUp(aaddr); err != nil {
		return nil, nil, err
	}
	time.Sleep(2 * time.Second) // let both settle before the idle reading
	if worker, err = metrics(waddr); err != nil {
		return nil, nil, err
	}
	if api, err = metrics(aaddr); err != nil {
		return nil, nil, err
	}
	return worker, api, nil
}

// enqueueBacklog enqueues n SMS to distinct recipients into the Redis at
// addr, sealed with keys, and returns when the first enqueue began.
func enqueueBacklog(addr, keys string, n int) (time.Time, error) {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	client := asynq.NewClientFromRedisClient(rdb)
	ring, err := tasks.ParseKeyring(keys)
	if err != nil {
		return time.Time{}, err
	}
	ctx := context.Background()
	t0 := time.Now()
	for i := range n {
		nf := tasks.NewSMS("acme", fmt.Sprintf("+1415%07d", i), "footprint")
		if _, err := tasks.Enqueue(ctx, client, ring, nf); err != nil {
			return t0, err
		}
	}
	return t0, nil
}

// awaitDrain polls the worker's metrics at waddr until it has sent n SMS,
// for 10 minutes from t0 at most, and returns the peak resident memory
// seen and the last reading.
func awaitDrain(waddr string, n int, t0 time.Time) (peak float64, last map[string]float64, err error) {
	sent0 := 0.0
	for {
		m, err := metrics(waddr)
		if err != nil {
			return 0, nil, err
		}
		peak = max(peak, m["process_resident_memory_bytes"])
		last = m
		if m[`sluice_sends_total{channel="sms",result="sent"}`]-sent0 >= float64(n) {
			return peak, last, nil
		}
		if time.Since(t0) > 10*time.Minute {
			return 0, nil, fmt.Errorf("drain did not finish")
		}
		time.Sleep(200 * time.Millisecond)
	}
}
