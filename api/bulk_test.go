package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// Bulk mail without a List-Unsubscribe is refused at the door (422 naming
// list_unsubscribe, nothing enqueued) instead of being archived unsent by
// the worker; a tenant's unsubscribe= default makes it fine, and so does
// its own. A tenant plan that makes a category bulk holds from when the API
// sees it.
func TestBulkWithoutUnsubscribeRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, "email:recipient=100/1m,email.news:bulk,acme/email.news:unsubscribe=https://acme.example/u/{id}", nil)
	news := func(extra ...string) map[string]any {
		n := map[string]any{"channel": "email", "to": "ann@example.com", "subject": "News", "body": "text", "category": "news"}
		for i := 0; i+1 < len(extra); i += 2 {
			n[extra[i]] = extra[i+1]
		}
		return n
	}
	r := b.Do(t, "POST", "/v1/notifications", b.Tokens["globex"], news())
	if r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("bulk mail without List-Unsubscribe: %d %s", r.Status, r.Body)
	}
	p := r.Problem(t)
	if len(p.InvalidParams) != 1 || p.InvalidParams[0].Name != "list_unsubscribe" || !strings.Contains(p.InvalidParams[0].Reason, "email.news:bulk") {
		t.Fatalf("want one invalid param naming list_unsubscribe and the rule: %s", r.Body)
	}
	if n := len(b.Queued(t)); n != 0 {
		t.Fatalf("%d tasks enqueued for a refused request", n)
	}
	for _, c := range []struct {
		tenant string
		body   map[string]any
	}{
		{"acme", news()}, // the tenant's unsubscribe= default
		{"globex", news("list_unsubscribe", "mailto:unsub@globex.example")},
		{"globex", news("category", "receipts")},
	} {
		if r := b.Do(t, "POST", "/v1/notifications", b.Tokens[c.tenant], c.body); r.Status != http.StatusAccepted {
			t.Fatalf("%s %v: %d %s", c.tenant, c.body, r.Status, r.Body)
		}
	}
	// In a batch, the bad one is named with its index; nothing is enqueued.
	r = b.Do(t, "POST", "/v1/notifications", b.Tokens["globex"], map[string]any{"notifications": []any{news("list_unsubscribe", "mailto:u@globex.example"), news()}})
	if p := r.Problem(t); r.Status != http.StatusUnprocessableEntity || len(p.InvalidParams) != 1 || *p.InvalidParams[0].Index != 1 ||
		p.InvalidParams[0].Pointer != "/notifications/1" {
		t.Fatalf("batch: %d %s", r.Status, r.Body)
	}
	if n := len(b.Queued(t)); n != 3 {
		t.Fatalf("%d tasks queued, want the 3 accepted", n)
	}
	// A plan makes globex's promos bulk: refused once the API has it.
	store := plans.NewStore(b.RDB, plans.Policy{})
	if _, err := store.Set(context.Background(), "globex", "email.promo:bulk", "test"); err != nil {
		t.Fatal(err)
	}
	promo := news("category", "promo")
	sluicetest.Eventually(t, 5*time.Second, "the plan to apply", func() bool {
		return b.Do(t, "POST", "/v1/notifications", b.Tokens["globex"], promo).Status == http.StatusUnprocessableEntity
	})
}
