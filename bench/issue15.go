package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
)

// Issue 15: 150 SMS of one tenant to 15 numbers (10 each, shuffled), sent by
// the real binary — one `sluice worker` with the log sender on a fresh
// redis-server, enqueued with `sluice enqueue --file` — timed from the start
// of the enqueue to the 150th "sent" line of the worker's log. The same run
// with a tenant rule added must take about as long: the tenant rule (100 per
// 10 s) never binds here, since the recipient rule lets at most 30 sends
// through in any 6 s.

var issue15Rules = []string{"sms:recipient=2/6s", "sms:recipient=2/6s,sms:tenant=100/10s"}

// buildBinary builds cmd/sluice once into dir.
func buildBinary(dir string) string {
	bin := filepath.Join(dir, "sluice")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/sluice")
	cmd.Dir = ".."
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		log.Fatalf("build cmd/sluice: %v", err)
	}
	return bin
}

// cleanEnv is the process environment without any SLUICE_* variable, plus extra.
func cleanEnv(extra map[string]string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			env = append(env, kv)
		}
	}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

type issue15Run struct {
	total, ideal, idealS time.Duration
	violations           int
}

// runIssue15 runs the real worker with rules on a fresh redis-server,
// enqueues ns with `sluice enqueue --file` and times their sends.
func runIssue15(ctx context.Context, bin, dir, rules string, ns []tasks.Notification) issue15Run {
	rdir, err := os.MkdirTemp(dir, "redis-")
	if err != nil {
		log.Fatal(err)
	}
	srv, err := redistest.Launch(rdir)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()
	w, stderr := startIssue15Worker(bin, srv.Addr, rules)
	file, byID := writeIssue15File(dir, ns)
	started, sends := readIssue15Log(stderr, byID, len(ns))
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		log.Fatal("issue15: the worker did not start")
	}
	time.Sleep(300 * time.Millisecond) // the Asynq server is polling
	start := time.Now()
	enq := exec.Command(bin, "enqueue", "--file", file)
	enq.Env = cleanEnv(map[string]string{"SLUICE_REDIS_URL": "redis://" + srv.Addr, "SLUICE_PAYLOAD_KEYS": keySpec})
	if out, err := enq.CombinedOutput(); err != nil {
		log.Fatalf("sluice enqueue: %v: %s", err, out)
	}
	var got []sent
	timeout := time.After(3 * time.Minute)
	for len(got) < len(ns) {
		select {
		case s := <-sends:
			got = append(got, s)
		case <-timeout:
			log.Fatalf("issue15 (%s): %d of %d sent in 3 minutes", rules, len(got), len(ns))
		}
	}
	_ = w.Process.Signal(syscall.SIGTERM)
	_ = w.Wait()
	last := got[0].at
	for _, s := range got {
		if s.at.After(last) {
			last = s.at
		}
	}
	// Arrivals: every message at the start of the enqueue (a lower bound on
	// the ideal: the enqueue itself takes a few hundred ms).
	arr := make([]arrival, len(ns))
	for i, n := range ns {
		arr[i] = arrival{start, n.Normalized()}
	}
	return issue15Run{total: last.Sub(start), ideal: idealDrain(rules, arr, start, 0), idealS: idealDrain(rules, arr, start, 100*time.Millisecond),
		violations: violations(rules, sortSends(got))}
}

// startIssue15Worker starts bin as a worker of the Redis at addr under
// rules, logging JSON to the pipe it returns.
func startIssue15Worker(bin, addr, rules string) (*exec.Cmd, io.Reader) {
	env := map[string]string{
		"SLUICE_REDIS_URL":      "redis://" + addr,
		"SLUICE_RULES":          rules,
		"SLUICE_SUBJECT_SECRET": secret,
		"SLUICE_PAYLOAD_KEYS":   keySpec,
		"SLUICE_HTTP_ADDR":      "off",
		"SLUICE_LOG_FORMAT":     "json",
	}
	w := exec.Command(bin, "worker")
	w.Env = cleanEnv(env)
	stderr, err := w.StderrPipe()
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Start(); err != nil {
		log.Fatal(err)
	}
	return w, stderr
}

// writeIssue15File writes ns, each with a new id, as the JSON Lines file
// enqueue reads, and returns its path and the notifications by id.
func writeIssue15File(dir string, ns []tasks.Notification) (string, map[string]tasks.Notification) {
	byID := map[string]tasks.Notification{}
	f, err := os.Create(filepath.Join(dir, "issue15.jsonl"))
	if err != nil {
		log.Fatal(err)
	}
	enc := json.NewEncoder(f)
	for _, n := range ns {
		n.ID = tasks.NewID()
		byID[n.ID] = n
		if err := enc.Encode(map[string]string{"id": n.ID, "tenant": n.Tenant, "channel": string(n.Channel), "to": n.To, "body": n.Body}); err != nil {
			log.Fatal(err)
		}
	}
	f.Close()
	return f.Name(), byID
}

// readIssue15Log reads the worker's log: started closes when it starts
// serving, and sends gets each send (room for n), resolved by byID.
func readIssue15Log(stderr io.Reader, byID map[string]tasks.Notification, n int) (started <-chan struct{}, sends <-chan sent) {
	start := make(chan struct{})
	out := make(chan sent, n)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		once := false
		for sc.Scan() {
			var line struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
				ID   string    `json:"id"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			switch {
			case !once && line.Msg == "tenant plans in force": // logged last before the Asynq server starts
				once = true
				close(start)
			case line.Msg == "sent (log sender)":
				out <- sent{line.Time, byID[line.ID]}
			}
		}
	}()
	return start, out
}

func sortSends(s []sent) []sent {
	r := &recorder{sent: s}
	return r.sends()
}

func issue15(ctx context.Context) {
	dir, err := os.MkdirTemp("", "sluice-issue15-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := buildBinary(dir)
	ns := spread("acme", 15, 10, 15)
	n := *rounds
	if *quick {
		n = 1
	}
	res := map[string][]issue15Run{}
	for r := 0; r < n; r++ {
		order := issue15Rules
		if r%2 == 1 {
			order = []string{issue15Rules[1], issue15Rules[0]}
		}
		for _, rules := range order {
			x := runIssue15(ctx, bin, dir, rules, ns)
			fmt.Printf("  round %d, %s: %.1f s (ideal %.1f s, with slack %.1f s), %d violations\n", r+1, rules, x.total.Seconds(), x.ideal.Seconds(), x.idealS.Seconds(), x.violations)
			res[rules] = append(res[rules], x)
		}
	}
	med := func(rules string) issue15Run {
		var ts []float64
		for _, x := range res[rules] {
			ts = append(ts, float64(x.total))
		}
		m := median(ts)
		for _, x := range res[rules] {
			if float64(x.total) == m {
				return x
			}
		}
		return res[rules][0]
	}
	a, b := med(issue15Rules[0]), med(issue15Rules[1])
	for _, x := range []struct {
		rules string
		r     issue15Run
	}{{issue15Rules[0], a}, {issue15Rules[1], b}} {
		v := 0 // over every round, not only the median one
		for _, y := range res[x.rules] {
			v += y.violations
		}
		add(row{"issue15", fmt.Sprintf("150 SMS, 15 numbers × 10, real binary, one worker: %s", x.rules),
			fmt.Sprintf("%.1f s (ideal %.1f s, with slack %.1f s), %d violations in %d runs", x.r.total.Seconds(), x.r.ideal.Seconds(), x.r.idealS.Seconds(), v, len(res[x.rules])),
			f2(float64(x.r.total) / float64(x.r.ideal)), "(vs ideal)", ""})
	}
	ratio := float64(b.total) / float64(a.total)
	add(row{"issue15", "with the tenant rule vs without (median of each)", fmt.Sprintf("%.1f s vs %.1f s", b.total.Seconds(), a.total.Seconds()), f2(ratio), "≤ 1.05×", verdict(ratio <= 1.05)})
}
