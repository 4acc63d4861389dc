package fakes_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// The fake enforces Meta's limits itself and answers with Meta's codes.
func TestWhatsAppFakeEnforcesMetasLimits(t *testing.T) {
	f := fakes.NewWhatsAppAPI(t, fakes.WhatsAppLimits{Portfolio: 2, Window: time.Hour, PairCount: 1, PairWindow: time.Hour, Throughput: 3})
	send := func(number, to string, template bool) int {
		t.Helper()
		m := map[string]any{"messaging_product": "whatsapp", "to": to, "type": "text", "text": map[string]string{"body": "hi"}}
		if template {
			m = map[string]any{"messaging_product": "whatsapp", "to": to, "type": "template", "template": map[string]any{"name": "t", "language": map[string]string{"code": "en_US"}}}
		}
		b, _ := json.Marshal(m)
		req, _ := http.NewRequest("POST", f.URL+"/"+number+"/messages", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+f.Token)
		resp, err := sluicetest.Client(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e struct{ Error struct{ Code int } }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return e.Error.Code
	}
	if c := send("1", "14155550100", true); c != 0 {
		t.Fatalf("first: %d", c)
	}
	if c := send("1", "14155550100", true); c != fakes.WACodePairRate {
		t.Fatalf("the pair again: %d, want %d", c, fakes.WACodePairRate)
	}
	if c := send("2", "14155550100", true); c != 0 { // another number: another pair, the same user
		t.Fatalf("another number: %d", c)
	}
	if c := send("2", "14155550101", true); c != 0 {
		t.Fatal(c)
	}
	if c := send("2", "14155550102", true); c != 0 || f.OverLimit() != 1 {
		t.Fatalf("a third user past the limit of 2: code %d, over the limit %d; want accepted and not delivered", c, f.OverLimit())
	}
	if c := send("2", "14155550103", true); c != fakes.WACodeThroughput {
		t.Fatalf("a fourth message of number 2 in a second: %d, want %d", c, fakes.WACodeThroughput)
	}
	if c := send("1", "14155550104", false); c != fakes.WACodeReengagement {
		t.Fatalf("a text without an inbound message: %d, want %d", c, fakes.WACodeReengagement)
	}
	f.Inbound("+14155550104", time.Now())
	if c := send("1", "14155550104", false); c != 0 {
		t.Fatalf("a text inside the window: %d", c)
	}
	if d := f.Deliveries(); len(d) != 4 {
		t.Fatalf("%d delivered, want 4: %+v", len(d), d)
	}
	if r := f.Refused(); r[fakes.WACodePairRate] != 1 || r[fakes.WACodeThroughput] != 1 || r[fakes.WACodeReengagement] != 1 {
		t.Fatalf("refusals %v", r)
	}
}
