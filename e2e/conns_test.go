package e2e

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"github.com/sluicehq/sluice/testkit/fakes"
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

// Slow uploads to the routes no bearer token authenticates — a provider's
// webhook and callbacks, each with the headers its scheme checks first so
// that the head alone is not refused — are cut at the stated body deadline
// (SLUICE_API_UNAUTHENTICATED_BODY_TIMEOUT, 5 s by default: never before
// it, and within a stated latency budget after it that stays well short of
// the bug), not read for the whole 30 s read timeout, while
// a well-behaved client is answered meanwhile within a second (issue 50:
// answered at 30.3 s, and legitimate requests waited up to 27.7 s).
func TestSlowUploadsToUnauthenticatedRoutesAreCut(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=100/1s")
	const maxConns = 16
	const deadline = 5 * time.Second
	// cutBudget is the cut's latency: how long after the deadline the
	// answer may come. The deadline starts when the API reads a head, which
	// a loaded machine delays: beside two CPU hogs all ten were cut at
	// 12.27 s, so their heads were read about 7.3 s after they were written
	// (why so late is not known; the well-behaved client was answered
	// within a second meanwhile). Never before the
	// deadline (the head is written after start), and at most 5 + 10 s: the
	// bug read on to the 30 s read timeout.
	const cutBudget = 10 * time.Second
	tx := fakes.NewTelnyxAPI(t)
	e.vars["SLUICE_TELNYX_PUBLIC_KEY"], e.vars["SLUICE_TELNYX_WEBHOOK_URL"] = tx.PublicKey, "https://sluice.example.com"
	e.vars["SLUICE_SMS_STATUS_CALLBACK_URL"] = "https://sluice.example.com"
	a := e.startAPI(map[string]string{"SLUICE_API_MAX_CONNS": strconv.Itoa(maxConns), "SLUICE_API_MAX_CONNS_PER_CLIENT": "0"}, "acme")
	sg, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&sg.PublicKey)
	e.sluiceRun(nil, "webhook", "set", "acme", "sendgrid", "--key", base64.StdEncoding.EncodeToString(der))
	addr := strings.TrimPrefix(a.base, "http://")
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	routes := []string{
		"POST /v1/webhooks/sendgrid/acme HTTP/1.1\r\nContent-Type: application/json\r\nX-Twilio-Email-Event-Webhook-Signature: c2ln\r\nX-Twilio-Email-Event-Webhook-Timestamp: " + ts,
		"POST /v1/callbacks/telnyx/acme/n-1 HTTP/1.1\r\nContent-Type: application/json\r\ntelnyx-signature-ed25519: c2ln\r\ntelnyx-timestamp: " + ts,
		"POST /v1/inbound/telnyx/acme HTTP/1.1\r\nContent-Type: application/json\r\ntelnyx-signature-ed25519: c2ln\r\ntelnyx-timestamp: " + ts,
		"POST /v1/inbound/sms/acme HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\nX-Twilio-Signature: c2ln",
		"POST /v1/callbacks/sms/acme/n-1 HTTP/1.1\r\nContent-Type: application/x-www-form-urlencoded\r\nX-Twilio-Signature: c2ln",
	}
	type cut struct {
		route  string
		status string
		after  time.Duration
	}
	cuts := make(chan cut, 2*len(routes))
	var wg sync.WaitGroup
	slow := func(head string) {
		defer wg.Done()
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			cuts <- cut{head, "dial: " + err.Error(), 0}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		start := time.Now()
		if _, err := io.WriteString(c, head+"\r\nHost: sluice\r\nContent-Length: 100000\r\n\r\n"); err != nil {
			cuts <- cut{head, "head: " + err.Error(), time.Since(start)}
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
		tick := time.NewTicker(time.Second) // a byte a second, as the client
		defer tick.Stop()
		for {
			select {
			case st := <-answered:
				cuts <- cut{strings.Fields(head)[1], st, time.Since(start)}
				return
			case <-tick.C:
				_, _ = c.Write([]byte("a"))
			}
		}
	}
	for range 2 {
		for _, h := range routes {
			wg.Add(1)
			go slow(h)
		}
	}
	// A well-behaved client meanwhile: each request answered within 1 s.
	var worst time.Duration
	for range 10 {
		time.Sleep(300 * time.Millisecond)
		start := time.Now()
		r := a.call("GET", "/v1/quotas?channel=sms&recipient=%2B14155550100", a.tokens["acme"], nil)
		if took := time.Since(start); took > worst {
			worst = took
		}
		if r.Status != 200 {
			t.Errorf("the well-behaved client: %d %s", r.Status, r.Body)
		}
	}
	wg.Wait()
	close(cuts)
	for c := range cuts {
		t.Logf("%s: %s after %v", c.route, c.status, c.after.Round(time.Millisecond))
		if c.after < deadline || c.after > deadline+cutBudget {
			t.Errorf("%s: answered %s after %v; want it cut at the %v body deadline, at most %v late", c.route, c.status, c.after, deadline, cutBudget)
		}
	}
	t.Logf("the well-behaved client's slowest answer: %v", worst)
	if worst > time.Second {
		t.Errorf("the well-behaved client waited %v, over 1 s", worst)
	}
}
