// Package fakes runs real providers on loopback for tests: an HTTP server
// speaking the Twilio-compatible Messages API (which can also send Twilio's
// signed status callbacks) and an SMTP server (plain, STARTTLS or implicit
// TLS, optionally requiring AUTH). Both record every delivery with its
// arrival time and can be told to fail.
package fakes

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha1"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/mail"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Delivery is one message a fake provider accepted.
type Delivery struct {
	At time.Time // when the request arrived (the SMS API: before the latency it adds)
	// Answered is when the SMS API answered it, after the latency it adds
	// (zero for the other fakes).
	Answered time.Time
	ID       string // Idempotency-Key (SMS) or Message-ID local part (email)
	// Slot is the slot Sluice's limiter gave the send, by Redis's clock, as
	// SetSlots's function read it while the request was open (zero without
	// one, or when it could not be read).
	Slot time.Time
	To   string
	Body string
	// SMS only: the origin as posted — From, or MessagingServiceSID for a
	// message sent through a Messaging Service (a request names at least
	// one) —, the StatusCallback URL it asked for ("" if none), the SID the
	// fake gave the message, and the whole form as received.
	From                string
	MessagingServiceSID string
	StatusCallback      string
	SID                 string
	Form                url.Values
	// Email only: whether the message came over TLS (STARTTLS or implicit),
	// and the user it authenticated as ("" without AUTH).
	TLS      bool
	AuthUser string
	// Email only: the message exactly as received after DATA (headers and
	// body, CRLF line ends, dot-stuffing undone), and its parsed header
	// (fields as sent: not RFC 2047-decoded). Body is the part after the
	// header.
	Raw    []byte
	Header mail.Header
}

// Reply decides a fake's answer to one request: 0 accepts; for SMS an HTTP
// status, or a Twilio error code (10000 and up, e.g. 21211 "invalid To
// number"), answered like Twilio's refusals as HTTP 400 with
// {"code": CODE, ...}; for SMTP a reply code (e.g. 451, 550).
type Reply func(to, body string) (code int, retryAfter string)

// Recorder holds deliveries and wakes waiters.
type Recorder struct {
	mu         sync.Mutex
	deliveries []Delivery
	attempts   int
	reply      Reply
	notify     chan struct{}
	slots      func(id string) time.Time
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

// SetSlots makes the fake read each accepted request's slot with slot (by
// its ID), while the request is open — before the sender hears the answer
// and records the send done — and keep it in Delivery.Slot.
func (r *Recorder) SetSlots(slot func(id string) time.Time) {
	r.mu.Lock()
	r.slots = slot
	r.mu.Unlock()
}

func (r *Recorder) record(d Delivery) {
	r.mu.Lock()
	slot := r.slots
	r.mu.Unlock()
	if slot != nil {
		d.Slot = slot(d.ID)
	}
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

// Changed is signalled (at most one signal pending) when a request
// arrives or is answered: for a waiter watching two fakes at once. It is
// the signal WaitFor waits on; do not use both at once.
func (r *Recorder) Changed() <-chan struct{} { return r.notify }

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

// Count is how many deliveries arrived.
func (r *Recorder) Count() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.deliveries) }

// WaitCount waits until at least n deliveries arrived and returns them. It
// counts at each arrival and copies them once: copying (and sorting) every
// delivery at each arrival, as WaitFor does, made a benchmark's harness of
// 20,000 sends its own bottleneck.
func (r *Recorder) WaitCount(tb testing.TB, n int, timeout time.Duration) []Delivery {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for r.Count() < n {
		select {
		case <-r.notify:
		case <-deadline.C:
			tb.Fatalf("timed out after %v waiting for %d deliveries; %d deliveries, %d attempts", timeout, n, r.Count(), r.Attempts())
		}
	}
	return r.Deliveries()
}

// SMSAPI is a fake Twilio-compatible Messages API.
type SMSAPI struct {
	*Recorder
	// Latency is added before each answer (set before use or with SetLatency).
	latency    atomic.Int64
	inFlight   atomic.Int64 // requests being answered now
	peak       atomic.Int64 // the most at once
	fromMu     sync.Mutex
	fromIn     map[string]int // requests being answered now, by From
	URL        string         // base URL to give the sender
	AccountSID string
	AuthToken  string
	srvMu      sync.Mutex
	srv        *httptest.Server // nil while Down
	hold       io.Closer        // the port, while Down
	mux        *http.ServeMux

	cb       sync.Mutex
	plan     func(Delivery) []StatusUpdate
	results  []CallbackResult
	cbNotify chan struct{}
	cbCtx    context.Context
	cbWG     sync.WaitGroup
	client   *http.Client
}

// NewSMSAPI starts the fake on a loopback port; it stops when the test ends.
func NewSMSAPI(tb testing.TB) *SMSAPI {
	tb.Helper()
	f := &SMSAPI{Recorder: newRecorder(), AccountSID: "AC0123", AuthToken: "token-xyz", fromIn: map[string]int{},
		cbNotify: make(chan struct{}, 1), client: &http.Client{Timeout: 10 * time.Second}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /2010-04-01/Accounts/{sid}/Messages.json", func(w http.ResponseWriter, r *http.Request) {
		arrived := time.Now() // the receipt's time: before the latency the fake adds, which a loaded process overshoots
		user, pass, ok := r.BasicAuth()
		if !ok || user != f.AccountSID || pass != f.AuthToken || r.PathValue("sid") != f.AccountSID {
			http.Error(w, `{"message":"authenticate"}`, http.StatusUnauthorized)
			return
		}
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		n := f.inFlight.Add(1)
		defer f.inFlight.Add(-1)
		for p := f.peak.Load(); n > p && !f.peak.CompareAndSwap(p, n); p = f.peak.Load() {
		}
		from := r.PostForm.Get("From")
		f.fromMu.Lock()
		f.fromIn[from]++
		f.fromMu.Unlock()
		defer func() { f.fromMu.Lock(); f.fromIn[from]--; f.fromMu.Unlock() }()
		f.wake() // a request arrived: InFlightFrom waiters look
		form := r.PostForm
		to, body := form.Get("To"), form.Get("Body")
		if form.Get("From") == "" && form.Get("MessagingServiceSid") == "" {
			twilioError(w, 21603, "A 'From' or 'MessagingServiceSid' parameter is required")
			return
		}
		if d := time.Duration(f.latency.Load()); d > 0 {
			time.Sleep(d) // a provider that takes its time: sends are in flight meanwhile
		}
		if code, ra := f.decide(to, body); code != 0 {
			if ra != "" {
				w.Header().Set("Retry-After", ra)
			}
			if code >= 10000 {
				twilioError(w, code, "fake failure")
			} else {
				http.Error(w, `{"message":"fake failure"}`, code)
			}
			f.wake()
			return
		}
		d := Delivery{At: arrived, Answered: time.Now(), ID: r.Header.Get("Idempotency-Key"), To: to, Body: body,
			From: form.Get("From"), MessagingServiceSID: form.Get("MessagingServiceSid"), StatusCallback: form.Get("StatusCallback"),
			SID: newSID("SM"), Form: form}
		f.record(d)
		f.scheduleCallbacks(d)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"sid":%q,"status":"queued"}`, d.SID)
	})
	f.mux = mux
	f.srv = httptest.NewServer(mux)
	f.URL = f.srv.URL
	tb.Cleanup(func() {
		f.srvMu.Lock()
		defer f.srvMu.Unlock()
		if f.srv != nil {
			f.srv.Close()
		}
		if f.hold != nil {
			f.hold.Close()
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	f.cbCtx = ctx
	tb.Cleanup(func() { cancel(); f.cbWG.Wait() }) // runs before the server closes
	return f
}

// Down stops the fake's listener, as a provider whose front end is gone:
// connections to URL are refused until Up. Requests being answered finish.
// The port stays bound meanwhile (holdPort), so that no other test's
// listener takes it and answers in the provider's place.
func (f *SMSAPI) Down(tb testing.TB) {
	tb.Helper()
	f.srvMu.Lock()
	defer f.srvMu.Unlock()
	if f.srv == nil {
		return
	}
	addr := f.srv.Listener.Addr().String()
	f.srv.Close()
	f.srv = nil
	hold, err := holdPort(addr)
	if err != nil {
		tb.Fatalf("fake SMS API down: %v", err)
	}
	f.hold = hold
}

// Up listens on URL's address again after Down.
func (f *SMSAPI) Up(tb testing.TB) {
	tb.Helper()
	f.srvMu.Lock()
	defer f.srvMu.Unlock()
	if f.srv != nil {
		return
	}
	u, err := url.Parse(f.URL)
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", u.Host)
	if err != nil {
		tb.Fatalf("fake SMS API: listening on %s again: %v", u.Host, err)
	}
	f.srv = &httptest.Server{Listener: ln, Config: &http.Server{Handler: f.mux}}
	f.srv.Start()
	if f.hold != nil {
		f.hold.Close() // after the listen: the port was never free
		f.hold = nil
	}
}

// twilioError answers like Twilio refusing a message: HTTP 400 with its
// error code in a JSON body.
func twilioError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	fmt.Fprintf(w, `{"code":%d,"message":%q,"more_info":"https://www.twilio.com/docs/errors/%d","status":400}`, code, msg, code)
}

// newSID returns a Twilio-shaped SID: prefix and 32 hex digits.
func newSID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// StatusUpdate is one status callback: a message's new status (queued,
// sent, delivered, undelivered, failed, ...) and, for undelivered and
// failed, Twilio's error code (e.g. 30007 carrier filtering; 0: none).
type StatusUpdate struct {
	Status    string
	ErrorCode int
}

// CallbackResult is a status callback the fake sent and how it was answered.
type CallbackResult struct {
	At time.Time
	ID string // the message's Idempotency-Key (the notification id)
	StatusUpdate
	Code int   // the answer's HTTP status; 0 when the request failed
	Err  error // why the request failed
}

// SetCallbacks makes the fake, after accepting a message that names a
// StatusCallback URL, post the updates plan returns for it there, in order,
// one at a time, as Twilio does: signed form POSTs (see Sign). plan runs in
// the request's goroutine; nil sends none (tests may call SendCallback).
func (f *SMSAPI) SetCallbacks(plan func(Delivery) []StatusUpdate) {
	f.cb.Lock()
	f.plan = plan
	f.cb.Unlock()
}

func (f *SMSAPI) scheduleCallbacks(d Delivery) {
	f.cb.Lock()
	plan := f.plan
	f.cb.Unlock()
	if plan == nil || d.StatusCallback == "" {
		return
	}
	updates := plan(d)
	if len(updates) == 0 {
		return
	}
	f.cbWG.Add(1)
	go func() {
		defer f.cbWG.Done()
		for _, u := range updates {
			code, err := f.SendCallback(f.cbCtx, d, u)
			f.cb.Lock()
			f.results = append(f.results, CallbackResult{At: time.Now(), ID: d.ID, StatusUpdate: u, Code: code, Err: err})
			f.cb.Unlock()
			select {
			case f.cbNotify <- struct{}{}:
			default:
			}
		}
	}()
}

// CallbackResults returns the callbacks SetCallbacks's plan sent so far.
func (f *SMSAPI) CallbackResults() []CallbackResult {
	f.cb.Lock()
	defer f.cb.Unlock()
	return slices.Clone(f.results)
}

// WaitCallbacks waits until at least n planned callbacks were answered (or
// failed), or fails the test after timeout.
func (f *SMSAPI) WaitCallbacks(tb testing.TB, n int, timeout time.Duration) []CallbackResult {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		rs := f.CallbackResults()
		if len(rs) >= n {
			return rs
		}
		select {
		case <-f.cbNotify:
		case <-deadline.C:
			tb.Fatalf("timed out after %v waiting for %d status callbacks; %d sent: %+v", timeout, n, len(rs), rs)
		}
	}
}

// CallbackParams is the form Twilio posts to report u about d: MessageSid
// (and its legacy twin SmsSid), MessageStatus (and SmsStatus), AccountSid,
// From (for a Messaging Service, the pool's number that sent it), To,
// ApiVersion, MessagingServiceSid when the message went through one, and
// ErrorCode when u has one.
func (f *SMSAPI) CallbackParams(d Delivery, u StatusUpdate) url.Values {
	from := d.From
	if from == "" {
		from = "+15005550006" // the number the service picked from its pool
	}
	v := url.Values{
		"MessageSid": {d.SID}, "SmsSid": {d.SID}, "AccountSid": {f.AccountSID},
		"MessageStatus": {u.Status}, "SmsStatus": {u.Status},
		"From": {from}, "To": {d.To}, "ApiVersion": {"2010-04-01"},
	}
	if d.MessagingServiceSID != "" {
		v.Set("MessagingServiceSid", d.MessagingServiceSID)
	}
	if u.ErrorCode != 0 {
		v.Set("ErrorCode", strconv.Itoa(u.ErrorCode))
	}
	return v
}

// SendCallback posts u about d to d.StatusCallback now, signed with the
// fake's auth token, and returns the answer's HTTP status.
func (f *SMSAPI) SendCallback(ctx context.Context, d Delivery, u StatusUpdate) (int, error) {
	if d.StatusCallback == "" {
		return 0, errors.New("fakes: the message asked for no status callback")
	}
	params := f.CallbackParams(d, u)
	return f.PostCallback(ctx, d.StatusCallback, params, Sign(f.AuthToken, d.StatusCallback, params))
}

// PostCallback posts params as a form to callbackURL with signature as
// X-Twilio-Signature (none when empty): for tests of forged or damaged
// callbacks.
func (f *SMSAPI) PostCallback(ctx context.Context, callbackURL string, params url.Values, signature string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, callbackURL, strings.NewReader(params.Encode()))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("User-Agent", "TwilioProxy/1.1")
	if signature != "" {
		req.Header.Set("X-Twilio-Signature", signature)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// Sign computes Twilio's X-Twilio-Signature of a form POST to fullURL:
// the URL exactly as the request was addressed (scheme, host, port if
// any, path and query), followed by every POST parameter sorted by name,
// each name immediately followed by its value (a repeated name: each
// distinct value once, sorted), signed with HMAC-SHA1 keyed by the auth
// token and encoded in standard base64.
//
// It is written apart from the API's check on purpose: the two meet only
// in the tests, and in Twilio's published examples.
func Sign(authToken, fullURL string, params url.Values) string {
	names := make([]string, 0, len(params))
	for k := range params {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString(fullURL)
	for _, k := range names {
		vs := slices.Clone(params[k])
		sort.Strings(vs)
		for i, v := range vs {
			if i > 0 && v == vs[i-1] {
				continue
			}
			b.WriteString(k)
			b.WriteString(v)
		}
	}
	m := hmac.New(sha1.New, []byte(authToken))
	m.Write([]byte(b.String()))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// PeakInFlight is the most message requests the fake was answering at once
// (a request counts from its arrival to its answer, latency included).
func (f *SMSAPI) PeakInFlight() int { return int(f.peak.Load()) }

// InFlightFrom is how many message requests from that From the fake is answering now.
func (f *SMSAPI) InFlightFrom(from string) int {
	f.fromMu.Lock()
	defer f.fromMu.Unlock()
	return f.fromIn[from]
}

// SetLatency makes every answer take d.
func (f *SMSAPI) SetLatency(d time.Duration) { f.latency.Store(int64(d)) }

// SMTPServer is a fake SMTP server. By default it speaks plain SMTP and does
// not ask for AUTH; SMTPOptions add STARTTLS, implicit TLS and required AUTH.
type SMTPServer struct {
	*Recorder
	Host string
	Port int
	srv  *smtp.Server

	implicitTLS *tls.Config
	user, pass  string
	mechs       []string
	rcptReply   func(to string) int // under Recorder.mu; nil: accept
}

// SMTPOption configures NewSMTPServer.
type SMTPOption func(*SMTPServer)

// WithSTARTTLS offers STARTTLS, presenting cfg's certificate. A client may
// still send without it; Delivery.TLS tells which it did.
func WithSTARTTLS(cfg *tls.Config) SMTPOption {
	return func(f *SMTPServer) { f.srv.TLSConfig = cfg }
}

// WithImplicitTLS speaks TLS from the first byte (SMTPS, as on port 465),
// presenting cfg's certificate.
func WithImplicitTLS(cfg *tls.Config) SMTPOption {
	return func(f *SMTPServer) { f.implicitTLS = cfg }
}

// WithAuth requires AUTH as user/password before MAIL, offering mechs
// (default PLAIN and LOGIN). AUTH is offered over plain connections too, so
// that a test sees whether the client chose TLS before sending its password.
func WithAuth(user, pass string, mechs ...string) SMTPOption {
	if len(mechs) == 0 {
		mechs = []string{sasl.Plain, sasl.Login}
	}
	return func(f *SMTPServer) { f.user, f.pass, f.mechs = user, pass, mechs }
}

// NewSMTPServer starts the fake on a loopback port; it stops when the test ends.
func NewSMTPServer(tb testing.TB, opts ...SMTPOption) *SMTPServer {
	tb.Helper()
	f := &SMTPServer{Recorder: newRecorder()}
	f.srv = smtp.NewServer(backend{f})
	f.srv.Domain = "localhost"
	f.srv.AllowInsecureAuth = true
	f.srv.ReadTimeout = 10 * time.Second
	f.srv.WriteTimeout = 10 * time.Second
	for _, o := range opts {
		o(f)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	f.Host, f.Port = "127.0.0.1", ln.Addr().(*net.TCPAddr).Port
	if f.implicitTLS != nil {
		ln = tls.NewListener(ln, f.implicitTLS)
	}
	go f.srv.Serve(ln)
	tb.Cleanup(func() { f.srv.Close() })
	return f
}

type backend struct{ f *SMTPServer }

func (b backend) NewSession(c *smtp.Conn) (smtp.Session, error) {
	return &session{f: b.f, conn: c}, nil
}

type session struct {
	f    *SMTPServer
	conn *smtp.Conn
	user string // authenticated as
	to   []string
}

// The replies of RFC 4954.
var (
	errAuthRequired   = &smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 0}, Message: "authentication required"}
	errBadCredentials = &smtp.SMTPError{Code: 535, EnhancedCode: smtp.EnhancedCode{5, 7, 8}, Message: "authentication credentials invalid"}
)

func (s *session) AuthMechanisms() []string { return s.f.mechs }

func (s *session) Auth(mech string) (sasl.Server, error) {
	check := func(user, pass string) error {
		if s.f.user == "" || user != s.f.user || pass != s.f.pass {
			return errBadCredentials
		}
		s.user = user
		return nil
	}
	switch mech {
	case sasl.Plain:
		return sasl.NewPlainServer(func(_, user, pass string) error { return check(user, pass) }), nil
	case sasl.Login:
		return &loginServer{check: check}, nil
	}
	return nil, smtp.ErrAuthUnknownMechanism
}

// loginServer is the server side of SASL LOGIN (go-sasl has only the client).
type loginServer struct {
	step  int
	user  string
	check func(user, pass string) error
}

func (l *loginServer) Next(resp []byte) ([]byte, bool, error) {
	switch l.step {
	case 0:
		l.step++
		if len(resp) == 0 {
			return []byte("Username:"), false, nil
		}
		fallthrough // the username came as initial response
	case 1:
		l.user, l.step = string(resp), 2
		return []byte("Password:"), false, nil
	case 2:
		l.step++
		return nil, true, l.check(l.user, string(resp))
	}
	return nil, false, errors.New("LOGIN: unexpected response")
}

func (s *session) Reset()        { s.to = nil }
func (s *session) Logout() error { return nil }
func (s *session) Mail(string, *smtp.MailOptions) error {
	if s.f.user != "" && s.user == "" {
		return errAuthRequired
	}
	return nil
}
func (s *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.f.mu.Lock()
	refuse := s.f.rcptReply
	s.f.mu.Unlock()
	if refuse != nil {
		if code := refuse(to); code != 0 {
			s.f.mu.Lock()
			s.f.attempts++
			s.f.mu.Unlock()
			s.f.wake()
			return &smtp.SMTPError{Code: code, EnhancedCode: smtp.EnhancedCodeNotSet, Message: "fake refusal of the recipient"}
		}
	}
	s.to = append(s.to, to)
	return nil
}

// SetRcptReply sets how the fake answers RCPT TO from now on: a non-zero
// code refuses the recipient with it (e.g. 550, no such mailbox); nil
// accepts every recipient.
func (f *SMTPServer) SetRcptReply(reply func(to string) int) {
	f.mu.Lock()
	f.rcptReply = reply
	f.mu.Unlock()
}
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
	_, overTLS := s.conn.TLSConnectionState()
	s.f.record(Delivery{At: time.Now(), ID: id, To: to, Body: string(body), TLS: overTLS, AuthUser: s.user,
		Raw: raw, Header: msg.Header})
	return nil
}
