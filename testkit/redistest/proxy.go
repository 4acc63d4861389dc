package redistest

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy on loopback in front of a Server, for tests of what
// a client does when Redis runs a command and the reply never arrives:
// the server's effects happen, the client sees its connection drop.
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener

	mu        sync.Mutex
	trigger   [][]byte
	armed     [][]byte // the trigger as armed, for rearm
	down      time.Duration
	downUntil time.Time
	fired     chan struct{}
	conns     map[net.Conn]struct{}
}

// NewProxy starts a proxy to s, closed when the test ends.
func NewProxy(tb testing.TB, s *Server) *Proxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: s.Addr, ln: ln, conns: map[net.Conn]struct{}{}}
	go p.accept()
	tb.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for c := range p.conns {
			c.Close()
		}
	})
	return p
}

// URL is the redis:// URL of the proxy.
func (p *Proxy) URL() string { return "redis://" + p.Addr }

// LoseReplyTo arms the proxy once: the first command whose bytes contain
// every one of parts goes to Redis and runs, but its reply is thrown away
// and every connection closed; then for down every new connection is
// closed at once (Redis unreachable, as while it restarts). The returned channel closes when it fires.
func (p *Proxy) LoseReplyTo(down time.Duration, parts ...string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trigger = nil
	for _, s := range parts {
		p.trigger = append(p.trigger, []byte(s))
	}
	p.armed = p.trigger
	p.down = down
	p.fired = make(chan struct{})
	return p.fired
}

// matches reports whether chunk holds every part of the armed trigger,
// disarming it when it does.
func (p *Proxy) matches(chunk []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trigger == nil {
		return false
	}
	for _, part := range p.trigger {
		if !bytes.Contains(chunk, part) {
			return false
		}
	}
	p.trigger = nil
	return true
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refused := time.Now().Before(p.downUntil)
		if !refused {
			p.conns[c] = struct{}{}
		}
		p.mu.Unlock()
		if refused {
			c.Close()
			continue
		}
		go p.serve(c)
	}
}

func (p *Proxy) forget(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close()
	}
}

// serve copies one client connection both ways. After a triggering
// command the server's next bytes (its reply) are dropped and every
// connection closed — unless they are an error reply (the command did not
// run), which goes through, the trigger armed again.
func (p *Proxy) serve(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		p.forget(client)
		return
	}
	p.mu.Lock()
	p.conns[server] = struct{}{}
	p.mu.Unlock()
	defer p.forget(client, server)
	var awaiting atomic.Bool // a triggering command went to Redis; its reply is due
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				if p.matches(buf[:n]) {
					awaiting.Store(true) // before the command can reach Redis
				}
				if _, werr := server.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				server.Close()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 && awaiting.Load() {
			if buf[0] == '-' {
				// An error reply: the command did not run (a function not
				// loaded yet, say). The client will send it again.
				awaiting.Store(false)
				p.rearm()
			} else {
				p.fire()
				return
			}
		}
		if n > 0 {
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// fire drops every connection and refuses new ones for the armed outage.
func (p *Proxy) fire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.downUntil = time.Now().Add(p.down)
	for c := range p.conns { // every client loses Redis, not only this one
		c.Close()
	}
	clear(p.conns)
	close(p.fired)
}

// rearm arms the trigger matched last again.
func (p *Proxy) rearm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trigger = p.armed
}

// Cut drops every connection and refuses new ones from then on: to the
// proxy's clients Redis is gone for good, and to Redis they are (a process
// cut off, as if killed, whose goroutines still run).
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.downUntil = time.Now().Add(24 * time.Hour)
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}
