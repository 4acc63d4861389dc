package api_test

import (
	"net/http"
	"strings"
	"testing"
)

// A category whose rules require the person (*.marketing:user=required) is
// refused without user: 422 naming user, nothing enqueued; with one, or in
// another category, it is taken. In a batch the bad one is named and
// nothing goes.
func TestUserRequiredRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=100/1m,*.marketing:user=3/1d,*.marketing:user=required", nil)
	sms := func(extra ...string) map[string]any {
		n := map[string]any{"channel": "sms", "to": "+14155550100", "body": "Sale", "category": "marketing"}
		for i := 0; i+1 < len(extra); i += 2 {
			n[extra[i]] = extra[i+1]
		}
		return n
	}
	r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], sms())
	if r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("marketing without user: %d %s", r.Status, r.Body)
	}
	if p := r.Problem(t); len(p.InvalidParams) != 1 || p.InvalidParams[0].Name != "user" || !strings.Contains(p.InvalidParams[0].Reason, "user=required") {
		t.Fatalf("want one invalid param naming user and the rule: %s", r.Body)
	}
	r = b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], map[string]any{"notifications": []any{sms("user", "u-1"), sms()}})
	if p := r.Problem(t); r.Status != http.StatusUnprocessableEntity || len(p.InvalidParams) != 1 || *p.InvalidParams[0].Index != 1 {
		t.Fatalf("batch: %d %s", r.Status, r.Body)
	}
	if n := len(b.Queued(t)); n != 0 {
		t.Fatalf("%d tasks enqueued for refused requests", n)
	}
	for _, body := range []map[string]any{sms("user", "u-1"), sms("category", "alerts")} {
		if r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], body); r.Status != http.StatusAccepted {
			t.Fatalf("%v: %d %s", body, r.Status, r.Body)
		}
	}
}
