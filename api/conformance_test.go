package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// Environment of TestOpenAPIConformance: its seed (default: a new one,
// logged) and its number of requests.
const (
	envConformanceSeed  = "SLUICE_CONFORMANCE_SEED"
	envConformanceCases = "SLUICE_CONFORMANCE_CASES"
)

// conformanceRules make the API's documented refusals reachable: news is
// bulk mail, with a default List-Unsubscribe for acme only.
const conformanceRules = "sms:recipient=100000/1m,email:recipient=100000/1m,email.news:bulk,acme/email.news:unsubscribe=https://acme.example/u/{id}"

// A property-based conformance test of the API against its OpenAPI
// document: thousands of requests per run, generated from the document's
// schemas (valid ones, and mutations meant to be invalid), seeded, sent to
// the real server on a real redis-server. kin-openapi judges each request
// against the document; then
//
//   - every response matches the document (status, headers, body);
//   - every pointer in a problem resolves in the request body (RFC 6901);
//   - a request the document allows is accepted (202/200/204), or refused
//     only for a reason the document states, checked independently here:
//     403 for another tenant, 404 for an unknown id, 409 and 422 for a
//     reused Idempotency-Key, 422 tenant-required for an admin without
//     ?tenant=, 422 no-rules, and 422 invalid-notification only for a
//     field that breaks one of the rules NotificationInput lists (UTF-8
//     byte limits from x-max-bytes, a past expiry, an unknown zone, headers
//     differing only in case, bulk mail without List-Unsubscribe) — never
//     400, never 5xx.
//
// SLUICE_CONFORMANCE_SEED replays a run; SLUICE_CONFORMANCE_CASES (default
// 2000) makes it longer.
func TestOpenAPIConformance(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(envConformanceSeed); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", envConformanceSeed, v, err)
		}
	}
	cases := 2000
	if v := os.Getenv(envConformanceCases); v != "" {
		var err error
		if cases, err = strconv.Atoi(v); err != nil || cases < 1 {
			t.Fatalf("%s=%q: want a positive number", envConformanceCases, v)
		}
	}
	t.Logf("seed %d, %d requests (replay with %s=%d)", seed, cases, envConformanceSeed, seed)

	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	doc.Servers = nil
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, conformanceRules, map[string]string{"SLUICE_API_RATE": "1000000/1s"})
	c := &conformance{t: t, b: b, doc: doc, router: router, body: compileBody(t, doc), g: &schemaGen{r: rand.New(rand.NewPCG(seed, seed^0x5eed))},
		keys: map[string]string{}, stats: map[string]int{}}
	for i := 0; i < cases; i++ {
		c.one(i)
		if t.Failed() && c.failures > 20 {
			t.Fatalf("stopping after %d failures (seed %d)", c.failures, seed)
		}
	}
	var lines []string
	for k, n := range c.stats {
		lines = append(lines, fmt.Sprintf("%6d  %s", n, k))
	}
	slices.Sort(lines)
	t.Logf("requests by operation, validity and status:\n%s", strings.Join(lines, "\n"))
	// The run must have exercised what it claims to.
	for _, want := range []string{"createNotifications valid 202", "createNotifications invalid 422", "createNotifications invalid 400",
		"getNotification valid 200", "getQuotas valid 200", "smsStatusCallback valid 204", "smsStatusCallback valid 404",
		"suppression valid 200", "suppression invalid 400", "events valid 200", "events invalid 422", "getQuotas invalid 400"} {
		if c.stats[want] == 0 && cases >= 1000 {
			t.Errorf("no %q in %d requests: the generator does not reach it", want, cases)
		}
	}
	if c.valid < cases/3 {
		t.Errorf("only %d of %d requests were valid by the document: the generator is off", c.valid, cases)
	}
	// Every notification answered 202 is in the queue (or sent).
	for _, id := range c.accepted[:min(len(c.accepted), 50)] {
		if _, err := b.Task(t, id); err != nil {
			t.Errorf("accepted %s is not in the queue: %v", id, err)
		}
	}
}

type conformance struct {
	t        *testing.T
	body     *jsonschema.Schema // POST /v1/notifications' request body
	b        *bundle
	doc      *openapi3.T
	router   routers.Router
	g        *schemaGen
	keys     map[string]string // tenant + Idempotency-Key → the body first sent with it
	accepted []string          // ids answered 202 (not replayed)
	queued   []string          // ids of notifications, for GET
	stats    map[string]int
	valid    int
	failures int
}

// request is one generated request and what the test knows about it.
type request struct {
	op, method, path string
	query            url.Values
	header           http.Header
	body             []byte
	token, tenant    string // the token, and the tenant it acts for ("" for the admin without ?tenant=)
	admin            bool
	signed           bool // a callback signed as the provider signs
	mutation         string
}

func (c *conformance) one(i int) {
	t := c.t
	req := c.generate()
	full := req.path
	if len(req.query) > 0 {
		full += "?" + req.query.Encode()
	}
	newReq := func(base string) *http.Request {
		r, err := http.NewRequest(req.method, base+full, bytes.NewReader(req.body))
		if err != nil {
			t.Fatal(err)
		}
		r.Header = req.header.Clone()
		return r
	}
	vreq := newReq("http://sluice.test")
	route, params, err := c.router.FindRoute(vreq)
	if err != nil {
		t.Fatalf("request %d: %s %s is not in the document: %v", i, req.method, full, err)
	}
	opts := &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true,
		AuthenticationFunc: func(_ context.Context, in *openapi3filter.AuthenticationInput) error {
			if !strings.HasPrefix(in.RequestValidationInput.Request.Header.Get("Authorization"), "Bearer ") {
				return in.NewError(nil)
			}
			return nil
		}}
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route, Options: opts}
	var reqErr error
	if req.op == "createNotifications" {
		// kin-openapi compiles a 3.1 schema for every request it checks,
		// which would take most of the run; the body is checked against the
		// same schema, compiled once, by the JSON Schema 2020-12 validator
		// kin-openapi uses for 3.1 (santhosh-tekuri/jsonschema).
		bodyOpts := *opts
		bodyOpts.ExcludeRequestBody = true
		in.Options = &bodyOpts
		reqErr = errors.Join(openapi3filter.ValidateRequest(context.Background(), in), c.validBody(req))
		in.Options = opts
	} else {
		reqErr = openapi3filter.ValidateRequest(context.Background(), in)
	}
	// OpenAPI lets a request carry query parameters an operation does not
	// list; the document says they are refused (400, BadRequest).
	for name := range req.query {
		isQuery := func(p *openapi3.ParameterRef) bool { return p.Value.In == "query" && p.Value.Name == name }
		if !slices.ContainsFunc(route.Operation.Parameters, isQuery) && !slices.ContainsFunc(route.PathItem.Parameters, isQuery) {
			reqErr = fmt.Errorf("query parameter %q is not the operation's", name)
		}
	}
	valid := reqErr == nil
	if valid {
		c.valid++
	}
	resp, err := sluicetest.Client(c.t).Do(newReq(c.b.HTTP.URL))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	validity := map[bool]string{true: "valid", false: "invalid"}[valid]
	c.stats[fmt.Sprintf("%s %s %d", req.op, validity, resp.StatusCode)]++
	fail := func(format string, args ...any) {
		c.failures++
		t.Errorf("request %d (%s %s, %s%s): %s\n  body: %.600s\n  answer %d: %.600s", i, req.method, full, validity,
			map[bool]string{true: "", false: ", mutation: " + req.mutation}[req.mutation != ""], fmt.Sprintf(format, args...), req.body, resp.StatusCode, raw)
	}
	// Every response matches the document.
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header, Options: opts}
	out.SetBodyBytes(raw)
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		fail("the answer does not match the document: %v", err)
	}
	if resp.StatusCode >= 500 {
		fail("a server error")
	}
	var problem struct {
		Type   string           `json:"type"`
		Params []map[string]any `json:"invalid-params"`
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		_ = json.Unmarshal(raw, &problem)
	}
	if req.op == "createNotifications" && resp.StatusCode != 415 && resp.StatusCode != 401 {
		c.checkPointers(req, problem.Params, fail)
	}
	if key, ok, _ := api.ParseIdempotencyKey(req.header); ok && resp.StatusCode == http.StatusAccepted {
		if _, seen := c.keys[req.tenant+"\x00"+key]; !seen {
			c.keys[req.tenant+"\x00"+key] = full + "\n" + string(req.body) // what the server's record holds
		}
	}
	if resp.StatusCode == http.StatusAccepted && req.op == "createNotifications" && resp.Header.Get("Idempotent-Replayed") == "" {
		var one api.Accepted
		var batch api.BatchAccepted
		if json.Unmarshal(raw, &batch) == nil && len(batch.Notifications) > 0 {
			for _, a := range batch.Notifications {
				c.accepted, c.queued = append(c.accepted, a.ID), append(c.queued, a.ID)
			}
		} else if json.Unmarshal(raw, &one) == nil {
			c.accepted, c.queued = append(c.accepted, one.ID), append(c.queued, one.ID)
		}
	}
	if !valid {
		// Both ways: what the document refuses, the server refuses too.
		if strictOps[req.op] && (resp.StatusCode < 400 || problem.Type == api.ProblemBase+"no-rules") {
			fail("the server went past a request the document refuses: %v", reqErr)
		}
		return
	}
	// A request the document allows: accepted, or refused for a stated reason.
	switch st := resp.StatusCode; {
	case st >= 200 && st < 300:
	case st == http.StatusForbidden:
		if !c.otherTenant(req) && !(req.op == "smsStatusCallback" && !req.signed) {
			fail("403 for a request that names no other tenant")
		}
	case st == http.StatusNotFound:
		if req.op != "getNotification" && req.op != "smsStatusCallback" {
			fail("404 for a documented operation")
		}
	case st == http.StatusConflict:
		if req.header.Get("Idempotency-Key") == "" {
			fail("409 without an Idempotency-Key")
		}
	case st == http.StatusUnprocessableEntity:
		c.check422(req, full, problem.Type, problem.Params, fail)
	case st == http.StatusTooManyRequests:
	default:
		fail("status %d for a request the document allows", st)
	}
}

// otherTenant: the request names a tenant its token may not act for.
func (c *conformance) otherTenant(req request) bool {
	if !req.admin && req.query.Get("tenant") != "" && req.query.Get("tenant") != req.tenant {
		return true
	}
	for _, n := range notificationsOf(req.body) {
		if t, ok := n["tenant"].(string); ok && t != req.tenant {
			return true
		}
	}
	return false
}

// check422 accepts a 422 for a valid request only for a documented reason.
func (c *conformance) check422(req request, full, typ string, params []map[string]any, fail func(string, ...any)) {
	switch typ {
	case api.ProblemBase + "tenant-required":
		if !req.admin || req.query.Get("tenant") != "" {
			fail("tenant-required, yet the request is not an admin's without ?tenant=")
		}
		return
	case api.ProblemBase + "no-rules":
		if req.op != "getQuotas" {
			fail("no-rules outside /v1/quotas")
		}
		return
	case api.ProblemBase + "idempotency-mismatch":
		key, _, _ := api.ParseIdempotencyKey(req.header) // "k" and "\"k\"" are one key
		if first, ok := c.keys[req.tenant+"\x00"+key]; !ok || first == full+"\n"+string(req.body) {
			fail("idempotency-mismatch for a key not accepted before for another request")
		}
		return
	case api.ProblemBase + "invalid-event":
		if req.op == "suppression" || req.op == "events" {
			c.checkEvent422(req, fail)
			return
		}
		fail("invalid-event outside the consent routes")
		return
	case api.ProblemBase + "invalid-notification":
	default:
		fail("422 of type %q", typ)
		return
	}
	ns := notificationsOf(req.body)
	for _, p := range params {
		name, _ := p["name"].(string)
		idx := 0
		if f, ok := p["index"].(float64); ok {
			idx = int(f)
		}
		if idx >= len(ns) {
			fail("invalid param %v names no notification of the request", p)
			continue
		}
		if why := c.documented(ns[idx], req.tenant)[name]; why == "" {
			fail("422 names %q, which breaks none of the rules the document states for a valid notification", name)
		}
	}
}

// documented lists the fields of a notification that break a rule the
// document states in words (NotificationInput) rather than in its schema,
// computed here without the server's code.
func (c *conformance) documented(n map[string]any, tenant string) map[string]string {
	out := map[string]string{}
	ch, _ := n["channel"].(string)
	branch := c.doc.Components.Schemas["SMSNotification"].Value
	if ch == "email" {
		branch = c.doc.Components.Schemas["EmailNotification"].Value
	}
	overBytes := func(s *openapi3.Schema, v string) bool {
		max, ok := s.Extensions["x-max-bytes"].(float64)
		return ok && float64(len(v)) > max
	}
	for name, ref := range branch.Properties {
		switch v := n[name].(type) {
		case string:
			if overBytes(ref.Value, v) {
				out[name] = "over x-max-bytes"
			}
		case map[string]any:
			seen := map[string]bool{}
			for k, e := range v {
				entry := name + "[" + strconv.Quote(k) + "]"
				if pn := ref.Value.PropertyNames; pn != nil && overBytes(pn.Value, k) {
					out[entry] = "key over x-max-bytes"
				}
				if s, ok := e.(string); ok && ref.Value.AdditionalProperties.Schema != nil && overBytes(ref.Value.AdditionalProperties.Schema.Value, s) {
					out[entry] = "value over x-max-bytes"
				}
				if name == "headers" {
					lower := strings.ToLower(k)
					if seen[lower] {
						out[entry] = "differs from another only in case"
					}
					seen[lower] = true
				}
			}
			if name == "headers" && len(seen) < len(v) {
				for k := range v { // which of the two is named depends on the order
					out[name+"["+strconv.Quote(k)+"]"] = "differs from another only in case"
				}
			}
		}
	}
	body, _ := n["body"].(string)
	html, _ := n["html"].(string)
	if len(body)+len(html) > 262144 {
		out["html"], out["body"] = "body and html over 262144 bytes", "body and html over 262144 bytes"
	}
	if enc, _ := json.Marshal(n); len(enc) > 300000 {
		out["notification"] = "encodes to over 327680 bytes"
	}
	if s, ok := n["expires_at"].(string); ok {
		if t, err := time.Parse(time.RFC3339Nano, s); err == nil && t.Before(time.Now().Add(2*time.Second)) {
			out["expires_at"] = "not a second ahead"
		}
	}
	if s, ok := n["ttl"].(string); ok {
		if d, err := time.ParseDuration(s); err == nil && d > 400*24*time.Hour {
			out["ttl"] = "over 400 days"
		}
	}
	if s, ok := n["tz"].(string); ok {
		if _, err := time.LoadLocation(s); err != nil || s == "Local" {
			out["tz"] = "not in the zone database"
		}
	}
	if _, has := n["list_unsubscribe"]; ch == "email" && n["category"] == "news" && !has && tenant != "acme" {
		out["list_unsubscribe"] = "bulk mail without List-Unsubscribe"
	}
	if _, has := n["body"]; ch == "whatsapp" && has {
		// No recipient has written to a tenant here: every free-form
		// WhatsApp message is outside its customer-service window.
		out["body"] = "a free-form WhatsApp message outside the customer-service window"
	}
	return out
}

// checkPointers: every invalid param of a problem about the body has a
// JSON Pointer that resolves in it; a query parameter or header has none.
func (c *conformance) checkPointers(req request, params []map[string]any, fail func(string, ...any)) {
	var doc any
	if json.Unmarshal(req.body, &doc) != nil {
		return
	}
	for _, p := range params {
		s, ok := p["pointer"].(string)
		name, _ := p["name"].(string)
		if !ok {
			if name != "Idempotency-Key" && name != "tenant" {
				fail("invalid param %v has no pointer", p)
			}
			continue
		}
		if err := resolve(doc, s); err != nil {
			fail("pointer %q does not resolve: %v", s, err)
		}
	}
}

// notificationsOf reads the notifications of a request body (one, or a
// batch's), as maps; nil if it has none.
func notificationsOf(body []byte) []map[string]any {
	var top map[string]any
	if json.Unmarshal(body, &top) != nil {
		return nil
	}
	items, ok := top["notifications"].([]any)
	if !ok {
		return []map[string]any{top}
	}
	var out []map[string]any
	for _, it := range items {
		m, _ := it.(map[string]any)
		out = append(out, m)
	}
	return out
}

// generate makes one request: mostly notifications, then status and quota
// reads, callbacks, and the operational endpoints; a quarter of them
// mutated to be invalid.
func (c *conformance) generate() request {
	g, b := c.g, c.b
	req := request{header: http.Header{}, query: url.Values{}}
	who := g.r.IntN(20)
	switch {
	case who < 14:
		req.token, req.tenant = b.Tokens["acme"], "acme"
	case who < 17:
		req.token, req.tenant = b.Tokens["globex"], "globex"
	default:
		req.token, req.admin = adminToken, true
	}
	param := func(name string) *openapi3.Schema {
		return c.doc.Components.Parameters[name].Value.Schema.Value
	}
	// ?tenant=: an admin names one (mostly); a tenant token rarely names any.
	if req.admin && g.r.IntN(6) > 0 || !req.admin && g.r.IntN(10) == 0 {
		t := "acme"
		if g.r.IntN(4) == 0 {
			t = g.str(param("Tenant"))
		}
		req.query.Set("tenant", t)
		if req.admin {
			req.tenant = t
		}
	}
	invalid := g.r.IntN(4) == 0
	switch op := g.r.IntN(100); {
	case op < 50:
		req.op, req.method, req.path = "createNotifications", "POST", "/v1/notifications"
		input := c.doc.Components.Schemas["NotificationInput"].Value
		var body any
		if g.r.IntN(10) < 7 {
			n := g.value(input).(map[string]any)
			if invalid {
				n, req.mutation = g.mutate(n)
			}
			body = n
		} else {
			items := make([]any, 1+g.r.IntN(4))
			for i := range items {
				items[i] = g.value(input)
			}
			if invalid {
				items[0], req.mutation = g.mutate(items[0].(map[string]any))
			}
			body = map[string]any{"notifications": items}
		}
		req.body, _ = json.Marshal(body)
		if invalid && g.r.IntN(8) == 0 {
			req.body, req.mutation = req.body[:len(req.body)/2], "truncated JSON"
		}
		req.header.Set("Content-Type", "application/json")
		if g.r.IntN(3) == 0 { // an Idempotency-Key: a new one, or one used before
			key := g.str(param("IdempotencyKey"))
			if g.r.IntN(3) == 0 && len(c.keys) > 0 {
				for _, k := range slices.Sorted(maps.Keys(c.keys)) {
					if tenant, used, _ := strings.Cut(k, "\x00"); tenant == req.tenant && g.r.IntN(3) == 0 {
						key = `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(used) + `"`
						if first := c.keys[k]; g.r.IntN(2) == 0 && strings.HasPrefix(first, "/v1/notifications\n") {
							req.body = []byte(strings.TrimPrefix(first, "/v1/notifications\n")) // the same request again
							req.query.Del("tenant")
						}
						break
					}
				}
			}
			if invalid && g.r.IntN(3) == 0 {
				key, req.mutation = []string{"", `"unclosed`, `"a\b"`, `"a" b`, strings.Repeat("k", 256), `""`}[g.r.IntN(6)], "bad Idempotency-Key"
			}
			req.header.Set("Idempotency-Key", key)
		}
	case op < 60:
		req.op, req.method = "getNotification", "GET"
		id := g.str(c.doc.Paths.Find("/v1/notifications/{id}").Get.Parameters[0].Value.Schema.Value)
		if len(c.queued) > 0 && g.r.IntN(3) > 0 {
			id = c.queued[g.r.IntN(len(c.queued))]
		}
		if invalid {
			id, req.mutation = []string{"a%20b", "%C3%A9", strings.Repeat("x", 65)}[g.r.IntN(3)], "bad id"
		}
		req.path = "/v1/notifications/" + id
	case op < 70:
		req.op, req.method, req.path = "getQuotas", "GET", "/v1/quotas"
		for _, p := range c.doc.Paths.Find("/v1/quotas").Get.Parameters {
			if p.Value.In == "query" && p.Value.Name != "tenant" && g.r.IntN(2) == 0 {
				req.query.Set(p.Value.Name, fmt.Sprint(g.value(p.Value.Schema.Value)))
			}
		}
		if invalid {
			bad := map[string][]string{"channel": {"fax", "SMS", ""}, "recipient": {"4155550100", "+1 415 555 0100", "a@b", ""},
				"category": {"Big Sale", ""}, "colour": {"x"}, "from": {"café", "", "a\tb", strings.Repeat("x", 255)}}
			k := []string{"channel", "recipient", "category", "colour", "from"}[g.r.IntN(5)]
			req.query.Set(k, bad[k][g.r.IntN(len(bad[k]))])
			req.mutation = "bad " + k
		}
	case op < 85:
		c.consentRequest(&req, invalid)
	case op < 97:
		req.op, req.method = "smsStatusCallback", "POST"
		tenant, id := "acme", g.regex(`^[A-Za-z0-9._-]{1,64}$`)
		if len(c.accepted) > 0 && g.r.IntN(2) == 0 {
			id = c.accepted[g.r.IntN(len(c.accepted))]
			markSent(c.t, b, "acme", id)
		}
		req.path = "/v1/callbacks/sms/" + tenant + "/" + id
		form := url.Values{}
		schema := c.doc.Paths.Find("/v1/callbacks/sms/{tenant}/{id}").Post.RequestBody.Value.Content["application/x-www-form-urlencoded"].Schema.Value
		for k, v := range g.object(schema) {
			form.Set(k, fmt.Sprint(v))
		}
		if invalid {
			form.Set([]string{"MessageStatus", "ErrorCode", "MessageSid"}[g.r.IntN(3)], "not-valid!")
			req.mutation = "bad form field"
		}
		req.body = []byte(form.Encode())
		req.header.Set("Content-Type", "application/x-www-form-urlencoded")
		sig := "bm9wZQ=="
		if g.r.IntN(10) < 8 {
			sig, req.signed = fakes.Sign(b.SMS.AuthToken, b.CallbackURL+req.path, form), true
		}
		req.header.Set("X-Twilio-Signature", sig)
		req.token = ""
	default:
		req.op, req.method, req.path = "operations", "GET", []string{"/openapi.yaml", "/healthz", "/readyz"}[g.r.IntN(3)]
		req.token = ""
	}
	if req.op != "createNotifications" && req.op != "getQuotas" && req.op != "getNotification" && !strictOps[req.op] {
		req.query.Del("tenant")
	}
	if req.token != "" {
		req.header.Set("Authorization", "Bearer "+req.token)
		if invalid && g.r.IntN(10) == 0 {
			req.header.Del("Authorization")
			req.mutation = "no token"
		}
	}
	return req
}

// resolve resolves an RFC 6901 pointer in doc with go-openapi/jsonpointer.
func resolve(doc any, pointer string) error {
	p, err := newPointer(pointer)
	if err != nil {
		return err
	}
	_, _, err = p.Get(doc)
	return err
}

// compileBody compiles the request body schema of POST /v1/notifications
// out of the whole document (its $refs resolve in it), formats asserted.
func compileBody(t *testing.T, doc *openapi3.T) *jsonschema.Schema {
	t.Helper()
	raw, err := doc.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	whole, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	comp := jsonschema.NewCompiler()
	comp.DefaultDraft(jsonschema.Draft2020)
	comp.AssertFormat()
	if err := comp.AddResource("https://sluice.test/openapi.json", whole); err != nil {
		t.Fatal(err)
	}
	sch, err := comp.Compile("https://sluice.test/openapi.json#/paths/~1v1~1notifications/post/requestBody/content/application~1json/schema")
	if err != nil {
		t.Fatal(err)
	}
	return sch
}

// validBody checks a request body against the compiled schema.
func (c *conformance) validBody(req request) error {
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(req.body))
	if err != nil {
		return fmt.Errorf("body is not JSON: %w", err)
	}
	return c.body.Validate(v)
}
