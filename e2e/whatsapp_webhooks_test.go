package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
)

// metaInbound is Meta's published sample of an inbound text message (the
// messages webhook reference), its id, timestamp and text placeholders.
const metaInbound = `{"object":"whatsapp_business_account","entry":[{"id":"102290129340398","changes":[{"value":{"messaging_product":"whatsapp",
"metadata":{"display_phone_number":"15550783881","phone_number_id":"106540352242922"},"contacts":[{"profile":{"name":"Sheena Nelson"},"wa_id":"FROM"}],
"messages":[{"from":"FROM","id":"wamid.ID","timestamp":"TS","type":"TYPE",TEXT}]},"field":"messages"}]}]}`

// hubSign is X-Hub-Signature-256 as Meta computes it, written here apart
// from sender/whatsapp's check.
func hubSign(secret string, body []byte) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write(body)
	return "sha256=" + hex.EncodeToString(m.Sum(nil))
}

func inbound(from, id, text string, button bool) []byte {
	part, typ := fmt.Sprintf(`"text":{"body":%q}`, text), "text"
	if button {
		part, typ = fmt.Sprintf(`"button":{"payload":%q,"text":%q}`, text, text), "button"
	}
	return []byte(strings.NewReplacer("FROM", strings.TrimPrefix(from, "+"), "wamid.ID", "wamid."+id, "TS", fmt.Sprint(time.Now().Unix()),
		"TYPE", typ, "TEXT", part).Replace(metaInbound))
}

// The real binaries: a tenant's signed WhatsApp webhook (set with `sluice
// webhook set`) opens a user's customer-service window — a free-form text
// is refused by the API before it and delivered after it — and STOP and
// "Stop promotions" block what they cover at the send; a tampered, replayed
// or cross-tenant delivery changes nothing; a text that reaches a worker
// outside the window is archived (outside_window), never sent.
func TestWhatsAppWebhooksWindowAndStop(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "whatsapp:recipient=100/1m")
	wa := fakes.NewWhatsAppAPI(t, fakes.WhatsAppLimits{})
	const number, acmeSecret, zetaSecret = "106540352242922", "a1b2c3d4e5f60718293a4b5c6d7e8f90", "0f9e8d7c6b5a49382716f5e4d3c2b1a0"
	for k, v := range map[string]string{"SLUICE_WHATSAPP_SENDER": "cloud", "SLUICE_WHATSAPP_BASE_URL": wa.URL,
		"SLUICE_WHATSAPP_ACCESS_TOKEN": wa.Token, "SLUICE_WHATSAPP_PHONE_NUMBER_ID": number} {
		e.vars[k] = v
	}
	a := e.startAPI(nil, "acme")
	e.worker("w0", nil)
	tok := a.tokens["acme"]
	e.sluiceRun(nil, "webhook", "set", "acme", "whatsapp", "--key", acmeSecret, "--phone-number-id", number, "--verify-token", "vt-acme")
	e.sluiceRun(nil, "webhook", "set", "zeta", "whatsapp", "--key", zetaSecret, "--phone-number-id", "999000111")
	hook := a.base + "/v1/webhooks/whatsapp/"

	resp, err := http.Get(hook + "acme?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=vt-acme")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "1158201444" {
		t.Fatalf("Meta's check of the URL: %d %q", resp.StatusCode, b)
	}

	const ann, bob = "+16505551234", "+16505559876"
	text := fmt.Sprintf(`{"channel":"whatsapp","to":%q,"body":"Your order shipped"}`, ann)
	if r := a.call("POST", "/v1/notifications", tok, text); r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("a text before Ann wrote: %d %s", r.Status, r.Body)
	}
	hello := inbound(ann, "hello", "Does it come in another color?", false)
	for name, c := range map[string]struct {
		route string
		body  []byte
		sig   string
		want  int
	}{
		"tampered":       {"acme", bytes.Replace(hello, []byte("another color"), []byte("another colour"), 1), hubSign(acmeSecret, hello), 403},
		"unsigned":       {"acme", hello, "", 403},
		"cross-tenant":   {"zeta", hello, hubSign(zetaSecret, hello), 403},
		"signed":         {"acme", hello, hubSign(acmeSecret, hello), 200},
		"signed, again":  {"acme", hello, hubSign(acmeSecret, hello), 200},
		"another key":    {"acme", hello, hubSign(zetaSecret, hello), 403},
		"no credentials": {"nobody", hello, hubSign(acmeSecret, hello), 404},
	} {
		headers := []string{}
		if c.sig != "" {
			headers = []string{"X-Hub-Signature-256", c.sig}
		}
		if code := postJSON(t, hook+c.route, c.body, headers...); code != c.want {
			t.Errorf("%s delivery: %d, want %d", name, code, c.want)
		}
	}
	wa.Inbound(ann, time.Now()) // Meta knows Ann wrote, too
	r := a.call("POST", "/v1/notifications", tok, text)
	if r.Status != http.StatusAccepted {
		t.Fatalf("a text after Ann wrote: %d %s", r.Status, r.Body)
	}
	var acc api.Accepted
	r.JSON(t, &acc)
	a.waitState(t, tok, acc.ID, 30*time.Second, api.StateSent, api.StateDelivered)

	// A text enqueued around the API, to Bob who never wrote: archived.
	direct := tasks.NewWhatsAppText("acme", bob, "hi")
	if _, err := tasks.Enqueue(context.Background(), e.client, e.keys, direct); err != nil {
		t.Fatal(err)
	}
	if st := a.waitState(t, tok, direct.ID, 30*time.Second, api.StateArchived, api.StateSent); st.Reason != tasks.ReasonWindow {
		t.Errorf("a text outside the window: %+v, want archived %s", st, tasks.ReasonWindow)
	}

	// STOP from Ann; "Stop promotions" from Bob.
	for _, d := range [][]byte{inbound(ann, "stop", "STOP", false), inbound(bob, "promo", "Stop promotions", true)} {
		if code := postJSON(t, hook+"acme", d, "X-Hub-Signature-256", hubSign(acmeSecret, d)); code != 200 {
			t.Fatalf("opt-out delivery: %d", code)
		}
	}
	template := func(to, category string) string {
		r := a.call("POST", "/v1/notifications", tok, fmt.Sprintf(`{"channel":"whatsapp","to":%q,"category":%q,"template":{"name":"news"}}`, to, category))
		if r.Status != http.StatusAccepted {
			t.Fatalf("template to %s: %d %s", to, r.Status, r.Body)
		}
		var acc api.Accepted
		r.JSON(t, &acc)
		return acc.ID
	}
	blocked := []string{template(ann, "utility"), template(bob, "marketing")}
	allowed := template(bob, "utility")
	a.waitState(t, tok, allowed, 30*time.Second, api.StateSent, api.StateDelivered)
	for _, id := range blocked {
		if st := a.waitState(t, tok, id, 30*time.Second, api.StateArchived, api.StateSent); st.Reason != tasks.ReasonSuppressed {
			t.Errorf("%s after an opt-out: %+v, want archived suppressed", id, st)
		}
	}
	got := map[string]bool{}
	for _, d := range wa.Deliveries() {
		got[d.ID] = true
	}
	for _, id := range append(blocked, direct.ID) {
		if got[id] {
			t.Errorf("the Cloud API received %s", id)
		}
	}
	if !got[acc.ID] || !got[allowed] || len(wa.Refused()) != 0 {
		t.Errorf("received %v, refused %v: want Ann's text and Bob's utility template, nothing refused", got, wa.Refused())
	}
	var sup struct {
		Ledger []struct{ Source, Keyword, Scope string } `json:"ledger"`
	}
	a.call("GET", "/v1/suppressions/whatsapp/"+bob, tok, nil).JSON(t, &sup)
	if len(sup.Ledger) != 1 || sup.Ledger[0].Scope != "marketing" || sup.Ledger[0].Source != "keyword" {
		t.Errorf("Bob's ledger %+v, want one opt-out of marketing", sup.Ledger)
	}
}

// Meta's throughput answer (130429) holds the business number for every
// worker and the message goes after the hold, its retries unspent; a
// message WhatsApp refuses for good (131026, undeliverable) sends its SMS
// fallback at once.
func TestWhatsAppHoldAndFallback(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "whatsapp:recipient=100/1m, sms:recipient=100/1m")
	wa := fakes.NewWhatsAppAPI(t, fakes.WhatsAppLimits{})
	const carl, dina = "+16505550101", "+16505550102"
	var throttledAt atomic.Int64 // unix ns of the one 130429
	wa.SetReply(func(to, _ string) (int, string) {
		switch {
		case to == carl && throttledAt.CompareAndSwap(0, time.Now().UnixNano()):
			return 130429, ""
		case to == dina:
			return 131026, ""
		}
		return 0, ""
	})
	w := e.worker("w0", map[string]string{"SLUICE_WHATSAPP_SENDER": "cloud", "SLUICE_WHATSAPP_BASE_URL": wa.URL,
		"SLUICE_WHATSAPP_ACCESS_TOKEN": wa.Token, "SLUICE_WHATSAPP_PHONE_NUMBER_ID": "106540352242922"})
	ctx := context.Background()
	c := tasks.NewWhatsAppTemplate("acme", carl, "order_shipped", "")
	d := tasks.NewWhatsAppTemplate("acme", dina, "order_shipped", "")
	d.Fallback = &tasks.Fallback{Channel: tasks.SMS, To: dina, Body: "Your order shipped"}
	for _, n := range []tasks.Notification{c, d} {
		if _, err := tasks.Enqueue(ctx, e.client, e.keys, n); err != nil {
			t.Fatal(err)
		}
	}
	got := wa.WaitCount(t, 1, 30*time.Second)
	throttled := time.Unix(0, throttledAt.Load())
	if got[0].ID != c.ID || got[0].At.Sub(throttled) < time.Second {
		t.Fatalf("Cloud API received %+v; want Carl's message at least the 1 s hold after the 130429 (%v)", got[0], throttled)
	}
	sms := e.sms.WaitCount(t, 1, 30*time.Second)
	if sms[0].ID != tasks.FallbackID(d.ID) || sms[0].To != dina {
		t.Fatalf("SMS API received %+v, want Dina's fallback", sms[0])
	}
	if !strings.Contains(w.logText(), "provider back-pressure") {
		t.Errorf("the worker logged no hold:\n%s", w.logText())
	}
	if n := len(wa.Deliveries()); n != 1 {
		t.Errorf("%d WhatsApp messages delivered, want Carl's alone", n)
	}
}
