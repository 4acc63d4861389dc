package api_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// serve runs the API as `sluice api` does (Run: its own listener with the
// connection limits and timeouts) with cfg, and returns its address.
func serve(t *testing.T, b *bundle, cfg api.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := app.NewAPI(cfg, nil, app.APIOptions{Redis: b.RDB, Listener: ln, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	sluicetest.Background(t, "run", srv.Run)
	return ln.Addr().String()
}

// keepAlive opens a connection from the loopback address local (""
// for any), sends one request on it, reads the answer and leaves the
// connection open and idle.
func keepAlive(t *testing.T, addr, local, request string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("keep-alive request: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("keep-alive request: %d", resp.StatusCode)
	}
	return c
}

// quotas asks GET /v1/quotas on a new connection, giving up after limit.
func quotas(addr, token string, limit time.Duration) (int, error) {
	c := &http.Client{Timeout: limit, Transport: &http.Transport{DisableKeepAlives: true}}
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/quotas", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// The connection cap cannot be held with idle keep-alive connections, with
// or without a token: with all 64 slots held idle (one request each), a
// legitimate request on a new connection is served within the idle time
// plus a second — here the idle time is 10 minutes, so only making room
// (closing the longest-idle connection) can serve it in time.
func TestIdleKeepAliveConnectionsDoNotHoldTheCap(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:tenant=100/1h", nil)
	cfg := b.Config
	cfg.MaxConns, cfg.MaxConnsPerClient, cfg.IdleTimeout = 64, 0, 10*time.Minute
	addr := serve(t, b, cfg)
	for _, c := range []struct{ name, request string }{
		{"no credential", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"},
		{"a tenant's token inside its rate", "GET /v1/quotas HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + b.Tokens["acme"] + "\r\n\r\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			for range 64 {
				keepAlive(t, addr, "", c.request)
				if strings.Contains(c.request, "quotas") {
					time.Sleep(25 * time.Millisecond) // inside SLUICE_API_RATE, as the attack paces itself
				}
			}
			code, err := quotas(addr, b.Tokens["globex"], 11*time.Second)
			if err != nil || code != http.StatusOK {
				t.Fatalf("another tenant's request with 64 idle connections held: %d %v", code, err)
			}
		})
	}
}

// Connections busy with a request are never closed to make room: a
// newcomer waits until one ends, and every busy request completes.
func TestBusyConnectionsAreNotClosed(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:tenant=100/1h", nil)
	cfg := b.Config
	cfg.MaxConns, cfg.MaxConnsPerClient = 16, 0
	addr := serve(t, b, cfg)
	// 16 uploads that send their head and half their body, then wait.
	var conns []net.Conn
	for range 16 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/notifications HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{", b.Tokens["acme"])
		conns = append(conns, c)
	}
	served := make(chan error, 1)
	go func() {
		code, err := quotas(addr, b.Tokens["globex"], 30*time.Second)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("status %d", code)
		}
		served <- err
	}()
	select {
	case err := <-served:
		t.Fatalf("served while every connection was busy (%v): a busy one was closed", err)
	case <-time.After(300 * time.Millisecond):
	}
	// Each upload finishes its body: every one is answered (422: "{}"
	// is not a notification), none was cut off.
	for i, c := range conns {
		if _, err := io.WriteString(c, "}"); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("busy upload %d: %v", i, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnprocessableEntity {
			t.Fatalf("busy upload %d: %d", i, resp.StatusCode)
		}
	}
	if err := <-served; err != nil {
		t.Fatalf("the waiting request: %v", err)
	}
}

// One address holds at most SLUICE_API_MAX_CONNS_PER_CLIENT connections:
// past it, with none of its own idle, it is answered 503 (readable,
// Retry-After), while another address is served.
func TestConnectionsPerClient(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:tenant=100/1h", nil)
	cfg := b.Config
	cfg.MaxConns, cfg.MaxConnsPerClient = 64, 4
	addr := serve(t, b, cfg)
	const heavy = "127.0.0.2"
	for range 4 { // busy: head sent, body pending
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(heavy)}}).Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/notifications HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{", b.Tokens["acme"])
	}
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(heavy)}}).Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("fifth connection of one address: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" ||
		resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("fifth connection of one address: %d %v", resp.StatusCode, resp.Header)
	}
	if code, err := quotas(addr, b.Tokens["globex"], 10*time.Second); err != nil || code != http.StatusOK {
		t.Fatalf("another address: %d %v", code, err)
	}
	// One of the address's own idle connections gives way to its next one
	// (the longest idle: which one that is depends on when the server saw
	// each go idle).
	var idle []net.Conn
	for range 4 {
		idle = append(idle, keepAlive(t, addr, "127.0.0.3", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"))
	}
	keepAlive(t, addr, "127.0.0.3", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	closed := 0
	for _, c := range idle {
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); errors.Is(err, io.EOF) {
			closed++
		}
	}
	if closed != 1 {
		t.Fatalf("%d of the address's 4 idle connections closed for its fifth, want 1", closed)
	}
}

// Connections that never send a request head hold their slots for the
// head timeout (5 s) at most: never closed to make room (a slow client may
// be on its way), a legitimate request waits for them at worst that long.
func TestHeadlessConnectionsHoldAtMostTheHeadTimeout(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms:tenant=100/1h", nil)
	cfg := b.Config
	cfg.MaxConns, cfg.MaxConnsPerClient = 16, 0
	addr := serve(t, b, cfg)
	for range 16 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	start := time.Now()
	if code, err := quotas(addr, b.Tokens["globex"], 8*time.Second); err != nil || code != http.StatusOK {
		t.Fatalf("with 16 headless connections held: %d %v", code, err)
	}
	t.Logf("served %v after 16 headless connections took every slot (head timeout 5 s)", time.Since(start).Round(time.Millisecond))
}

// SLUICE_API_MAX_HEADER_BYTES is the head's size exactly (request line,
// header lines, the blank line, each with its CRLF): a head of the limit
// is served, one byte more is answered 431, which the client reads.
func TestHeaderLimitExact(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:tenant=100/1h", nil)
	cfg := b.Config
	cfg.MaxHeaderBytes = api.MinHeaderBytes
	addr := serve(t, b, cfg)
	head := func(size int) string {
		base := "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: \r\n\r\n"
		return strings.Replace(base, "X-Pad: ", "X-Pad: "+strings.Repeat("a", size-len(base)), 1)
	}
	var wg sync.WaitGroup
	for _, c := range []struct {
		size int
		want int
	}{
		{cfg.MaxHeaderBytes - 1, http.StatusOK},
		{cfg.MaxHeaderBytes, http.StatusOK},
		{cfg.MaxHeaderBytes + 1, http.StatusRequestHeaderFieldsTooLarge},
		{cfg.MaxHeaderBytes + 5000, http.StatusRequestHeaderFieldsTooLarge},
	} {
		wg.Go(func() {
			h := head(c.size)
			if len(h) != c.size {
				t.Errorf("head of %d bytes built as %d", c.size, len(h))
				return
			}
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			if _, err := io.WriteString(conn, h); err != nil {
				t.Errorf("head of %d bytes: write: %v", c.size, err)
				return
			}
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Errorf("head of %d bytes (limit %d): the answer could not be read: %v", c.size, cfg.MaxHeaderBytes, err)
				return
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Errorf("head of %d bytes (limit %d): %d, want %d", c.size, cfg.MaxHeaderBytes, resp.StatusCode, c.want)
			}
		})
	}
	wg.Wait()
}
