package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// goroutines reads go_goroutines from the API's /metrics.
func (a *apiEnv) goroutines(t *testing.T) int {
	t.Helper()
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get(a.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return int(n)
		}
	}
	t.Fatal("no go_goroutines in /metrics")
	return 0
}

// openFDs counts the process's open file descriptors in /proc, or -1
// when it cannot (the process gone, or no /proc).
func openFDs(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(ents)
}

// 500 slow unauthenticated uploads (Content-Length 200,000, a 20 kB
// header, the body a byte at a time) and 100 with a 60 kB header: the
// API answers each without reading its body (401, connection closed) or
// at once (431), holds no more than SLUICE_API_MAX_CONNS connections —
// its goroutines and file descriptors stay under the cap — and a
// well-behaved client is served meanwhile.
func TestAPISlowUnauthenticatedUploads(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=100/1s")
	const maxConns = 128
	a := e.startAPI(map[string]string{"SLUICE_API_RATE": "1000/1s", "SLUICE_API_MAX_CONNS": strconv.Itoa(maxConns)}, "acme")
	pid := a.proc.cmd.Process.Pid
	addr := strings.TrimPrefix(a.base, "http://")
	baseFDs, baseG := openFDs(pid), a.goroutines(t)
	if baseFDs < 0 {
		t.Fatalf("cannot count the API's file descriptors in /proc/%d/fd", pid)
	}

	var peakFDs atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	stopped := false
	t.Cleanup(func() { // a failed call below must not leave the sampler running
		if !stopped {
			close(stop)
		}
	})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if n := int64(openFDs(pid)); n > peakFDs.Load() {
				peakFDs.Store(n)
			}
		}
	}()

	statuses := make(chan string, 600)
	var wg sync.WaitGroup
	slow := func(pad int) {
		defer wg.Done()
		c, err := net.DialTimeout("tcp", addr, 30*time.Second)
		if err != nil {
			statuses <- "dial: " + err.Error()
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		head := "POST /v1/notifications HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 200000\r\nX-Pad: " +
			strings.Repeat("a", pad) + "\r\n\r\n"
		if _, err := io.WriteString(c, head); err != nil {
			statuses <- "closed while sending the head"
			return
		}
		answered := make(chan string, 1)
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				answered <- "read: " + err.Error()
				return
			}
			resp.Body.Close()
			answered <- strconv.Itoa(resp.StatusCode)
		}()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case st := <-answered:
				statuses <- st
				return
			case <-tick.C:
				if _, err := c.Write([]byte("{")); err != nil {
					statuses <- <-answered
					return
				}
			}
		}
	}
	for i := range 600 {
		wg.Add(1)
		if i%6 == 5 {
			go slow(60 << 10)
		} else {
			go slow(20 << 10)
		}
	}
	// A well-behaved client, meanwhile. It sends an Idempotency-Key, as
	// docs/api.md asks: the API may close the idle keep-alive connection
	// the client is about to reuse (the cap is full of newcomers), and
	// net/http retries a POST on a fresh connection only when it carries one.
	served := a.call("POST", "/v1/notifications", a.tokens["acme"], smsJSON("+14155550100", "hello"), "Idempotency-Key", "well-behaved-1")
	g := a.goroutines(t)
	wg.Wait()
	close(stop)
	stopped = true
	<-sampled
	close(statuses)
	counts := map[string]int{}
	for st := range statuses {
		counts[st]++
	}
	t.Logf("answers: %v; peak fds %d (%d before), goroutines during %d (%d before), cap %d", counts, peakFDs.Load(), baseFDs, g, baseG, maxConns)
	if served.Status != 202 {
		t.Fatalf("the well-behaved client: %d %s", served.Status, served.Body)
	}
	if counts["401"] != 500 || counts["431"] != 100 {
		t.Fatalf("answers to the slow uploads: %v, want 500 × 401 and 100 × 431", counts)
	}
	if peak := peakFDs.Load(); peak > int64(baseFDs+maxConns+8) {
		t.Fatalf("the API held %d file descriptors (%d before), over the cap of %d connections", peak, baseFDs, maxConns)
	}
	if g > baseG+2*maxConns+16 {
		t.Fatalf("the API ran %d goroutines (%d before) with a cap of %d connections", g, baseG, maxConns)
	}
}
