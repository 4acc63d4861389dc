package api_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/testkit/apienv"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// A tenant's plan sets its own cap on queued work (max-queued), live:
// acme's plan of 3 refuses a 4th with 429 queue-full while globex, under
// the deployment's cap, enqueues on.
func TestQueuedCapFromThePlan(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, map[string]string{"SLUICE_TENANT_MAX_QUEUED": "100"})
	defaults, _ := plans.Parse(rules)
	if _, err := plans.NewStore(b.RDB, defaults).Set(context.Background(), "acme", "max-queued=3", "test"); err != nil {
		t.Fatal(err)
	}
	sluicetest.Eventually(t, 5*time.Second, "acme's plan in force", func() bool {
		n, _, set, _ := b.API.Services().Plans.Policy().QueuedCaps("acme")
		return set && n == 3
	})
	for i := range 3 {
		if r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], apienv.NewSMS("+14155550100", "x")); r.Status != 202 {
			t.Fatalf("acme %d: %d %s", i, r.Status, r.Body)
		}
	}
	last := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], apienv.NewSMS("+14155550100", "x"))
	if last.Status != http.StatusTooManyRequests {
		t.Fatalf("acme's 4th: %d %s", last.Status, last.Body)
	}
	if p := last.Problem(t); p.Type != "urn:sluice:problem:queue-full" {
		t.Fatalf("refusal: %s", last.Body)
	}
	if n := len(b.Queued(t)); n != 3 {
		t.Fatalf("%d queued for acme, want its plan's 3", n)
	}
	for range 5 {
		if r := b.Do(t, "POST", "/v1/notifications", b.Tokens["globex"], apienv.NewSMS("+14155550100", "x")); r.Status != 202 {
			t.Fatalf("globex: %d %s", r.Status, r.Body)
		}
	}
}
