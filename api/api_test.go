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
	"github.com/sluicehq/sluice/throttle"
)

const rules = "sms:recipient=1/1m,sms:recipient=5/1d,sms:tenant=1000/1h,email:recipient=10/1m"

// One notification in: 202 with its id and state, a Location, and a sealed
// task of the token's tenant in the queue.
func TestEnqueueOne(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	n := sms("+1 415 555 0100", "Your code is 123456")
	n["category"], n["ttl"], n["metadata"] = "otp", "10m", map[string]string{"order": "42"}
	r := b.do(t, "POST", "/v1/notifications", b.tokens["acme"], n)
	if r.status != http.StatusAccepted {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var a api.Accepted
	r.json(t, &a)
	if a.Tenant != "acme" || a.State != api.StateQueued || r.header.Get("Location") != "/v1/notifications/"+a.ID {
		t.Fatalf("answer %+v, Location %q", a, r.header.Get("Location"))
	}
	ts := b.queued(t)
	if len(ts) != 1 || ts[0].ID != a.ID || !tasks.IsSealed(ts[0].Payload) {
		t.Fatalf("queue: %v", ts)
	}
	got, err := tasks.Open(b.keys, ts[0].ID, ts[0].Type, ts[0].Payload, false)
	if err != nil {
		t.Fatal(err)
	}
	if got.Tenant != "acme" || got.To != "+14155550100" || got.Category != "otp" || got.Metadata["order"] != "42" ||
		time.Until(got.ExpiresAt) < 9*time.Minute || time.Until(got.ExpiresAt) > 10*time.Minute {
		t.Fatalf("stored notification: %+v", got)
	}
	r = b.do(t, "GET", "/v1/notifications/"+a.ID, b.tokens["acme"], nil)
	var st api.Status
	r.json(t, &st)
	if r.status != 200 || st.State != api.StateQueued || st.To != "+1415***0100" || st.Channel != "sms" || st.Category != "otp" {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
}

// A batch is all or nothing: with bad notifications in it, nothing is
// enqueued and every bad field is named with its index.
func TestBatchAllOrNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	bad := map[string]any{"notifications": []any{
		sms("+14155550100", "fine"),
		map[string]any{"channel": "sms", "to": "0800-CALL-ME", "body": "", "tz": "Mars/Olympus", "category": "Big Sale"},
		sms("+14155550102", "fine too"),
		map[string]any{"channel": "email", "to": "ann@example.com", "body": "no subject", "colour": "red", "id": "mine"},
		map[string]any{"channel": "fax", "to": "x", "body": "y"},
		"not an object",
	}}
	r := b.do(t, "POST", "/v1/notifications", b.tokens["acme"], bad)
	if r.status != http.StatusUnprocessableEntity {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	p := r.problem(t)
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
	if n := len(b.queued(t)); n != 0 {
		t.Fatalf("%d tasks enqueued from a rejected batch", n)
	}
	good := map[string]any{"notifications": []any{sms("+14155550100", "a"), sms("+14155550101", "b"),
		map[string]any{"channel": "email", "to": "ann@example.com", "subject": "Hi", "body": "Hello"}}}
	r = b.do(t, "POST", "/v1/notifications", b.tokens["acme"], good)
	var ba api.BatchAccepted
	r.json(t, &ba)
	if r.status != http.StatusAccepted || len(ba.Notifications) != 3 || len(b.queued(t)) != 3 {
		t.Fatalf("good batch: %d %s", r.status, r.body)
	}
	many := make([]any, api.MaxBatch+1)
	for i := range many {
		many[i] = sms("+14155550100", "x")
	}
	r = b.do(t, "POST", "/v1/notifications", b.tokens["acme"], map[string]any{"notifications": many})
	if r.status != http.StatusBadRequest || r.problem(t).InvalidParams[0].Name != "notifications" {
		t.Fatalf("a batch of %d: %d %s", len(many), r.status, r.body)
	}
}

func TestUnknownRoutesAndMethods(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	tok := b.tokens["acme"]
	if r := b.do(t, "DELETE", "/v1/notifications/abc", tok, nil); r.status != 405 || r.header.Get("Allow") != "GET, HEAD" {
		t.Fatalf("DELETE a notification: %d %v %s", r.status, r.header, r.body)
	}
	if r := b.do(t, "GET", "/v1/notifications", tok, nil); r.status != 405 || r.header.Get("Allow") != "POST" {
		t.Fatalf("GET the collection: %d %v %s", r.status, r.header, r.body)
	}
	if r := b.do(t, "GET", "/v1/tenants", tok, nil); r.status != 404 || r.problem(t).Type != api.ProblemBase+"not-found" {
		t.Fatalf("unknown endpoint: %d %s", r.status, r.body)
	}
}

func TestRequestChecks(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, map[string]string{"SLUICE_API_MAX_BODY_BYTES": "65536"})
	tok := b.tokens["acme"]
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
			r := b.do(t, "POST", "/v1/notifications", tok, c.body, c.headers...)
			if r.status != c.status || r.problem(t).Type != api.ProblemBase+c.kind {
				t.Fatalf("%d %s, want %d %s", r.status, r.body, c.status, c.kind)
			}
		})
	}
	if n := len(b.queued(t)); n != 0 {
		t.Fatalf("%d tasks enqueued by bad requests", n)
	}
}

// Same key and body: the first answer replayed, one task. Another body:
// 422. The ids come from the key, so a retry whose record was lost still
// enqueues nothing twice, and one whose notification was sent reports it.
func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	tok := b.tokens["acme"]
	body := map[string]any{"notifications": []any{sms("+14155550100", "a"), sms("+14155550101", "b")}}
	first := b.do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", `"order-42"`)
	if first.status != 202 || first.header.Get(api.HeaderReplayed) != "" {
		t.Fatalf("first: %d %v %s", first.status, first.header, first.body)
	}
	var ba api.BatchAccepted
	first.json(t, &ba)
	for i, a := range ba.Notifications {
		if a.ID != api.NotificationID("acme", "order-42", i) {
			t.Fatalf("id %d is %s, want one derived from the key", i, a.ID)
		}
	}
	again := b.do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", "order-42") // bare form: the same key
	if again.status != 202 || again.header.Get(api.HeaderReplayed) != "true" || string(again.body) != string(first.body) {
		t.Fatalf("retry: %d %v %s", again.status, again.header, again.body)
	}
	if n := len(b.queued(t)); n != 2 {
		t.Fatalf("%d tasks after a retry, want 2", n)
	}
	other := b.do(t, "POST", "/v1/notifications", tok, map[string]any{"notifications": []any{sms("+14155550100", "changed")}}, "Idempotency-Key", "order-42")
	if other.status != 422 || other.problem(t).Type != api.ProblemBase+"idempotency-mismatch" {
		t.Fatalf("another body: %d %s", other.status, other.body)
	}
	// Another tenant's key of the same name is its own.
	g := b.do(t, "POST", "/v1/notifications", b.tokens["globex"], body, "Idempotency-Key", "order-42")
	if g.status != 202 || g.header.Get(api.HeaderReplayed) != "" || len(b.queued(t)) != 4 {
		t.Fatalf("globex with acme's key name: %d %s", g.status, g.body)
	}
	// The record is lost (say Redis was flushed of it): the retry maps to
	// the same ids, which are still enqueued: nothing new.
	if err := b.rdb.Del(context.Background(), api.IdempotencyRedisKey("acme", "order-42")).Err(); err != nil {
		t.Fatal(err)
	}
	lost := b.do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", "order-42")
	if lost.status != 202 || lost.header.Get(api.HeaderReplayed) != "" || len(b.queued(t)) != 4 {
		t.Fatalf("retry without its record: %d %s; %d tasks", lost.status, lost.body, len(b.queued(t)))
	}
	// The first notification went (the worker deleted the task and recorded
	// the send): a retry reports it sent and enqueues nothing.
	lim, err := throttle.New(b.rdb, throttle.Options{Secret: []byte(b.wcfg.SubjectSecret), CompactMembers: b.wcfg.CompactMembers})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	id0 := ba.Notifications[0].ID
	ti0, err := b.task(t, id0)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.insp.DeleteTask(ti0.Queue, id0); err != nil {
		t.Fatal(err)
	}
	if err := lim.MarkDone(context.Background(), "acme", id0, 1, time.Hour); err != nil {
		t.Fatal(err)
	}
	_ = b.rdb.Del(context.Background(), api.IdempotencyRedisKey("acme", "order-42")).Err()
	sent := b.do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", "order-42")
	var sa api.BatchAccepted
	sent.json(t, &sa)
	if sent.status != 202 || sa.Notifications[0].State != api.StateSent || sa.Notifications[1].State != api.StateQueued || len(b.queued(t)) != 3 {
		t.Fatalf("retry after the send: %d %s; %d tasks", sent.status, sent.body, len(b.queued(t)))
	}
	// A request refused for its content keeps nothing: the key may be used
	// again with a corrected body.
	key := "fix-me"
	bad := b.do(t, "POST", "/v1/notifications", tok, sms("nope", "x"), "Idempotency-Key", key)
	good := b.do(t, "POST", "/v1/notifications", tok, sms("+14155550109", "x"), "Idempotency-Key", key)
	if bad.status != 422 || good.status != 202 {
		t.Fatalf("corrected retry: %d then %d %s", bad.status, good.status, good.body)
	}
}

// A retry while the first request with the key is still in flight (its
// body still arriving) gets 409; once the first is answered, retries get
// its answer.
func TestIdempotencyKeyInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	tok := b.tokens["acme"]
	const key = "slow-client"
	body := `{"channel":"sms","to":"+14155550100","body":"hello"}`
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", b.http.URL+"/v1/notifications", pr)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Idempotency-Key", key)
	var wg sync.WaitGroup
	var first *http.Response
	var firstErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		first, firstErr = http.DefaultClient.Do(req)
	}()
	if _, err := pw.Write([]byte(body[:10])); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the first request to take its key", func() bool {
		return b.rdb.Exists(context.Background(), api.IdempotencyRedisKey("acme", key)).Val() == 1
	})
	dup := b.do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", key)
	if dup.status != http.StatusConflict || dup.problem(t).Type != api.ProblemBase+"idempotency-in-flight" {
		t.Fatalf("concurrent duplicate: %d %s", dup.status, dup.body)
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
	again := b.do(t, "POST", "/v1/notifications", tok, body, "Idempotency-Key", key)
	if again.status != 202 || string(again.body) != string(firstBody) || len(b.queued(t)) != 1 {
		t.Fatalf("retry after the first: %d %s", again.status, again.body)
	}
}

// A tenant token acts for its own tenant only; another tenant's
// notification is answered like one that does not exist.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	acme, globex := b.tokens["acme"], b.tokens["globex"]
	r := b.do(t, "POST", "/v1/notifications", acme, sms("+14155550100", "secret text"))
	var a api.Accepted
	r.json(t, &a)
	theirs := b.do(t, "GET", "/v1/notifications/"+a.ID, globex, nil)
	none := b.do(t, "GET", "/v1/notifications/"+tasks.NewID(), globex, nil)
	if theirs.status != 404 || string(theirs.body) != string(none.body) {
		t.Fatalf("globex reading acme's notification: %d %s; a missing one: %d %s", theirs.status, theirs.body, none.status, none.body)
	}
	if strings.Contains(string(theirs.body), "acme") || strings.Contains(string(theirs.body), "0100") {
		t.Fatalf("404 leaks: %s", theirs.body)
	}
	if r := b.do(t, "GET", "/v1/notifications/"+a.ID+"?tenant=acme", globex, nil); r.status != 404 {
		t.Fatalf("?tenant=acme with globex's token: %d %s", r.status, r.body)
	}
	if r := b.do(t, "GET", "/v1/quotas?tenant=acme&channel=sms", globex, nil); r.status != 403 {
		t.Fatalf("globex reading acme's quotas: %d %s", r.status, r.body)
	}
	n := sms("+14155550101", "x")
	n["tenant"] = "acme"
	if r := b.do(t, "POST", "/v1/notifications", globex, n); r.status != 403 || r.problem(t).InvalidParams[0].Name != "tenant" {
		t.Fatalf("globex enqueueing for acme: %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/notifications?tenant=acme", globex, sms("+14155550101", "x")); r.status != 403 {
		t.Fatalf("globex enqueueing with ?tenant=acme: %d %s", r.status, r.body)
	}
	if n := len(b.queued(t)); n != 1 {
		t.Fatalf("%d tasks; the refused requests enqueued something", n)
	}
	// The admin reads every tenant, and must name the tenant to enqueue.
	if r := b.do(t, "GET", "/v1/notifications/"+a.ID, adminToken, nil); r.status != 200 {
		t.Fatalf("admin reading: %d %s", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/notifications", adminToken, sms("+14155550101", "x")); r.status != 422 || r.problem(t).Type != api.ProblemBase+"tenant-required" {
		t.Fatalf("admin enqueue without a tenant: %d %s; want 422 tenant-required (the schema cannot require ?tenant= for the admin only)", r.status, r.body)
	}
	if r := b.do(t, "POST", "/v1/notifications?tenant=globex", adminToken, sms("+14155550101", "x")); r.status != 202 {
		t.Fatalf("admin enqueue for globex: %d %s", r.status, r.body)
	}
	if r := b.do(t, "GET", "/v1/quotas?tenant=acme&channel=sms", adminToken, nil); r.status != 200 {
		t.Fatalf("admin quotas: %d %s", r.status, r.body)
	}
	if r := b.do(t, "GET", "/v1/quotas?channel=sms", adminToken, nil); r.status != 422 {
		t.Fatalf("admin quotas without a tenant: %d %s", r.status, r.body)
	}
}

func TestAuthentication(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	for name, tok := range map[string]string{"None": "", "Unknown": "sluice_0000_1111", "AdminTypo": adminToken + "x"} {
		t.Run(name, func(t *testing.T) {
			r := b.do(t, "GET", "/v1/quotas?channel=sms", tok, nil)
			if r.status != 401 || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("%d %v %s", r.status, r.header, r.body)
			}
			r.problem(t)
		})
	}
	ctx := context.Background()
	tok, info, err := b.srv.Tokens().Create(ctx, "acme", "ci", "test")
	if err != nil {
		t.Fatal(err)
	}
	if r := b.do(t, "GET", "/v1/quotas?channel=sms", tok, nil); r.status != 200 {
		t.Fatalf("new token: %d %s", r.status, r.body)
	}
	if err := b.srv.Tokens().Revoke(ctx, "globex", info.ID); err == nil {
		t.Fatal("globex revoked acme's token")
	}
	if err := b.srv.Tokens().Revoke(ctx, "acme", info.ID); err != nil {
		t.Fatal(err)
	}
	if r := b.do(t, "GET", "/v1/quotas?channel=sms", tok, nil); r.status != 401 {
		t.Fatalf("revoked token: %d %s", r.status, r.body)
	}
}

// Redis holds no token: neither as a key nor in a value.
func TestTokensStoredOnlyAsKeyedHash(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	ctx := context.Background()
	tok, info, err := b.srv.Tokens().Create(ctx, "acme", "", "test")
	if err != nil {
		t.Fatal(err)
	}
	secret := tok[strings.LastIndexByte(tok, '_')+1:]
	keys, err := b.rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		dump := k
		switch b.rdb.Type(ctx, k).Val() {
		case "string":
			dump += b.rdb.Get(ctx, k).Val()
		case "hash":
			dump += fmt.Sprint(b.rdb.HGetAll(ctx, k).Val())
		}
		if strings.Contains(dump, secret) {
			t.Fatalf("Redis key %s holds the token's secret", k)
		}
	}
	list, err := b.srv.Tokens().List(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || (list[0].ID != info.ID && list[1].ID != info.ID) {
		t.Fatalf("list: %+v", list)
	}
	// Another key does not verify the token.
	other, _ := api.NewTokens(b.rdb, strings.Repeat("k", api.MinTokenKey))
	if _, err := other.Lookup(ctx, tok); err == nil {
		t.Fatal("a token verified under another SLUICE_API_TOKEN_KEY")
	}
}

func TestRateLimitPerToken(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, map[string]string{"SLUICE_API_RATE": "3/1m"})
	for i := 0; i < 3; i++ {
		if r := b.do(t, "GET", "/v1/quotas?channel=sms", b.tokens["acme"], nil); r.status != 200 {
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		}
	}
	r := b.do(t, "GET", "/v1/quotas?channel=sms", b.tokens["acme"], nil)
	if r.status != 429 || r.header.Get("Retry-After") == "" || r.problem(t).RetryAfter < 1 {
		t.Fatalf("4th request: %d %v %s", r.status, r.header, r.body)
	}
	if r := b.do(t, "GET", "/v1/quotas?channel=sms", b.tokens["globex"], nil); r.status != 200 {
		t.Fatalf("another token is limited too: %d %s", r.status, r.body)
	}
}

// The quota endpoint answers what `sluice quota show --json` prints, under
// the plans in force: a plan change shows within 2 s.
func TestQuotasMatchTheCLIAndFollowPlans(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	for i := 0; i < 2; i++ {
		b.do(t, "POST", "/v1/notifications", b.tokens["acme"], sms("+14155550100", "x"))
	}
	lim, err := throttle.New(b.rdb, throttle.Options{Secret: []byte(b.wcfg.SubjectSecret), CompactMembers: b.wcfg.CompactMembers})
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
	r := b.do(t, "GET", "/v1/quotas?channel=sms&recipient=%2B14155550100", b.tokens["acme"], nil)
	var got report.QuotaJSON
	r.json(t, &got)
	policy, _ := plans.Parse(rules)
	rep, err := report.Quotas(context.Background(), lim, policy, b.cfg.Base, report.QuotaQuery{Tenant: "acme", Channel: tasks.SMS, Recipient: "+14155550100"})
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
	if _, err := plans.NewStore(b.rdb, defaults).Set(context.Background(), "acme", "sms:tenant=5/1h", "test"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "the quota view to show acme's plan", func() bool {
		var q report.QuotaJSON
		b.do(t, "GET", "/v1/quotas?channel=sms", b.tokens["acme"], nil).json(t, &q)
		return len(q.Windows) == 1 && q.Windows[0].Rule == "5/1h"
	})
	t.Logf("plan change visible in /v1/quotas after %v", time.Since(changed).Round(time.Millisecond))
	if r := b.do(t, "GET", "/v1/quotas?channel=pigeon&bogus=1", b.tokens["acme"], nil); r.status != 400 || len(r.problem(t).InvalidParams) != 2 {
		t.Fatalf("bad query: %d %s", r.status, r.body)
	}
	// A bare '+' in the query arrives as a space: refused, not read as another number.
	if r := b.do(t, "GET", "/v1/quotas?channel=sms&recipient=+14155550100", b.tokens["acme"], nil); r.status != 400 ||
		r.problem(t).InvalidParams[0].Name != "recipient" || strings.Contains(string(r.body), "5550100") {
		t.Fatalf("unencoded +: %d %s", r.status, r.body)
	}
}

// Wrong JSON types are named per field; fields the API sets cannot be
// slipped in under another case (encoding/json matches names ignoring case).
func TestFieldTypes(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	r := b.do(t, "POST", "/v1/notifications", b.tokens["acme"],
		`{"channel":"sms","to":14155550100,"body":"x","metadata":{"a":1},"Enqueued_At":"2020-01-01T00:00:00Z","ID":"mine"}`)
	if r.status != 422 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	got := map[string]string{}
	for _, ip := range r.problem(t).InvalidParams {
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
