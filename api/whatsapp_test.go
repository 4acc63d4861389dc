package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/apienv"
	"github.com/sluicehq/sluice/throttle"
)

// POST /v1/notifications takes WhatsApp templates; a free-form text only
// once its recipient has written to the tenant in the last 24 hours (422
// naming body before that, nothing enqueued).
func TestWhatsAppNotifications(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	tmpl := map[string]any{"channel": "whatsapp", "to": "+14155550100", "category": "marketing",
		"template": map[string]any{"name": "spring_sale", "language": "en_US", "params": []string{"Ann", "20%"}},
		"fallback": map[string]any{"channel": "sms", "to": "+14155550100", "body": "Spring sale: 20% off", "after": "2m"}}
	if r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], tmpl); r.Status != http.StatusAccepted {
		t.Fatalf("a template: %d %s", r.Status, r.Body)
	}
	text := map[string]any{"channel": "whatsapp", "to": "+14155550101", "body": "Your order shipped"}
	r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], text)
	if r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("a text outside the window: %d %s", r.Status, r.Body)
	}
	if p := r.Problem(t); len(p.InvalidParams) != 1 || p.InvalidParams[0].Name != "body" || p.InvalidParams[0].Pointer != "/body" {
		t.Fatalf("problem %+v: want body named", p)
	}
	if n := len(b.Queued(t)); n != 1 {
		t.Fatalf("%d queued, want the template alone", n)
	}
	lim, err := throttle.New(b.RDB, throttle.Options{Secret: []byte(apienv.SubjectSecret)})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	cs, err := consent.NewStore(b.RDB, lim, consent.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.RecordInbound(context.Background(), "acme", tasks.WhatsApp, "+14155550101", time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], text); r.Status != http.StatusAccepted {
		t.Fatalf("a text inside the window: %d %s", r.Status, r.Body)
	}
	// The window is the tenant's: globex's customer wrote to no one.
	if r := b.Do(t, "POST", "/v1/notifications", b.Tokens["globex"], text); r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("another tenant's text: %d %s", r.Status, r.Body)
	}
	both := map[string]any{"channel": "whatsapp", "to": "+14155550100", "body": "x", "template": map[string]any{"name": "a"}}
	if r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], both); r.Status != http.StatusBadRequest && r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("a template and a body: %d %s", r.Status, r.Body)
	}
}
