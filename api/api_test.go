package api_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/report"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/apienv"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/throttle"
)

const rules = "sms:recipient=1/1m,sms:recipient=5/1d,sms:tenant=1000/1h,email:recipient=10/1m"

// One notification in: 202 with its id and state, a Location, and a sealed
// task of the token's tenant in the queue.
func TestEnqueueOne(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	n := apienv.NewSMS("+1 415 555 0100", "Your code is 123456")
	n["category"], n["ttl"], n["metadata"] = "otp", "10m", map[string]string{"order": "42"}
	r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], n)
	if r.Status != http.StatusAccepted {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	var a api.Accepted
	r.JSON(t, &a)
	if a.Tenant != "acme" || a.State != api.StateQueued || r.Header.Get("Location") != "/v1/notifications/"+a.ID {
		t.Fatalf("answer %+v, Location %q", a, r.Header.Get("Location"))
	}
	ts := b.Queued(t)
	if len(ts) != 1 || ts[0].ID != a.ID || !tasks.IsSealed(ts[0].Payload) {
		t.Fatalf("queue: %v", ts)
	}
	got, err := tasks.Open(b.Keys, ts[0].ID, ts[0].Type, ts[0].Payload, false)
	if err != nil {
		t.Fatal(err)
	}
	if got.Tenant != "acme" || got.To != "+14155550100" || got.Category != "otp" || got.Metadata["order"] != "42" ||
		time.Until(got.ExpiresAt) < 9*time.Minute || time.Until(got.ExpiresAt) > 10*time.Minute {
		t.Fatalf("stored notification: %+v", got)
	}
	r = b.Do(t, "GET", "/v1/notifications/"+a.ID, b.Tokens["acme"], nil)
	var st api.Status
	r.JSON(t, &st)
	if r.Status != 200 || st.State != api.StateQueued || st.To != "+1415***0100" || st.Channel != "sms" || st.Category != "otp" {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
}

// A batch is all or nothing: with bad notifications in it, nothing is
// enqueued and every bad field is named with its index.
func TestBatchAllOrNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	bad := map[string]any{"notifications": []any{
		apienv.NewSMS("+14155550100", "fine"),
		map[string]any{"channel": "sms", "to": "0800-CALL-ME", "body": "", "tz": "Mars/Olympus", "category": "Big Sale"},
		apienv.NewSMS("+14155550102", "fine too"),
		map[string]any{"channel": "email", "to": "ann@example.com", "body": "no subject", "colour": "red", "id": "mine"},
		map[string]any{"channel": "fax", "to": "x", "body": "y"},
		"not an object",
	}}
	r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], bad)
	if r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	p := r.Problem(t)
	got := map[string]bool{}
	for _, ip := range p.InvalidParams {
		if ip.Index == nil {
			t.Fatalf("a batch error without its index: %+v", ip)
		}
		got[fmt.Sprintf("%d %s %s", *ip.Index, ip.Name, ip.Pointer)] = true
		if strings.Contains(ip.Reason, "0800-CALL-ME") {
			t.Errorf("a reason quotes the recipient in clear: %q", ip.Reason)
		}
	}
	for _, want := range []string{
		"1 to /notifications/1/to", "1 body /notifications/1/body", "1 tz /notifications/1/tz", "1 category /notifications/1/category",
		"3 subject /notifications/3", "3 colour /notifications/3/colour", "3 id /notifications/3/id",
		"4 channel /notifications/4/channel", "5 notification /notifications/5",
	} {
		if !got[want] {
			t.Errorf("missing invalid param %q; got %v", want, got)
		}
	}
	if n := len(b.Queued(t)); n != 0 {
		t.Fatalf("%d tasks enqueued from a rejected batch", n)
	}
	good := map[string]any{"notifications": []any{apienv.NewSMS("+14155550100", "a"), apienv.NewSMS("+14155550101", "b"),
		map[string]any{"channel": "email", "to": "ann@example.com", "subject": "Hi", "body": "Hello"}}}
	r = b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], good)
	var ba api.BatchAccepted
	r.JSON(t, &ba)
	if r.Status != http.StatusAccepted || len(ba.Notifications) != 3 || len(b.Queued(t)) != 3 {
		t.Fatalf("good batch: %d %s", r.Status, r.Body)
	}
	many := make([]any, api.MaxBatch+1)
	for i := range many {
		many[i] = apienv.NewSMS("+14155550100", "x")
	}
	r = b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], map[string]any{"notifications": many})
	if r.Status != http.StatusBadRequest || r.Problem(t).InvalidParams[0].Name != "notifications" {
		t.Fatalf("a batch of %d: %d %s", len(many), r.Status, r.Body)
	}
}

func TestUnknownRoutesAndMethods(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	tok := b.Tokens["acme"]
	if r := b.Do(t, "DELETE", "/v1/notifications/abc", tok, nil); r.Status != 405 || r.Header.Get("Allow") != "GET, HEAD" {
		t.Fatalf("DELETE a notification: %d %v %s", r.Status, r.Header, r.Body)
	}
	if r := b.Do(t, "GET", "/v1/notifications", tok, nil); r.Status != 405 || r.Header.Get("Allow") != "POST" {
		t.Fatalf("GET the collection: %d %v %s", r.Status, r.Header, r.Body)
	}
	if r := b.Do(t, "GET", "/v1/tenants", tok, nil); r.Status != 404 || r.Problem(t).Type != api.ProblemBase+"not-found" {
		t.Fatalf("unknown endpoint: %d %s", r.Status, r.Body)
	}
}

func TestRequestChecks(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, map[string]string{"SLUICE_API_MAX_BODY_BYTES": "65536"})
	tok := b.Tokens["acme"]
	cases := []struct {
		name    string
		body    string
		headers []string
		status  int
		kind    string
	}{
		{"NotJSON", `{"channel":`, nil, 400, "invalid-request"},
		{"NotAnObject", `[1,2]`, nil, 400, "invalid-request"},
		{"WrongContentType", `{}`, []string{"Content-Type", "text/plain"}, 415, "unsupported-media"},
		{"TooLarge", `{"channel":"sms","to":"+14155550100","body":"` + strings.Repeat("x", 70000) + `"}`, nil, 413, "too-large"},
		{"BadIdempotencyKey", `{}`, []string{"Idempotency-Key", `"unterminated`}, 400, "invalid-request"},
		{"TTLAndExpiry", `{"channel":"sms","to":"+14155550100","body":"x","ttl":"1m","expires_at":"2099-01-01T00:00:00Z"}`, nil, 422, "invalid-notification"},
		{"ExpiredAlready", `{"channel":"sms","to":"+14155550100","body":"x","expires_at":"2001-01-01T00:00:00Z"}`, nil, 422, "invalid-notification"},
		{"BatchWithExtras", `{"notifications":[],"tenant":"acme"}`, nil, 400, "invalid-request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := b.Do(t, "POST", "/v1/notifications", tok, c.body, c.headers...)
			if r.Status != c.status || r.Problem(t).Type != api.ProblemBase+c.kind {
				t.Fatalf("%d %s, want %d %s", r.Status, r.Body, c.status, c.kind)
			}
		})
	}
	if n := len(b.Queued(t)); n != 0 {
		t.Fatalf("%d tasks enqueued by bad requests", n)
	}
}

// Same key and body: the first answer replayed, one task. Another body:
// 422. The ids come from the key, so a retry whose record was lost still
// enqueues nothing twice, and one whose notification was sent reports it.
func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	tok := b.Tokens["acme"]
	body := map[string]any{"notifications": []any{apienv.NewSMS("+14155550100", "a"), apienv.NewSMS("+14155550101", "b")}}
	first := b.Do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", `"order-42"`)
	if first.Status != 202 || first.Header.Get(api.HeaderReplayed) != "" {
		t.Fatalf("first: %d %v %s", first.Status, first.Header, first.Body)
	}
	var ba api.BatchAccepted
	first.JSON(t, &ba)
	for i, a := range ba.Notifications {
		if a.ID != api.NotificationID("acme", "order-42", i) {
			t.Fatalf("id %d is %s, want one derived from the key", i, a.ID)
		}
	}
	again := b.Do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", "order-42") // bare form: the same key
	if again.Status != 202 || again.Header.Get(api.HeaderReplayed) != "true" || string(again.Body) != string(first.Body) {
		t.Fatalf("retry: %d %v %s", again.Status, again.Header, again.Body)
	}
	if n := len(b.Queued(t)); n != 2 {
		t.Fatalf("%d tasks after a retry, want 2", n)
	}
	other := b.Do(t, "POST", "/v1/notifications", tok, map[string]any{"notifications": []any{apienv.NewSMS("+14155550100", "changed")}}, "Idempotency-Key", "order-42")
	if other.Status != 422 || other.Problem(t).Type != api.ProblemBase+"idempotency-mismatch" {
		t.Fatalf("another body: %d %s", other.Status, other.Body)
	}
	// Another tenant's key of the same name is its own.
	g := b.Do(t, "POST", "/v1/notifications", b.Tokens["globex"], body, "Idempotency-Key", "order-42")
	if g.Status != 202 || g.Header.Get(api.HeaderReplayed) != "" || len(b.Queued(t)) != 4 {
		t.Fatalf("globex with acme's key name: %d %s", g.Status, g.Body)
	}
	// The record is lost (say Redis was flushed of it): the retry maps to
	// the same ids, which are still enqueued: nothing new.
	if err := b.RDB.Del(context.Background(), api.IdempotencyRedisKey("acme", "order-42")).Err(); err != nil {
		t.Fatal(err)
	}
	lost := b.Do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", "order-42")
	if lost.Status != 202 || lost.Header.Get(api.HeaderReplayed) != "" || len(b.Queued(t)) != 4 {
		t.Fatalf("retry without its record: %d %s; %d tasks", lost.Status, lost.Body, len(b.Queued(t)))
	}
	// The first notification went (the worker deleted the task and recorded
	// the send): a retry reports it sent and enqueues nothing.
	lim, err := throttle.New(b.RDB, throttle.Options{Secret: []byte(b.WorkerConfig.SubjectSecret), CompactMembers: b.WorkerConfig.CompactMembers})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	id0 := ba.Notifications[0].ID
	ti0, err := b.Task(t, id0)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Inspector.DeleteTask(ti0.Queue, id0); err != nil {
		t.Fatal(err)
	}
	if err := lim.MarkDone(context.Background(), "acme", id0, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	_ = b.RDB.Del(context.Background(), api.IdempotencyRedisKey("acme", "order-42")).Err()
	sent := b.Do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", "order-42")
	var sa api.BatchAccepted
	sent.JSON(t, &sa)
	if sent.Status != 202 || sa.Notifications[0].State != api.StateSent || sa.Notifications[1].State != api.StateQueued || len(b.Queued(t)) != 3 {
		t.Fatalf("retry after the send: %d %s; %d tasks", sent.Status, sent.Body, len(b.Queued(t)))
	}
	// A request refused for its content keeps nothing: the key may be used
	// again with a corrected body.
	key := "fix-me"
	bad := b.Do(t, "POST", "/v1/notifications", tok, apienv.NewSMS("nope", "x"), "Idempotency-Key", key)
	good := b.Do(t, "POST", "/v1/notifications", tok, apienv.NewSMS("+14155550109", "x"), "Idempotency-Key", key)
	if bad.Status != 422 || good.Status != 202 {
		t.Fatalf("corrected retry: %d then %d %s", bad.Status, good.Status, good.Body)
	}
}

// A retry while the first request with the key is still in flight (its
// body still arriving) gets 409; once the first is answered, retries get
// its answer.
func TestIdempotencyKeyInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	tok := b.Tokens["acme"]
	const key = "slow-client"
	body := `{"channel":"sms","to":"+14155550100","body":"hello"}`
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", b.HTTP.URL+"/v1/notifications", pr)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Idempotency-Key", key)
	var wg sync.WaitGroup
	var first *http.Response
	var firstErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		first, firstErr = sluicetest.Client(t).Do(req)
	}()
	if _, err := pw.Write([]byte(body[:10])); err != nil {
		t.Fatal(err)
	}
	sluicetest.Eventually(t, 5*time.Second, "the first request to take its key", func() bool {
		return b.RDB.Exists(context.Background(), api.IdempotencyRedisKey("acme", key)).Val() == 1
	})
	dup := b.Do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", key)
	if dup.Status != http.StatusConflict || dup.Problem(t).Type != api.ProblemBase+"idempotency-in-flight" {
		t.Fatalf("concurrent duplicate: %d %s", dup.Status, dup.Body)
	}
	if _, err := pw.Write([]byte(body[10:])); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	firstBody, _ := io.ReadAll(first.Body)
	first.Body.Close()
	if first.StatusCode != 202 {
		t.Fatalf("first: %d %s", first.StatusCode, firstBody)
	}
	again := b.Do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", key)
	if again.Status != 202 || string(again.Body) != string(firstBody) || len(b.Queued(t)) != 1 {
		t.Fatalf("retry after the first: %d %s", again.Status, again.Body)
	}
}

// A tenant token acts for its own tenant only; another tenant's
// notification is answered like one that does not exist.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	acme, globex := b.Tokens["acme"], b.Tokens["globex"]
	r := b.Do(t, "POST", "/v1/notifications", acme, apienv.NewSMS("+14155550100", "secret text"))
	var a api.Accepted
	r.JSON(t, &a)
	theirs := b.Do(t, "GET", "/v1/notifications/"+a.ID, globex, nil)
	none := b.Do(t, "GET", "/v1/notifications/"+tasks.NewID(), globex, nil)
	if theirs.Status != 404 || string(theirs.Body) != string(none.Body) {
		t.Fatalf("globex reading acme's notification: %d %s; a missing one: %d %s", theirs.Status, theirs.Body, none.Status, none.Body)
	}
	if strings.Contains(string(theirs.Body), "acme") || strings.Contains(string(theirs.Body), "0100") {
		t.Fatalf("404 leaks: %s", theirs.Body)
	}
	if r := b.Do(t, "GET", "/v1/notifications/"+a.ID+"?tenant=acme", globex, nil); r.Status != 404 {
		t.Fatalf("?tenant=acme with globex's token: %d %s", r.Status, r.Body)
	}
	if r := b.Do(t, "GET", "/v1/quotas?tenant=acme&channel=sms", globex, nil); r.Status != 403 {
		t.Fatalf("globex reading acme's quotas: %d %s", r.Status, r.Body)
	}
	n := apienv.NewSMS("+14155550101", "x")
	n["tenant"] = "acme"
	if r := b.Do(t, "POST", "/v1/notifications", globex, n); r.Status != 403 || r.Problem(t).InvalidParams[0].Name != "tenant" {
		t.Fatalf("globex enqueueing for acme: %d %s", r.Status, r.Body)
	}
	if r := b.Do(t, "POST", "/v1/notifications?tenant=acme", globex, apienv.NewSMS("+14155550101", "x")); r.Status != 403 {
		t.Fatalf("globex enqueueing with ?tenant=acme: %d %s", r.Status, r.Body)
	}
	if n := len(b.Queued(t)); n != 1 {
		t.Fatalf("%d tasks; the refused requests enqueued something", n)
	}
	// The admin reads every tenant, and must name the tenant to enqueue.
	if r := b.Do(t, "GET", "/v1/notifications/"+a.ID, adminToken, nil); r.Status != 200 {
		t.Fatalf("admin reading: %d %s", r.Status, r.Body)
	}
	if r := b.Do(t, "POST", "/v1/notifications", adminToken, apienv.NewSMS("+14155550101", "x")); r.Status != 422 || r.Problem(t).Type != api.ProblemBase+"tenant-required" {
		t.Fatalf("admin enqueue without a tenant: %d %s; want 422 tenant-required (the schema cannot require ?tenant= for the admin only)", r.Status, r.Body)
	}
	if r := b.Do(t, "POST", "/v1/notifications?tenant=globex", adminToken, apienv.NewSMS("+14155550101", "x")); r.Status != 202 {
		t.Fatalf("admin enqueue for globex: %d %s", r.Status, r.Body)
	}
	if r := b.Do(t, "GET", "/v1/quotas?tenant=acme&channel=sms", adminToken, nil); r.Status != 200 {
		t.Fatalf("admin quotas: %d %s", r.Status, r.Body)
	}
	if r := b.Do(t, "GET", "/v1/quotas?channel=sms", adminToken, nil); r.Status != 422 {
		t.Fatalf("admin quotas without a tenant: %d %s", r.Status, r.Body)
	}
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	for name, tok := range map[string]string{"None": "", "Unknown": "sluice_0000_1111", "AdminTypo": adminToken + "x"} {
		t.Run(name, func(t *testing.T) {
			r := b.Do(t, "GET", "/v1/quotas?channel=sms", tok, nil)
			if r.Status != 401 || !strings.HasPrefix(r.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("%d %v %s", r.Status, r.Header, r.Body)
			}
			r.Problem(t)
		})
	}
	ctx := context.Background()
	tok, info, err := b.API.Tokens().Create(ctx, "acme", "ci", "test")
	if err != nil {
		t.Fatal(err)
	}
	if r := b.Do(t, "GET", "/v1/quotas?channel=sms", tok, nil); r.Status != 200 {
		t.Fatalf("new token: %d %s", r.Status, r.Body)
	}
	if err := b.API.Tokens().Revoke(ctx, "globex", info.ID); err == nil {
		t.Fatal("globex revoked acme's token")
	}
	if err := b.API.Tokens().Revoke(ctx, "acme", info.ID); err != nil {
		t.Fatal(err)
	}
	if r := b.Do(t, "GET", "/v1/quotas?channel=sms", tok, nil); r.Status != 401 {
		t.Fatalf("revoked token: %d %s", r.Status, r.Body)
	}
}

// Redis holds no token: neither as a key nor in a value.
func TestTokensStoredOnlyAsKeyedHash(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	ctx := context.Background()
	tok, info, err := b.API.Tokens().Create(ctx, "acme", "", "test")
	if err != nil {
		t.Fatal(err)
	}
	secret := tok[strings.LastIndexByte(tok, '_')+1:]
	keys, err := b.RDB.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		dump := k
		switch b.RDB.Type(ctx, k).Val() {
		case "string":
			dump += b.RDB.Get(ctx, k).Val()
		case "hash":
			dump += fmt.Sprint(b.RDB.HGetAll(ctx, k).Val())
		}
		if strings.Contains(dump, secret) {
			t.Fatalf("Redis key %s holds the token's secret", k)
		}
	}
	list, err := b.API.Tokens().List(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || (list[0].ID != info.ID && list[1].ID != info.ID) {
		t.Fatalf("list: %+v", list)
	}
	// Another key does not verify the token.
	other, _ := api.NewTokens(b.RDB, strings.Repeat("k", api.MinTokenKey))
	if _, err := other.Lookup(ctx, tok); err == nil {
		t.Fatal("a token verified under another SLUICE_API_TOKEN_KEY")
	}
}

func TestRateLimitPerToken(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, map[string]string{"SLUICE_API_RATE": "3/1m"})
	for i := 0; i < 3; i++ {
		if r := b.Do(t, "GET", "/v1/quotas?channel=sms", b.Tokens["acme"], nil); r.Status != 200 {
			t.Fatalf("request %d: %d %s", i, r.Status, r.Body)
		}
	}
	r := b.Do(t, "GET", "/v1/quotas?channel=sms", b.Tokens["acme"], nil)
	if r.Status != 429 || r.Header.Get("Retry-After") == "" || r.Problem(t).RetryAfter < 1 {
		t.Fatalf("4th request: %d %v %s", r.Status, r.Header, r.Body)
	}
	if r := b.Do(t, "GET", "/v1/quotas?channel=sms", b.Tokens["globex"], nil); r.Status != 200 {
		t.Fatalf("another token is limited too: %d %s", r.Status, r.Body)
	}
}

// The quota endpoint answers what `sluice quota show --json` prints, under
// the plans in force: a plan change shows within 2 s.
func TestQuotasMatchTheCLIAndFollowPlans(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	for i := 0; i < 2; i++ {
		b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], apienv.NewSMS("+14155550100", "x"))
	}
	lim, err := throttle.New(b.RDB, throttle.Options{Secret: []byte(b.WorkerConfig.SubjectSecret), CompactMembers: b.WorkerConfig.CompactMembers})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	lims := []throttle.Limit{{Scope: "sms:recipient", Subject: "+14155550100", Rule: throttle.PerMinute(1)}, {Scope: "sms:tenant", Rule: throttle.PerHour(1000)}}
	if _, err := lim.Reserve(context.Background(), "acme", "n1", throttle.ReserveOptions{Book: true}, lims...); err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Reserve(context.Background(), "acme", "n2", throttle.ReserveOptions{Book: true}, lims...); err != nil {
		t.Fatal(err)
	}
	r := b.Do(t, "GET", "/v1/quotas?channel=sms&recipient=%2B14155550100", b.Tokens["acme"], nil)
	var got report.QuotaJSON
	r.JSON(t, &got)
	policy, _ := plans.Parse(rules)
	rep, err := report.Quotas(context.Background(), lim, policy, b.Config.Base, report.QuotaQuery{Tenant: "acme", Channel: tasks.SMS, Recipient: "+14155550100"})
	if err != nil {
		t.Fatal(err)
	}
	want := rep.JSON()
	if len(got.Windows) != len(want.Windows) || len(got.Windows) != 3 {
		t.Fatalf("windows: got %+v, want %+v", got.Windows, want.Windows)
	}
	for i := range want.Windows {
		g, w := got.Windows[i], want.Windows[i]
		if g.Scope != w.Scope || g.Rule != w.Rule || g.Used != w.Used || g.Booked != w.Booked || g.Remaining != w.Remaining || (w.Remaining == 0 && !g.NextFree.Equal(w.NextFree)) {
			t.Errorf("window %d: got %+v, want %+v", i, g, w)
		}
	}
	if got.Windows[0].Used != 1 || got.Windows[0].Booked != 1 {
		t.Fatalf("recipient window: %+v", got.Windows[0])
	}
	// A plan for acme: the API's view follows it.
	defaults, _ := plans.Parse(rules)
	changed := time.Now()
	if _, err := plans.NewStore(b.RDB, defaults).Set(context.Background(), "acme", "sms:tenant=5/1h", "test"); err != nil {
		t.Fatal(err)
	}
	sluicetest.Eventually(t, 2*time.Second, "the quota view to show acme's plan", func() bool {
		var q report.QuotaJSON
		b.Do(t, "GET", "/v1/quotas?channel=sms", b.Tokens["acme"], nil).JSON(t, &q)
		return len(q.Windows) == 1 && q.Windows[0].Rule == "5/1h"
	})
	t.Logf("plan change visible in /v1/quotas after %v", time.Since(changed).Round(time.Millisecond))
	if r := b.Do(t, "GET", "/v1/quotas?channel=pigeon&bogus=1", b.Tokens["acme"], nil); r.Status != 400 || len(r.Problem(t).InvalidParams) != 2 {
		t.Fatalf("bad query: %d %s", r.Status, r.Body)
	}
	// A bare '+' in the query arrives as a space: refused, not read as another number.
	if r := b.Do(t, "GET", "/v1/quotas?channel=sms&recipient=+14155550100", b.Tokens["acme"], nil); r.Status != 400 ||
		r.Problem(t).InvalidParams[0].Name != "recipient" || strings.Contains(string(r.Body), "5550100") {
		t.Fatalf("unencoded +: %d %s", r.Status, r.Body)
	}
}

// Wrong JSON types are named per field; fields the API sets cannot be
// slipped in under another case (encoding/json matches names ignoring case).
func TestFieldTypes(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"],
		`{"channel":"sms","to":14155550100,"body":"x","metadata":{"a":1},"Enqueued_At":"2020-01-01T00:00:00Z","ID":"mine"}`)
	if r.Status != 422 {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	got := map[string]string{}
	for _, ip := range r.Problem(t).InvalidParams {
		got[ip.Name] = ip.Reason
	}
	want := map[string]string{"to": "must be a string", "metadata": "must be an object of string values", "Enqueued_At": "is set by the API"}
	for name, reason := range want {
		if got[name] != reason {
			t.Errorf("%s: got %q, want %q (all: %v)", name, got[name], reason, got)
		}
	}
	if !strings.HasPrefix(got["ID"], "is set by the API") {
		t.Errorf("ID: %q", got["ID"])
	}
}
