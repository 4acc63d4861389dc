// Package fakes runs real providers on loopback for tests: an HTTP server
// speaking the Twilio-compatible Messages API and an SMTP server. Both record
// every delivery with its arrival time and can be told to fail.
package fakes

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/mail"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
)

// Delivery is one message a fake provider accepted.
type Delivery struct {
	At   time.Time
	ID   string // Idempotency-Key (SMS) or Message-ID local part (email)
	To   string
	Body string
}

// Reply decides a fake's answer to one request: 0 accepts; for SMS an HTTP
// status, for SMTP a reply code (e.g. 451, 550).
type Reply func(to, body string) (code int, retryAfter string)

// Recorder holds deliveries and wakes waiters.
type Recorder struct {
	mu         sync.Mutex
	deliveries []Delivery
	attempts   int
	reply      Reply
	notify     chan struct{}
}

func newRecorder() *Recorder { return &Recorder{notify: make(chan struct{}, 1)} }

// SetReply sets how the fake answers from now on (nil: accept everything).
func (r *Recorder) SetReply(f Reply) { r.mu.Lock(); r.reply = f; r.mu.Unlock() }

func (r *Recorder) decide(to, body string) (int, string) {
	r.mu.Lock()
	r.attempts++
	reply := r.reply
	r.mu.Unlock()
	if reply == nil {
		return 0, ""
	}
	return reply(to, body) // outside the lock: a Reply may call SetReply
}

func (r *Recorder) record(d Delivery) {
	r.mu.Lock()
	r.deliveries = append(r.deliveries, d)
	r.mu.Unlock()
	r.wake()
}

func (r *Recorder) wake() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// Deliveries returns a copy of what arrived, in arrival order.
func (r *Recorder) Deliveries() []Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]Delivery(nil), r.deliveries...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// Attempts counts requests, accepted or not.
func (r *Recorder) Attempts() int { r.mu.Lock(); defer r.mu.Unlock(); return r.attempts }

// WaitFor blocks until cond holds for the deliveries, or fails the test after timeout.
func (r *Recorder) WaitFor(tb testing.TB, timeout time.Duration, what string, cond func([]Delivery) bool) []Delivery {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		d := r.Deliveries()
		if cond(d) {
			return d
		}
		select {
		case <-r.notify:
		case <-deadline.C:
			tb.Fatalf("timed out after %v waiting for %s; %d deliveries, %d attempts", timeout, what, len(d), r.Attempts())
		}
	}
}

// WaitCount waits until at least n deliveries arrived.
func (r *Recorder) WaitCount(tb testing.TB, n int, timeout time.Duration) []Delivery {
	tb.Helper()
	return r.WaitFor(tb, timeout, fmt.Sprintf("%d deliveries", n), func(d []Delivery) bool { return len(d) >= n })
}

// SMSAPI is a fake Twilio-compatible Messages API.
type SMSAPI struct {
	*Recorder
	// Latency is added before each answer (set before use or with SetLatency).
	latency    atomic.Int64
	URL        string // base URL to give the sender
	AccountSID string
	AuthToken  string
	srv        *httptest.Server
}

// NewSMSAPI starts the fake on a loopback port; it stops when the test ends.
func NewSMSAPI(tb testing.TB) *SMSAPI {
	tb.Helper()
	f := &SMSAPI{Recorder: newRecorder(), AccountSID: "AC0123", AuthToken: "token-xyz"}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /2010-04-01/Accounts/{sid}/Messages.json", func(w http.ResponseWriter, r *http.Request) {
		user, pass, ok := r.BasicAuth()
		if !ok || user != f.AccountSID || pass != f.AuthToken || r.PathValue("sid") != f.AccountSID {
			http.Error(w, `{"message":"authenticate"}`, http.StatusUnauthorized)
			return
		}
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		to, body := r.PostForm.Get("To"), r.PostForm.Get("Body")
		if d := time.Duration(f.latency.Load()); d > 0 {
			time.Sleep(d) // a provider that takes its time: sends are in flight meanwhile
		}
		if code, ra := f.decide(to, body); code != 0 {
			if ra != "" {
				w.Header().Set("Retry-After", ra)
			}
			http.Error(w, `{"message":"fake failure"}`, code)
			f.wake()
			return
		}
		f.record(Delivery{At: time.Now(), ID: r.Header.Get("Idempotency-Key"), To: to, Body: body})
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"sid":"SM%d","status":"queued"}`, time.Now().UnixNano())
	})
	f.srv = httptest.NewServer(mux)
	f.URL = f.srv.URL
	tb.Cleanup(f.srv.Close)
	return f
}

// SetLatency makes every answer take d.
func (f *SMSAPI) SetLatency(d time.Duration) { f.latency.Store(int64(d)) }

// SMTPServer is a fake SMTP server (no TLS, optional AUTH not required).
type SMTPServer struct {
	*Recorder
	Host string
	Port int
	srv  *smtp.Server
}

// NewSMTPServer starts the fake on a loopback port; it stops when the test ends.
func NewSMTPServer(tb testing.TB) *SMTPServer {
	tb.Helper()
	f := &SMTPServer{Recorder: newRecorder()}
	f.srv = smtp.NewServer(backend{f})
	f.srv.Domain = "localhost"
	f.srv.AllowInsecureAuth = true
	f.srv.ReadTimeout = 10 * time.Second
	f.srv.WriteTimeout = 10 * time.Second
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	f.Host, f.Port = "127.0.0.1", ln.Addr().(*net.TCPAddr).Port
	go f.srv.Serve(ln)
	tb.Cleanup(func() { f.srv.Close() })
	return f
}

type backend struct{ f *SMTPServer }

func (b backend) NewSession(*smtp.Conn) (smtp.Session, error) { return &session{f: b.f}, nil }

type session struct {
	f  *SMTPServer
	to []string
}

func (s *session) Reset()                                    { s.to = nil }
func (s *session) Logout() error                             { return nil }
func (s *session) Mail(string, *smtp.MailOptions) error      { return nil }
func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error { s.to = append(s.to, to); return nil }
func (s *session) Data(r io.Reader) error {
	raw, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	msg, err := mail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		return &smtp.SMTPError{Code: 554, Message: "unparseable message"}
	}
	body, _ := io.ReadAll(msg.Body)
	to := strings.Join(s.to, ",")
	if code, _ := s.f.decide(to, string(body)); code != 0 {
		s.f.wake()
		return &smtp.SMTPError{Code: code, EnhancedCode: smtp.EnhancedCodeNotSet, Message: "fake failure"}
	}
	id := strings.Trim(msg.Header.Get("Message-Id"), "<>")
	if at := strings.IndexByte(id, '@'); at > 0 {
		id = id[:at]
	}
	s.f.record(Delivery{At: time.Now(), ID: id, To: to, Body: string(body)})
	return nil
}
