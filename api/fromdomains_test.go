package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// With SLUICE_EMAIL_FROM_DOMAINS a tenant may send only From its own
// domains (DKIM would sign any): another From is refused with 422 naming
// "from", nothing enqueued; no From (the default sender) is fine.
func TestFromDomainsPerTenant(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, map[string]string{"SLUICE_EMAIL_FROM_DOMAINS": "acme=acme.com,globex=globex.com"})
	mail := func(from string) map[string]any {
		n := map[string]any{"channel": "email", "to": "ann@example.com", "subject": "Hi", "body": "Hello"}
		if from != "" {
			n["from"] = from
		}
		return n
	}
	if r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], mail("news@acme.com")); r.Status != 202 {
		t.Fatalf("own domain: %d %s", r.Status, r.Body)
	}
	r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], mail("ceo@globex.com"))
	p := r.Problem(t)
	if r.Status != 422 || p.Type != api.ProblemBase+"invalid-notification" || len(p.InvalidParams) != 1 || p.InvalidParams[0].Name != "from" {
		t.Fatalf("another tenant's domain: %d %s", r.Status, r.Body)
	}
	if r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], mail("")); r.Status != 202 {
		t.Fatalf("no From: %d %s", r.Status, r.Body)
	}
	if n := len(b.Queued(t)); n != 2 {
		t.Fatalf("%d queued, want 2", n)
	}
}

// A notification enqueued another way (Go, an old producer) From a domain
// its tenant may not use is archived unsent by the worker, reason invalid.
func TestFromDomainsWorkerArchives(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, map[string]string{"SLUICE_EMAIL_FROM_DOMAINS": "acme=acme.com"})
	b.RunWorker(t, app.WorkerOptions{})
	n := tasks.NewEmail("acme", "ann@example.com", "Hi", "Hello")
	n.From = "ceo@globex.com"
	n.ID = tasks.NewID()
	client := asynq.NewClientFromRedisClient(b.RDB)
	if _, err := tasks.Enqueue(context.Background(), client, b.Keys, n, asynq.Queue(b.Config.Layout().Route("acme", tasks.DefaultLane(""), nil))); err != nil {
		t.Fatal(err)
	}
	var st api.Status
	sluicetest.Eventually(t, 10*time.Second, "the email to be archived", func() bool {
		st = b.status(t, n.ID)
		return st.State == api.StateArchived
	})
	if st.Reason != tasks.ReasonInvalid || !strings.Contains(st.Detail, "EMAIL_FROM_DOMAINS") {
		t.Fatalf("status %+v", st)
	}
}
