package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/plans"
)

// A tenant's plan sets its own cap on queued work (max-queued), live:
// acme's plan of 3 refuses a 4th with 429 queue-full while globex, under
// the deployment's cap, enqueues on.
func TestQueuedCapFromThePlan(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, map[string]string{"SLUICE_TENANT_MAX_QUEUED": "100"})
	defaults, _ := plans.Parse(rules)
	if _, err := plans.NewStore(b.rdb, defaults).Set(context.Background(), "acme", "max-queued=3", "test"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "acme's plan in force", func() bool {
		n, _, set, _ := b.srv.Services().Plans.Policy().QueuedCaps("acme")
		return set && n == 3
	})
	for i := range 3 {
		if r := b.do(t, "POST", "/v1/notifications", b.tokens["acme"], sms("+14155550100", "x")); r.status != 202 {
			t.Fatalf("acme %d: %d %s", i, r.status, r.body)
		}
	}
	last := b.do(t, "POST", "/v1/notifications", b.tokens["acme"], sms("+14155550100", "x"))
	if last.status != http.StatusTooManyRequests {
		t.Fatalf("acme's 4th: %d %s", last.status, last.body)
	}
	if p := last.problem(t); p.Type != "urn:sluice:problem:queue-full" {
		t.Fatalf("refusal: %s", last.body)
	}
	if n := len(b.queued(t)); n != 3 {
		t.Fatalf("%d queued for acme, want its plan's 3", n)
	}
	for range 5 {
		if r := b.do(t, "POST", "/v1/notifications", b.tokens["globex"], sms("+14155550100", "x")); r.status != 202 {
			t.Fatalf("globex: %d %s", r.status, r.body)
		}
	}
}
