package whatsapp_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/sender/inbound"
	"github.com/sluicehq/sluice/sender/whatsapp"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/webhook"
)

// Meta's published sample of a text message webhook (the messages webhook
// reference, "Incoming messages"), with its timestamp as a placeholder.
const metaTextSample = `{
  "object": "whatsapp_business_account",
  "entry": [
    {
      "id": "102290129340398",
      "changes": [
        {
          "value": {
            "messaging_product": "whatsapp",
            "metadata": {
              "display_phone_number": "15550783881",
              "phone_number_id": "106540352242922"
            },
            "contacts": [
              {
                "profile": {
                  "name": "Sheena Nelson"
                },
                "wa_id": "16505551234"
              }
            ],
            "messages": [
              {
                "from": "16505551234",
                "id": "wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQTRBNjU5OUFFRTAzODEwMTQ0RgA=",
                "timestamp": "TS",
                "type": "text",
                "text": {
                  "body": "BODY"
                }
              }
            ]
          },
          "field": "messages"
        }
      ]
    }
  ]
}`

// Meta's published sample of a quick-reply button tap, as "Stop promotions"
// arrives (type button, its text and payload).
const metaButtonSample = `{"object":"whatsapp_business_account","entry":[{"id":"102290129340398","changes":[{"value":{"messaging_product":"whatsapp",
"metadata":{"display_phone_number":"15550783881","phone_number_id":"106540352242922"},"contacts":[{"profile":{"name":"Sheena Nelson"},"wa_id":"16505551234"}],
"messages":[{"context":{"from":"15550783881","id":"wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBI3NjVBMzc4QzA2RjVGMzRFQzQA"},"from":"16505551234",
"id":"wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQUM5OTI0N0Y0QjNDMzBEMjU0QQA=","timestamp":"TS","type":"button",
"button":{"payload":"Stop promotions","text":"Stop promotions"}}]},"field":"messages"}]}]}`

// Meta's published sample of a status webhook (a message delivered), the
// notification id in biz_opaque_callback_data.
const metaStatusSample = `{"object":"whatsapp_business_account","entry":[{"id":"102290129340398","changes":[{"value":{"messaging_product":"whatsapp",
"metadata":{"display_phone_number":"15550783881","phone_number_id":"106540352242922"},
"statuses":[{"id":"wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBI3MTE5MjVBOTE3MDk5QUVFM0YA","status":"delivered","timestamp":"TS",
"recipient_id":"16505551234","biz_opaque_callback_data":"ID","pricing":{"billable":true,"pricing_model":"PMP","category":"marketing"}}]},"field":"messages"}]}]}`

type hooks struct {
	url     string
	failed  chan string // OnFailed's ids
	consent *consent.Store
	lim     *throttle.Limiter
	dlv     *delivery.Store
}

const (
	acmeSecret = "a1b2c3d4e5f60718293a4b5c6d7e8f90" // Meta app secrets are 32 hex digits
	zetaSecret = "0f9e8d7c6b5a49382716f5e4d3c2b1a0"
)

func setupHooks(t *testing.T) *hooks {
	t.Helper()
	_, rdb := redistest.New(t)
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte("whatsapp-test-secret-0123")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	cs, err := consent.NewStore(rdb, lim, consent.Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := tasks.ParseKeyring(tasks.NewKeySpec("wa"))
	if err != nil {
		t.Fatal(err)
	}
	creds := webhook.NewStore(rdb, keys)
	ctx := context.Background()
	for tenant, c := range map[string]webhook.Credentials{
		"acme": {Key: acmeSecret, PhoneNumberIDs: []string{"106540352242922"}, VerifyToken: "acme-verify"},
		"zeta": {Key: zetaSecret, PhoneNumberIDs: []string{"999000111"}},
	} {
		if err := creds.Set(ctx, tenant, whatsapp.CredentialsChecker{}, c); err != nil {
			t.Fatal(err)
		}
	}
	policy, err := plans.Parse("")
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	dlv := delivery.NewStore(rdb, lim)
	failed := make(chan string, 8)
	h, err := whatsapp.NewWebhooks(whatsapp.Deps{OnFailed: func(_ context.Context, tenant, id string) { failed <- tenant + "/" + id }, Creds: creds, Guard: webhook.NewGuard(rdb), Consent: cs,
		Inbound: inbound.New(cs, func() plans.Policy { return policy }, nil, log), Delivery: dlv, Limiter: lim,
		Log: log, Registry: prometheus.NewRegistry(), RecordTTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc(whatsapp.VerifyRoute, h.Verify)
	mux.Handle(whatsapp.WebhookRoute, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &hooks{url: srv.URL, failed: failed, consent: cs, lim: lim, dlv: dlv}
}

func sample(tmpl, body string, at time.Time) []byte {
	s := strings.ReplaceAll(tmpl, `"TS"`, fmt.Sprintf(`"%d"`, at.Unix()))
	return []byte(strings.ReplaceAll(s, "BODY", body))
}

func (h *hooks) post(t *testing.T, tenant string, body []byte, sig string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.url+"/v1/webhooks/whatsapp/"+tenant, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if sig != "" {
		req.Header.Set(whatsapp.SignatureHeader, sig)
	}
	resp, err := sluicetest.Client(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const user = "+16505551234"

// fixedTime is a webhook timestamp for the fuzz seeds.
var fixedTime = time.Unix(1749416383, 0)

// Meta's samples, signed with the tenant's app secret, are taken: the
// sender's service window opens, STOP opts it out of WhatsApp, "Stop
// promotions" of marketing only; a replay records nothing again.
func TestWebhookSamplesAccepted(t *testing.T) {
	h := setupHooks(t)
	ctx := context.Background()
	now := time.Now()
	body := sample(metaTextSample, "Does it come in another color?", now.Add(-time.Minute))
	if code, b := h.post(t, "acme", body, whatsapp.Sign(acmeSecret, body)); code != 200 || !strings.Contains(b, `"recorded":1`) {
		t.Fatalf("Meta's text sample: %d %s", code, b)
	}
	w, err := h.consent.Window(ctx, "acme", tasks.WhatsApp, user)
	if err != nil || !w.Open(now) || w.LastInbound.Unix() != now.Add(-time.Minute).Unix() {
		t.Fatalf("service window %+v, %v: want open from the message", w, err)
	}
	if code, b := h.post(t, "acme", body, whatsapp.Sign(acmeSecret, body)); code != 200 || !strings.Contains(b, `"duplicate":true`) {
		t.Fatalf("the same delivery again: %d %s, want 200 duplicate", code, b)
	}
	btn := sample(metaButtonSample, "", now)
	if code, b := h.post(t, "acme", btn, whatsapp.Sign(acmeSecret, btn)); code != 200 {
		t.Fatalf("Stop promotions: %d %s", code, b)
	}
	v, _ := h.consent.Check(ctx, "acme", tasks.WhatsApp, user, "marketing", false)
	u, _ := h.consent.Check(ctx, "acme", tasks.WhatsApp, user, "orders", false)
	if !v.Blocked() || u.Blocked() {
		t.Fatalf("after Stop promotions: marketing blocked %v (want true), orders blocked %v (want false)", v.Blocked(), u.Blocked())
	}
	if code, _ := h.post(t, "acme", btn, whatsapp.Sign(acmeSecret, btn)); code != 200 {
		t.Fatal("replayed button")
	}
	ledger, err := h.consent.Ledger(ctx, "acme", tasks.WhatsApp, user)
	if err != nil || len(ledger) != 1 {
		t.Fatalf("ledger %+v, %v: want the one opt-out, not its replay", ledger, err)
	}
	stop := sample(strings.Replace(metaTextSample, "wamid.HBgLMTY1MDM4Nzk0MzkVAgASGBQzQTRBNjU5OUFFRTAzODEwMTQ0RgA=", "wamid.stop1", 1), "STOP", now)
	if code, b := h.post(t, "acme", stop, whatsapp.Sign(acmeSecret, stop)); code != 200 {
		t.Fatalf("STOP: %d %s", code, b)
	}
	if v, _ := h.consent.Check(ctx, "acme", tasks.WhatsApp, user, "orders", false); !v.Blocked() {
		t.Fatal("STOP did not opt the user out of every category")
	}
	if v, _ := h.consent.Check(ctx, "acme", tasks.SMS, user, "orders", false); v.Blocked() {
		t.Fatal("a WhatsApp STOP opted the number out of SMS")
	}
}

// Tampered, unsigned, replayed-after-the-guard (stale), cross-tenant and
// wrongly keyed deliveries record nothing.
func TestWebhookRefusals(t *testing.T) {
	h := setupHooks(t)
	ctx := context.Background()
	now := time.Now()
	stop := sample(metaTextSample, "STOP", now)
	sig := whatsapp.Sign(acmeSecret, stop)
	tampered := bytes.Replace(stop, []byte("16505551234"), []byte("16505551235"), 1)
	for name, c := range map[string]struct {
		tenant string
		body   []byte
		sig    string
		want   int
	}{
		"tampered":            {"acme", tampered, sig, 403},
		"unsigned":            {"acme", stop, "", 403},
		"another key":         {"acme", stop, whatsapp.Sign(zetaSecret, stop), 403},
		"another tenant":      {"zeta", stop, whatsapp.Sign(zetaSecret, stop), 403}, // zeta does not own 106540352242922
		"acme's, to zeta":     {"zeta", stop, sig, 403},
		"no credentials":      {"nobody", stop, sig, 404},
		"not whatsapp's JSON": {"acme", []byte(`{"object":"page"}`), whatsapp.Sign(acmeSecret, []byte(`{"object":"page"}`)), 400},
	} {
		if code, b := h.post(t, c.tenant, c.body, c.sig); code != c.want {
			t.Errorf("%s: %d %s, want %d", name, code, b, c.want)
		}
	}
	old := sample(metaTextSample, "STOP", now.Add(-whatsapp.ReplayTTL-time.Hour))
	if code, b := h.post(t, "acme", old, whatsapp.Sign(acmeSecret, old)); code != 200 || !strings.Contains(b, `"recorded":0`) {
		t.Errorf("an event older than the replay guard: %d %s, want 200 and nothing recorded", code, b)
	}
	for _, tenant := range []string{"acme", "zeta"} {
		if v, _ := h.consent.Check(ctx, tenant, tasks.WhatsApp, user, "orders", false); v.Blocked() {
			t.Errorf("%s: a refused delivery opted the user out", tenant)
		}
		if w, _ := h.consent.Window(ctx, tenant, tasks.WhatsApp, user); !w.LastInbound.IsZero() {
			t.Errorf("%s: a refused delivery opened the service window", tenant)
		}
	}
}

// Meta's check of the URL gets the challenge back with the tenant's token only.
func TestWebhookVerification(t *testing.T) {
	h := setupHooks(t)
	get := func(tenant, token string) (int, string) {
		resp, err := http.Get(h.url + "/v1/webhooks/whatsapp/" + tenant + "?hub.mode=subscribe&hub.challenge=1158201444&hub.verify_token=" + token)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, b := get("acme", "acme-verify"); code != 200 || b != "1158201444" {
		t.Fatalf("right token: %d %q", code, b)
	}
	for _, c := range [][2]string{{"acme", "wrong"}, {"zeta", "acme-verify"}, {"zeta", ""}} {
		if code, _ := get(c[0], c[1]); code != 403 {
			t.Errorf("tenant %s, token %q: %d, want 403", c[0], c[1], code)
		}
	}
}

// A status webhook is recorded on the notification it names, once.
func TestWebhookStatus(t *testing.T) {
	h := setupHooks(t)
	ctx := context.Background()
	id := tasks.NewID()
	d, err := h.lim.Reserve(ctx, "acme", id, throttle.ReserveOptions{}, throttle.Limit{Scope: "whatsapp:tenant", Rule: throttle.PerMinute(10)})
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	body := []byte(strings.ReplaceAll(string(sample(metaStatusSample, "", time.Now())), `"ID"`, `"`+id+`"`))
	if code, b := h.post(t, "acme", body, whatsapp.Sign(acmeSecret, body)); code != 200 || !strings.Contains(b, `"recorded":1`) {
		t.Fatalf("status: %d %s", code, b)
	}
	rec, err := h.dlv.Get(ctx, "acme", id)
	if err != nil || rec == nil || rec.Status != delivery.Delivered {
		t.Fatalf("delivery record %+v, %v", rec, err)
	}
	select {
	case f := <-h.failed:
		t.Fatalf("a delivered message ran its fallback (%s)", f)
	default:
	}
	// A failed message (another one) runs its fallback: OnFailed.
	id2 := tasks.NewID()
	if _, err := h.lim.Reserve(ctx, "acme", id2, throttle.ReserveOptions{}, throttle.Limit{Scope: "whatsapp:tenant", Rule: throttle.PerMinute(10)}); err != nil {
		t.Fatal(err)
	}
	failedBody := strings.NewReplacer(`"ID"`, `"`+id2+`"`, `"delivered"`, `"failed","errors":[{"code":131026,"title":"Message undeliverable"}]`,
		"wamid.HBgLMTY1MDM4Nzk0MzkVAgARGBI3MTE5MjVBOTE3MDk5QUVFM0YA", "wamid.other").Replace(string(sample(metaStatusSample, "", time.Now())))
	if code, b := h.post(t, "acme", []byte(failedBody), whatsapp.Sign(acmeSecret, []byte(failedBody))); code != 200 {
		t.Fatalf("failed status: %d %s", code, b)
	}
	if f := <-h.failed; f != "acme/"+id2 {
		t.Fatalf("OnFailed(%s), want acme/%s", f, id2)
	}
	if rec, _ := h.dlv.Get(ctx, "acme", id2); rec == nil || rec.Status != delivery.Failed || rec.ErrorCode != 131026 {
		t.Fatalf("failed record %+v", rec)
	}
}
