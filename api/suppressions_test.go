package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/tasks"
)

type suppressionReply struct {
	Recipient     string         `json:"recipient"`
	Subject       string         `json:"subject"`
	Suppressed    bool           `json:"suppressed"`
	Undeliverable map[string]any `json:"undeliverable"`
	OptedOutAll   map[string]any `json:"opted_out_all"`
	OptedOut      map[string]any `json:"opted_out"`
	Ledger        []struct {
		Action, Source, Scope string
		Code                  int
	} `json:"ledger"`
}

// The suppressions API writes what the worker's check reads: an opt-out
// recorded through it blocks the category in the consent store (the
// reading the limiter's script makes), a lift lets it through, and the
// ledger keeps both; tenants see only their own.
func TestSuppressionsAPIRecordsWhatTheCheckReads(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=10/1m", nil)
	ctx := context.Background()
	store := b.API.Services().Consent
	acme := b.Tokens["acme"]
	const num = "+14155550180"

	var got suppressionReply
	r := b.Do(t, "POST", "/v1/suppressions/sms/"+num, acme, `{"type":"out","scope":"marketing"}`)
	if r.Status != http.StatusOK {
		t.Fatalf("opt-out: %d %s", r.Status, r.Body)
	}
	r.JSON(t, &got)
	if !got.Suppressed || got.OptedOut["marketing"] == nil || got.Recipient == num || len(got.Ledger) != 1 || got.Ledger[0].Source != "api" {
		t.Fatalf("after the opt-out: %+v", got)
	}
	for cat, want := range map[string]bool{"marketing": true, "alerts": false} {
		v, err := store.Check(ctx, "acme", tasks.SMS, num, cat, false)
		if err != nil || v.Blocked() != want {
			t.Fatalf("check %s: %+v, %v; want blocked %v", cat, v, err, want)
		}
	}
	if v, _ := store.Check(ctx, "globex", tasks.SMS, num, "marketing", false); v.Blocked() {
		t.Fatal("acme's opt-out blocks globex")
	}
	// The same recipient by its keyed hash: no number in the URL.
	var bySubject suppressionReply
	if r := b.Do(t, "GET", "/v1/suppressions/sms/~"+got.Subject, acme, nil); r.Status != http.StatusOK {
		t.Fatalf("by subject: %d %s", r.Status, r.Body)
	} else if r.JSON(t, &bySubject); bySubject.OptedOut["marketing"] == nil || len(bySubject.Ledger) != 1 || strings.Contains(string(r.Body), "5550180") {
		t.Fatalf("by subject: %s", r.Body)
	}
	if r := b.Do(t, "GET", "/v1/suppressions/sms/~"+got.Subject, b.Tokens["globex"], nil); r.Status != http.StatusOK || strings.Contains(string(r.Body), "marketing") {
		t.Fatalf("globex with acme's subject: %d %s", r.Status, r.Body)
	}
	if r := b.Do(t, "GET", "/v1/suppressions/sms/"+num+"?tenant=acme", b.Tokens["globex"], nil); r.Status != http.StatusForbidden {
		t.Fatalf("globex reading acme's: %d", r.Status)
	}

	if r := b.Do(t, "DELETE", "/v1/suppressions/sms/"+num, acme, nil); r.Status != http.StatusOK {
		t.Fatalf("lift: %d %s", r.Status, r.Body)
	}
	if v, _ := store.Check(ctx, "acme", tasks.SMS, num, "marketing", false); v.Blocked() {
		t.Fatal("still blocked after DELETE")
	}
	b.Do(t, "GET", "/v1/suppressions/sms/"+num, acme, nil).JSON(t, &got)
	if got.Suppressed || len(got.Ledger) != 2 || got.Ledger[1].Action != "in" {
		t.Fatalf("after the lift: %+v", got)
	}
}

// POST /v1/events: a bounce blocks every category (exempt ones too), a
// complaint opts out; one bad event records none of the batch.
func TestEventsAPIAllChecked(t *testing.T) {
	t.Parallel()
	b := setup(t, "email:recipient=10/1m", nil)
	ctx := context.Background()
	store := b.API.Services().Consent
	acme := b.Tokens["acme"]

	var events []string
	for i := range 200 {
		events = append(events, fmt.Sprintf(`{"recipient":"r%d@example.com","type":"bounce","code":550}`, i))
	}
	events = append(events, `{"recipient":"bad address","type":"complaint"}`)
	r := b.Do(t, "POST", "/v1/events/email", acme, `{"events":[`+strings.Join(events, ",")+`]}`)
	if r.Status != http.StatusUnprocessableEntity || !strings.Contains(string(r.Body), "/events/200/recipient") {
		t.Fatalf("a batch with a bad event: %d %s", r.Status, r.Body)
	}
	if n := len(b.RDB.Keys(ctx, "*:consent:email:*").Val()); n != 0 {
		t.Fatalf("%d recipients recorded from a refused batch", n)
	}

	r = b.Do(t, "POST", "/v1/events/email", acme, `{"events":[`+strings.Join(events[:200], ",")+`,{"recipient":"cy@example.com","type":"complaint"}]}`)
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `"recorded":201`) {
		t.Fatalf("import: %d %s", r.Status, r.Body)
	}
	if v, _ := store.Check(ctx, "acme", tasks.Email, "r7@example.com", "otp", true); v.Reason != consent.BlockedUndeliverable {
		t.Fatalf("a bounced address, exempt category: %+v", v)
	}
	if v, _ := store.Check(ctx, "acme", tasks.Email, "cy@example.com", "newsletter", false); v.Reason != consent.BlockedAll {
		t.Fatalf("a complaint: %+v", v)
	}
	ledger, err := store.Ledger(ctx, "acme", tasks.Email, "cy@example.com")
	if err != nil || len(ledger) != 1 || ledger[0].Source != consent.SourceComplaint {
		t.Fatalf("ledger %+v, %v", ledger, err)
	}
	// No address in clear anywhere in Redis.
	for _, k := range b.RDB.Keys(ctx, "*").Val() {
		if strings.Contains(k, "example.com") {
			t.Fatalf("key %s holds an address", k)
		}
		if typ := b.RDB.Type(ctx, k).Val(); typ != "none" && strings.Contains(b.RDB.Dump(ctx, k).Val(), "example.com") {
			t.Fatalf("%s (%s) holds an address", k, typ)
		}
	}
}
