package fakes

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TelnyxAPI is a fake of Telnyx's Messages API v2 (POST /v2/messages, JSON,
// bearer auth) that records every message it accepts, and signs webhooks
// as Telnyx does: Ed25519, by its own key, over the telnyx-timestamp
// header's value, "|" and the body, base64 in telnyx-signature-ed25519.
// The signer is written here from Telnyx's documentation, apart from the
// API's check; the two meet only in the tests.
type TelnyxAPI struct {
	*Recorder
	URL       string // base URL to give the sender
	APIKey    string
	PublicKey string // base64, for SLUICE_TELNYX_PUBLIC_KEY
	key       ed25519.PrivateKey
	srv       *httptest.Server
	client    *http.Client

	mu    sync.Mutex
	plan  func(Delivery) []string // recipient statuses to report, in order
	sent  []TelnyxWebhook
	clock func() time.Time
	wg    sync.WaitGroup
}

// TelnyxWebhook is a webhook the fake sent and its answer.
type TelnyxWebhook struct {
	ID, Status string
	Code       int
	Err        error
}

// NewTelnyxAPI starts the fake on a loopback port; it stops when the test ends.
func NewTelnyxAPI(tb testing.TB) *TelnyxAPI {
	tb.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	f := &TelnyxAPI{Recorder: newRecorder(), APIKey: "KEY0123456789", PublicKey: base64.StdEncoding.EncodeToString(pub), key: priv,
		client: &http.Client{Timeout: 10 * time.Second}, clock: time.Now}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v2/messages", f.messages)
	f.srv = httptest.NewServer(mux)
	f.URL = f.srv.URL
	tb.Cleanup(f.srv.Close)
	tb.Cleanup(f.wg.Wait) // runs before the server closes
	return f
}

func (f *TelnyxAPI) messages(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Authorization") != "Bearer "+f.APIKey {
		telnyxError(w, http.StatusUnauthorized, 10009, "Authentication failed")
		return
	}
	var m struct {
		From, To, Text     string
		MessagingProfileID string `json:"messaging_profile_id"`
		WebhookURL         string `json:"webhook_url"`
	}
	if err := json.NewDecoder(r.Body).Decode(&m); err != nil || m.To == "" || m.Text == "" {
		telnyxError(w, http.StatusBadRequest, 10015, "Bad Request")
		return
	}
	if code, ra := f.decide(m.To, m.Text); code != 0 {
		if ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		status := code
		if code >= 10000 {
			status = http.StatusBadRequest
		}
		telnyxError(w, status, code, "fake failure")
		f.wake()
		return
	}
	d := Delivery{At: time.Now(), ID: r.Header.Get("Idempotency-Key"), To: m.To, Body: m.Text, From: m.From,
		StatusCallback: m.WebhookURL, SID: newUUID()}
	f.record(d)
	f.schedule(d)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"data":{"record_type":"message","id":%q,"type":"SMS","direction":"outbound","from":{"phone_number":%q},"to":[{"phone_number":%q,"status":"queued"}],"text":%q}}`,
		d.SID, d.From, d.To, d.Body)
}

func telnyxError(w http.ResponseWriter, status, code int, title string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"errors":[{"code":"%d","title":%q,"detail":"fake"}]}`, code, title)
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// SetReports makes the fake, after accepting a message that names a
// webhook_url, report the recipient statuses plan returns (sent,
// delivered, delivery_failed, ...), in order: message.sent for sent,
// message.finalized for the rest.
func (f *TelnyxAPI) SetReports(plan func(Delivery) []string) {
	f.mu.Lock()
	f.plan = plan
	f.mu.Unlock()
}

func (f *TelnyxAPI) schedule(d Delivery) {
	f.mu.Lock()
	plan := f.plan
	f.mu.Unlock()
	if plan == nil || d.StatusCallback == "" {
		return
	}
	statuses := plan(d)
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for _, st := range statuses {
			code, err := f.Report(context.Background(), d, st, 0)
			f.mu.Lock()
			f.sent = append(f.sent, TelnyxWebhook{ID: d.ID, Status: st, Code: code, Err: err})
			f.mu.Unlock()
			f.wake()
		}
	}()
}

// Reports returns the delivery reports SetReports's plan sent so far.
func (f *TelnyxAPI) Reports() []TelnyxWebhook {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]TelnyxWebhook(nil), f.sent...)
}

// Report posts a delivery report about d with the recipient status st (and
// error code, 0 for none) to d's webhook_url, signed; it returns the
// answer's status.
func (f *TelnyxAPI) Report(ctx context.Context, d Delivery, st string, code int) (int, error) {
	typ := "message.finalized"
	if st == "sent" || st == "queued" || st == "sending" {
		typ = "message.sent"
	}
	errs := "[]"
	if code != 0 {
		errs = fmt.Sprintf(`[{"code":"%d","title":"fake","detail":"fake"}]`, code)
	}
	body := fmt.Sprintf(`{"data":{"event_type":%q,"id":%q,"occurred_at":%q,"payload":{"id":%q,"type":"SMS","direction":"outbound","from":{"phone_number":%q},"to":[{"phone_number":%q,"status":%q}],"text":%q,"errors":%s},"record_type":"event"},"meta":{"attempt":1,"delivered_to":%q}}`,
		typ, newUUID(), time.Now().UTC().Format(time.RFC3339), d.SID, d.From, d.To, st, d.Body, errs, d.StatusCallback)
	return f.Post(ctx, d.StatusCallback, []byte(body), f.clock())
}

// Inbound posts a message.received webhook — from wrote text to the
// tenant's number to — to url, signed; it returns the answer's status.
func (f *TelnyxAPI) Inbound(ctx context.Context, url, from, to, text string) (int, error) {
	body := fmt.Sprintf(`{"data":{"event_type":"message.received","id":%q,"occurred_at":%q,"payload":{"id":%q,"type":"SMS","direction":"inbound","from":{"phone_number":%q,"carrier":"T-Mobile USA","line_type":"Wireless"},"to":[{"phone_number":%q,"status":"webhook_delivered"}],"text":%q,"errors":[]},"record_type":"event"},"meta":{"attempt":1,"delivered_to":%q}}`,
		newUUID(), time.Now().UTC().Format(time.RFC3339), newUUID(), from, to, text, url)
	return f.Post(ctx, url, []byte(body), f.clock())
}

// Sign is the signature headers of body sent at t.
func (f *TelnyxAPI) Sign(body []byte, t time.Time) (signature, timestamp string) {
	ts := strconv.FormatInt(t.Unix(), 10)
	return base64.StdEncoding.EncodeToString(ed25519.Sign(f.key, append([]byte(ts+"|"), body...))), ts
}

// Post posts body to url signed at t (a zero t: unsigned), for tests of
// forged, stale and replayed webhooks.
func (f *TelnyxAPI) Post(ctx context.Context, url string, body []byte, t time.Time) (int, error) {
	return f.PostWith(ctx, url, body, t, f.key)
}

// PostWith is Post signing with another key (a forgery).
func (f *TelnyxAPI) PostWith(ctx context.Context, url string, body []byte, t time.Time, key ed25519.PrivateKey) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "telnyx-webhooks")
	if !t.IsZero() {
		ts := strconv.FormatInt(t.Unix(), 10)
		req.Header.Set("telnyx-timestamp", ts)
		req.Header.Set("telnyx-signature-ed25519", base64.StdEncoding.EncodeToString(ed25519.Sign(key, append([]byte(ts+"|"), body...))))
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}
