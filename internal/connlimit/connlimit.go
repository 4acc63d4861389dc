// Package connlimit bounds the connections an http.Server holds, so that
// no one client — with or without a credential — can hold them all.
//
// A Listener wraps the server's listener and is installed as its
// ConnState hook. It keeps at most Max connections open at once and at
// most PerClient from one peer address. When every slot is taken and
// another connection arrives, it makes room the way nginx does when its
// connections run out: it closes the connection that has been idle
// (kept alive between requests) the longest. HTTP/1.1 lets a server close
// an idle connection at any time (RFC 9112, 9.6) and clients retry on a
// fresh one. A connection still reading its first request head is never
// closed to make room — it may be a slow client, or one being answered
// 431 — the server's ReadHeaderTimeout bounds it. Only when no connection
// is idle does a newcomer wait, in the listen backlog, as with
// golang.org/x/net/netutil.LimitListener.
//
// A connection past PerClient is answered 503 with Retry-After and
// closed, after the client's own idle connections were offered first.
//
// The wrapped connections keep CloseWrite, so net/http can half-close a
// connection it answers with an error (431, 400) and the client reads the
// answer before the connection goes.
package connlimit

import (
	"container/list"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/problem"
)

// Options configure a Listener.
type Options struct {
	// Max is the most connections open at once (at least 1).
	Max int
	// PerClient is the most connections one peer address holds at once;
	// 0: no bound of its own (Max only). Behind a reverse proxy every
	// connection comes from the proxy: set it to 0 or above the proxy's
	// connection pool.
	PerClient int
	// Logger gets a sampled warning when connections are refused or
	// closed to make room; default slog.Default().
	Logger *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Stats counts what a Listener did.
type Stats struct {
	Open      int    // connections open now
	Evicted   uint64 // idle connections closed to make room
	Refused   uint64 // connections refused for their client's share (503)
	WaitedFor uint64 // times Accept waited for a busy connection to end
}

// Listener is a net.Listener with bounded connections. Install
// l.ConnState as the http.Server's ConnState.
type Listener struct {
	net.Listener
	max, perClient int
	log            *slog.Logger
	now            func() time.Time

	mu       sync.Mutex
	freed    *sync.Cond // signalled when a slot frees
	open     int
	byClient map[string]int
	idle     *list.List // *conn, longest idle first
	closed   bool

	evicted, refused, waited atomic.Uint64
	lastWarn                 atomic.Int64 // unix ns of the last sampled warning
	lingering                atomic.Int64 // refused connections being read to their end
}

// New wraps ln.
func New(ln net.Listener, o Options) *Listener {
	if o.Max < 1 {
		o.Max = 1
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	l := &Listener{Listener: ln, max: o.Max, perClient: o.PerClient, log: o.Logger, now: o.Now,
		byClient: map[string]int{}, idle: list.New()}
	l.freed = sync.NewCond(&l.mu)
	return l
}

// conn is one accepted connection. Its state is guarded by the
// Listener's mutex.
type conn struct {
	net.Conn
	l      *Listener
	client string
	elem   *list.Element // in l.idle, or nil
	inList *list.List
	gone   bool // its slot is given back
	once   sync.Once
}

// CloseWrite half-closes a TCP connection (net/http's error answers use it).
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Close closes the connection and gives its slot back.
func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

// Accept waits for a connection and a slot for it.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		nc, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		c := &conn{Conn: nc, l: l, client: peer(nc)}
		ok, err := l.admit(c)
		if err != nil {
			_ = nc.Close()
			return nil, err
		}
		if ok {
			return c, nil
		}
		l.refuse(nc)
	}
}

// admit takes a slot for c, making room if it must; false: c's client is
// at its share with nothing idle to give up.
func (l *Listener) admit(c *conn) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perClient > 0 && l.byClient[c.client] >= l.perClient {
		if !l.evictLocked(c.client) {
			return false, nil
		}
	}
	for l.open >= l.max {
		if l.closed {
			return false, net.ErrClosed
		}
		if !l.evictLocked("") {
			l.waitLocked()
		}
	}
	l.open++
	l.byClient[c.client]++
	return true, nil
}

// waitLocked waits until a slot frees or a connection turns idle: either
// makes room.
func (l *Listener) waitLocked() {
	l.waited.Add(1)
	l.freed.Wait()
}

// evictLocked closes the longest-idle connection (of client, if not "";
// else of anyone). It reports whether it closed one; the slot frees when
// the connection's Close runs, which it does before returning.
func (l *Listener) evictLocked(client string) bool {
	var victim *conn
	for e := l.idle.Front(); e != nil; e = e.Next() {
		if c := e.Value.(*conn); client == "" || c.client == client {
			victim = c
			break
		}
	}
	if victim == nil {
		return false
	}
	l.leaveLocked(victim)
	l.evicted.Add(1)
	l.warn("connection closed to make room", "client_share", client != "", "open", l.open)
	// Close releases the slot, which takes the mutex: drop it meanwhile.
	l.mu.Unlock()
	_ = victim.Close()
	l.mu.Lock()
	return true
}

func (l *Listener) enterLocked(c *conn, lst *list.List) {
	l.leaveLocked(c)
	c.elem, c.inList = lst.PushBack(c), lst
}

func (l *Listener) leaveLocked(c *conn) {
	if c.elem != nil {
		c.inList.Remove(c.elem)
		c.elem, c.inList = nil, nil
	}
}

func (l *Listener) release(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c.gone = true
	l.leaveLocked(c)
	l.open--
	if l.byClient[c.client]--; l.byClient[c.client] <= 0 {
		delete(l.byClient, c.client)
	}
	l.freed.Broadcast()
}

// ConnState follows each connection's state: an idle keep-alive
// connection can be closed to make room; a busy one cannot.
func (l *Listener) ConnState(nc net.Conn, s http.ConnState) {
	c, ok := nc.(*conn)
	if !ok || c.l != l {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.gone {
		return
	}
	switch s {
	case http.StateIdle:
		l.enterLocked(c, l.idle)
		l.freed.Broadcast() // an Accept waiting for room can close it
	case http.StateActive, http.StateHijacked, http.StateClosed:
		l.leaveLocked(c)
	}
}

// Close stops accepting; connections already open stay.
func (l *Listener) Close() error {
	l.mu.Lock()
	l.closed = true
	l.freed.Broadcast()
	l.mu.Unlock()
	return l.Listener.Close()
}

// Stats returns the counts so far.
func (l *Listener) Stats() Stats {
	l.mu.Lock()
	open := l.open
	l.mu.Unlock()
	return Stats{Open: open, Evicted: l.evicted.Load(), Refused: l.refused.Load(), WaitedFor: l.waited.Load()}
}

// refusal is what a connection past its client's share gets.
var refusal = func() []byte {
	body, _ := json.Marshal(problem.Problem{Type: problem.TypeBase + "connection-limit", Title: problem.Titles["connection-limit"],
		Status: http.StatusServiceUnavailable, Detail: "close an idle connection of yours, or try again in a second"})
	return fmt.Appendf(nil, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/problem+json\r\n"+
		"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}()

// lingering bounds the refused connections read to their end at once;
// past it a refused connection is closed at once.
const lingering = 64

// refuse answers nc 503 and closes it, half-closing first so the client
// reads the answer; it does not wait for the client.
func (l *Listener) refuse(nc net.Conn) {
	l.refused.Add(1)
	l.warn("connection refused: its address holds its share", "per_client", l.perClient)
	_ = nc.SetDeadline(time.Now().Add(time.Second))
	_, _ = nc.Write(refusal)
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	if l.lingering.Add(1) > lingering {
		l.lingering.Add(-1)
		_ = nc.Close()
		return
	}
	go func() {
		defer l.lingering.Add(-1)
		// Read what the client sent until it closes (or a second
		// passes), so closing does not reset the answer away.
		buf := make([]byte, 512)
		for {
			if _, err := nc.Read(buf); err != nil {
				break
			}
		}
		_ = nc.Close()
	}()
}

// warn logs at most one warning every 10 s: a client cannot fill the log.
// It may be called with l.mu held.
func (l *Listener) warn(msg string, args ...any) {
	now := l.now().UnixNano()
	last := l.lastWarn.Load()
	if now-last < int64(10*time.Second) || !l.lastWarn.CompareAndSwap(last, now) {
		return
	}
	l.log.Warn(msg, append(args, "evicted_total", l.evicted.Load(), "refused_total", l.refused.Load())...)
}

func peer(c net.Conn) string {
	addr := c.RemoteAddr()
	if addr == nil {
		return ""
	}
	if ta, ok := addr.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return host
}
