package whatsapp_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/sender/whatsapp"
	"github.com/sluicehq/sluice/tasks"
)

// A Cloud API on loopback: it records each request and answers what the
// test sets.
type cloud struct {
	mu     sync.Mutex
	got    []map[string]any
	paths  []string
	auth   []string
	status int
	body   string
}

func (c *cloud) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	c.mu.Lock()
	c.got, c.paths, c.auth = append(c.got, m), append(c.paths, r.Method+" "+r.URL.Path), append(c.auth, r.Header.Get("Authorization"))
	status, body := c.status, c.body
	c.mu.Unlock()
	if status == 0 {
		status, body = 200, `{"messaging_product":"whatsapp","contacts":[{"input":"14155550100","wa_id":"14155550100"}],"messages":[{"id":"wamid.X"}]}`
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

func newSender(t *testing.T, c *cloud) *whatsapp.Sender {
	t.Helper()
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	s, err := whatsapp.NewSender(whatsapp.Config{BaseURL: srv.URL + "/v23.0", Token: "tok", From: "106540352242922", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSendsTemplatesAndText(t *testing.T) {
	c := &cloud{}
	s := newSender(t, c)
	n := tasks.NewWhatsAppTemplate("acme", "+14155550100", "order_shipped", "pt_BR", "Ann", "42")
	n.ID = "n1"
	if err := s.Send(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	txt := tasks.NewWhatsAppText("acme", "+14155550100", "On its way")
	txt.ID, txt.From = "n2", "222"
	if err := s.Send(context.Background(), txt); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{
		{"messaging_product": "whatsapp", "recipient_type": "individual", "to": "14155550100", "type": "template", "biz_opaque_callback_data": "n1",
			"template": map[string]any{"name": "order_shipped", "language": map[string]any{"code": "pt_BR"},
				"components": []any{map[string]any{"type": "body", "parameters": []any{
					map[string]any{"type": "text", "text": "Ann"}, map[string]any{"type": "text", "text": "42"}}}}}},
		{"messaging_product": "whatsapp", "recipient_type": "individual", "to": "14155550100", "type": "text", "biz_opaque_callback_data": "n2",
			"text": map[string]any{"body": "On its way"}},
	}
	if d := cmp.Diff(want, c.got); d != "" {
		t.Errorf("bodies (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"POST /v23.0/106540352242922/messages", "POST /v23.0/222/messages"}, c.paths); d != "" {
		t.Errorf("paths (-want +got):\n%s", d)
	}
	if c.auth[0] != "Bearer tok" {
		t.Errorf("Authorization %q", c.auth[0])
	}
}

// Meta's back-pressure codes hold the business number like a 429; a message
// outside the service window is refused for good; a 5xx is an unknown outcome.
func TestErrorCodes(t *testing.T) {
	for _, c := range []struct {
		status, code               int
		throttled, permanent, sent bool
		hold                       string
		retry                      time.Duration
	}{
		{400, whatsapp.CodePairRate, true, false, false, sender.HoldSender, whatsapp.PairRateWait},
		{400, whatsapp.CodeThroughput, true, false, false, sender.HoldSender, 0},
		{400, whatsapp.CodeUpgrading, true, false, false, sender.HoldSender, 0},
		{400, whatsapp.CodeReengagement, false, true, false, "", 0},
		{400, 100, false, true, false, "", 0},
		{429, 4, true, false, false, sender.HoldProvider, 0},
		{500, 1, false, false, true, "", 0},
	} {
		cl := &cloud{status: c.status, body: `{"error":{"message":"m","type":"OAuthException","code":` + itoa(c.code) + `,"error_data":{"details":"d"},"fbtrace_id":"f"}}`}
		err := newSender(t, cl).Send(context.Background(), tasks.NewWhatsAppTemplate("acme", "+14155550100", "hello_world", ""))
		var se *sender.SendError
		if !errors.As(err, &se) {
			t.Fatalf("code %d: %v is not a SendError", c.code, err)
		}
		if se.Throttled != c.throttled || se.Permanent != c.permanent || se.NotSent == c.sent || se.Hold != c.hold || se.RetryAfter != c.retry || se.Code != c.code {
			t.Errorf("code %d (HTTP %d): %+v", c.code, c.status, *se)
		}
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }
