package api_test

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/go-openapi/jsonpointer"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/apienv"
)

// newPointer is the RFC 6901 implementation the tests resolve pointers with.
var newPointer = jsonpointer.New

// resolvePointers checks every pointer of a problem answer with
// go-openapi's RFC 6901 implementation against the request body it
// answers: each invalid param must have one ("" is the whole body), and it
// must resolve. It returns how many it checked.
func resolvePointers(t *testing.T, body []byte, r apienv.Reply) int {
	t.Helper()
	r.Problem(t)
	var doc any
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("request body is not JSON: %v", err)
	}
	var p struct {
		Params []map[string]any `json:"invalid-params"`
	}
	r.JSON(t, &p)
	if len(p.Params) == 0 {
		t.Errorf("%s: no invalid-params: %s", body, r.Body)
	}
	for _, ip := range p.Params {
		s, ok := ip["pointer"].(string)
		if !ok {
			t.Errorf("%v: no pointer, for a member of the body %s", ip, body)
			continue
		}
		ptr, err := jsonpointer.New(s)
		if err != nil {
			t.Errorf("%v: pointer %q is not an RFC 6901 JSON Pointer: %v", ip["name"], s, err)
			continue
		}
		if _, _, err := ptr.Get(doc); err != nil {
			t.Errorf("%v: pointer %q does not resolve against %s: %v", ip["name"], s, body, err)
		}
	}
	return len(p.Params)
}

// Every invalid field the decoder can report — each field of the payload
// with a value of the wrong type and with a bad value, members spelled in
// another case, unknown members, header names with "/" and "~", bad
// metadata keys, both ttl and expires_at, a bulk email without
// List-Unsubscribe, another tenant's name, a malformed batch — comes with a
// JSON Pointer that resolves in the request body (go-openapi/jsonpointer),
// alone and at every position of a batch.
func TestProblemPointersResolve(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=100/1m,email:recipient=100/1m,email.news:bulk", nil)
	email := func(extra map[string]any) map[string]any {
		n := map[string]any{"channel": "email", "to": "ann@example.com", "subject": "Hi", "body": "Hello"}
		for k, v := range extra {
			n[k] = v
		}
		return n
	}
	var cases []map[string]any
	// Each field of the payload: the wrong JSON type, and a value Validate refuses.
	ty := reflect.TypeFor[tasks.Notification]()
	bad := map[string]any{"tenant": "no/such tenant", "channel": "fax", "to": "nobody", "from": "x\r\ny", "messaging_service_sid": "MG1",
		"subject": "", "body": " ", "template_id": strings.Repeat("t", 200), "metadata": map[string]any{"": "v"}, "html": " ",
		"reply_to": "Ann <ann@example.com>", "headers": map[string]any{"Bcc": "x"}, "list_unsubscribe": "http://x.example",
		"category": "Big Sale", "user": "jane doe", "expires_at": "2001-01-01T00:00:00Z", "tz": "Mars/Olympus", "enqueued_at": "2026-01-01T00:00:00Z", "id": "mine",
		"fallback": map[string]any{"channel": "email", "to": "ann@example.com"}, "fallback_for": "other", "fallback_on_timeout": true,
		"template": map[string]any{"name": "Not A Name"}}
	for i := 0; i < ty.NumField(); i++ {
		name, _, _ := strings.Cut(ty.Field(i).Tag.Get("json"), ",")
		wrong := any(12345)
		if ty.Field(i).Type.Kind() != reflect.String {
			wrong = "a string"
		}
		cases = append(cases, email(map[string]any{name: wrong}))
		v, ok := bad[name]
		if !ok {
			t.Fatalf("no bad value for field %q: add one", name)
		}
		cases = append(cases, email(map[string]any{name: v}))
	}
	cases = append(cases,
		email(map[string]any{"ttl": 5}), email(map[string]any{"ttl": "1 hour"}), email(map[string]any{"ttl": "1h", "expires_at": "2099-01-01T00:00:00Z"}),
		email(map[string]any{"TTL": "0s", "To": "nobody", "SUBJECT": "a\nb"}),
		email(map[string]any{"a/b~c": 1, "~": 2, "/": 3, "": 4}),
		email(map[string]any{"headers": map[string]any{"X-a/b": "v", "X~y": " ", "x~1z/": "v", "X-Ok": "fine", "x-ok": "dup", "~0": "\x7f", "content-type": "x"}}),
		email(map[string]any{"metadata": map[string]any{"": "v", "k/~": strings.Repeat("v", 600)}}),
		email(map[string]any{"category": "news"}), // bulk: no List-Unsubscribe
		map[string]any{"channel": "sms", "to": "+14155550100", "body": "hi", "subject": "s", "html": "<p>", "headers": map[string]any{"a": "b"}},
		map[string]any{"channel": "sms", "to": "+14155550100", "body": "hi", "from": "+15005550006", "messaging_service_sid": "MG0123456789abcdef0123456789abcdef"},
		map[string]any{}, map[string]any{"channel": "email"},
	)
	post := func(body any) (apienv.Reply, []byte) {
		raw, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		return b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], raw), raw
	}
	checked := 0
	for i, c := range cases {
		r, raw := post(c)
		if r.Status != http.StatusUnprocessableEntity && r.Status != http.StatusForbidden {
			t.Errorf("case %d %s: status %d, want 422 or 403: %s", i, raw, r.Status, r.Body)
			continue
		}
		checked += resolvePointers(t, raw, r)
	}
	// The same notifications in batches, and a malformed batch's own members.
	for i := 0; i+3 <= len(cases); i += 3 {
		r, raw := post(map[string]any{"notifications": []any{cases[i], email(nil), cases[i+1], cases[i+2], "not an object", 7}})
		checked += resolvePointers(t, raw, r)
	}
	for _, body := range []any{
		map[string]any{"notifications": []any{}, "x/y": 1, "~z": 2},
		map[string]any{"notifications": "none"},
		map[string]any{"notifications": []any{map[string]any{"tenant": "globex", "channel": "sms", "to": "+14155550100", "body": "x"}}},
		map[string]any{"Tenant": "globex", "channel": "sms", "to": "+14155550100", "body": "x"},
	} {
		r, raw := post(body)
		checked += resolvePointers(t, raw, r)
	}
	t.Logf("%d pointers resolved", checked)

	// The escapes as RFC 6901 writes them, for a header name with both.
	r, _ := post(email(map[string]any{"headers": map[string]any{"X~a/b": "v"}}))
	if p := r.Problem(t); len(p.InvalidParams) != 1 || p.InvalidParams[0].Pointer != "/headers/X~0a~1b" {
		t.Errorf("header X~a/b: %s; want the pointer /headers/X~0a~1b", r.Body)
	}
	r, _ = post(map[string]any{"notifications": []any{email(nil), email(map[string]any{"headers": map[string]any{"X-Campaign": " "}})}})
	if p := r.Problem(t); len(p.InvalidParams) != 1 || p.InvalidParams[0].Pointer != "/notifications/1/headers/X-Campaign" ||
		p.InvalidParams[0].Name != `headers["X-Campaign"]` {
		t.Errorf("empty X-Campaign in a batch: %s", r.Body)
	}
	r, raw := post(map[string]any{"channel": "email", "to": "ann@example.com", "body": "no subject"})
	if !strings.Contains(string(r.Body), `"pointer":""`) {
		t.Errorf("a missing member of a single notification should point at the whole body (\"\"): %s for %s", r.Body, raw)
	}
}
