package api_test

import (
	"context"
	"net/http"
	"testing"
)

// A body that repeats a member name in one object is refused on every
// route that takes JSON — 422 duplicate-member, the pointer naming the
// repeated member — and nothing is done: a validating proxy in front may
// have read the other of the two.
func TestDuplicateMembersRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=100/1m,email:recipient=100/1m", nil)
	acme := b.Tokens["acme"]
	for _, c := range []struct {
		name, method, path, body, pointer string
	}{
		{"notification", "POST", "/v1/notifications",
			`{"channel":"sms","to":"+14155550123","body":"a","body":"b"}`, "/body"},
		{"batch item", "POST", "/v1/notifications",
			`{"notifications":[{"channel":"sms","to":"+14155550123","body":"a"},{"channel":"sms","to":"+14155550124","to":"+14155550125","body":"b"}]}`, "/notifications/1/to"},
		{"batch wrapper", "POST", "/v1/notifications",
			`{"notifications":[{"channel":"sms","to":"+14155550123","body":"a"}],"notifications":[]}`, "/notifications"},
		{"email header", "POST", "/v1/notifications",
			`{"channel":"email","to":"a@example.com","subject":"s","body":"b","headers":{"X-A/B":"1","X-A/B":"2"}}`, "/headers/X-A~1B"},
		{"events", "POST", "/v1/events/email",
			`{"events":[{"recipient":"r@example.com","type":"bounce","type":"complaint"}]}`, "/events/0/type"},
		{"suppression", "POST", "/v1/suppressions/sms/+14155550123",
			`{"type":"opt-out","type":"opt-in"}`, "/type"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := b.Do(t, c.method, c.path, acme, c.body)
			if r.Status != http.StatusUnprocessableEntity {
				t.Fatalf("%d %s", r.Status, r.Body)
			}
			p := r.Problem(t)
			if p.Type != "urn:sluice:problem:duplicate-member" || len(p.InvalidParams) != 1 || p.InvalidParams[0].Pointer != c.pointer {
				t.Fatalf("problem %+v, want duplicate-member at %s", p, c.pointer)
			}
		})
	}
	if q := b.Queued(t); len(q) != 0 {
		t.Fatalf("%d tasks enqueued from refused bodies", len(q))
	}
	if n := len(b.RDB.Keys(context.Background(), "*consent*").Val()); n != 0 {
		t.Fatalf("%d consent keys written from refused bodies", n)
	}
	// The same member name in two objects is no repeat.
	r := b.Do(t, "POST", "/v1/notifications", acme,
		`{"notifications":[{"channel":"sms","to":"+14155550123","body":"a"},{"channel":"sms","to":"+14155550124","body":"b"}]}`)
	if r.Status != http.StatusAccepted {
		t.Fatalf("a batch without repeats: %d %s", r.Status, r.Body)
	}
}

// A string that is not UTF-8 text — invalid bytes, or the \u escape of a
// lone surrogate — is refused (422 invalid-text, the pointer naming the
// member), nothing done: encoding/json would have sent U+FFFD instead
// (issue 50: they were accepted, 202).
func TestInvalidTextRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=100/1m,email:recipient=100/1m", nil)
	acme := b.Tokens["acme"]
	for _, c := range []struct {
		name, path, body, pointer string
	}{
		{"bytes", "/v1/notifications", "{\"channel\":\"sms\",\"to\":\"+14155550123\",\"body\":\"caf\xe9\"}", "/body"},
		{"lone surrogate", "/v1/notifications", `{"channel":"email","to":"a@example.com","subject":"hi \ud800","body":"b"}`, "/subject"},
		{"low surrogate first", "/v1/notifications", `{"channel":"sms","to":"+14155550123","body":"\udc00\ud800"}`, "/body"},
		{"batch item", "/v1/notifications", "{\"notifications\":[{\"channel\":\"sms\",\"to\":\"+14155550123\",\"body\":\"a\"},{\"channel\":\"sms\",\"to\":\"+14155550124\",\"body\":\"\xff\"}]}", "/notifications/1/body"},
		{"metadata value", "/v1/notifications", `{"channel":"sms","to":"+14155550123","body":"a","metadata":{"k/1":"\udfff"}}`, "/metadata/k~11"},
		{"events", "/v1/events/email", "{\"events\":[{\"recipient\":\"r\xc3\x28@example.com\",\"type\":\"bounce\"}]}", "/events/0/recipient"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := b.Do(t, "POST", c.path, acme, c.body)
			if r.Status != http.StatusUnprocessableEntity {
				t.Fatalf("%d %s", r.Status, r.Body)
			}
			p := r.Problem(t)
			if p.Type != "urn:sluice:problem:invalid-text" || len(p.InvalidParams) != 1 || p.InvalidParams[0].Pointer != c.pointer {
				t.Fatalf("problem %+v, want invalid-text at %s", p, c.pointer)
			}
		})
	}
	if q := b.Queued(t); len(q) != 0 {
		t.Fatalf("%d tasks enqueued from refused bodies", len(q))
	}
	// A surrogate pair, escaped, is text (U+1F600).
	if r := b.Do(t, "POST", "/v1/notifications", acme, `{"channel":"sms","to":"+14155550123","body":"ok \ud83d\ude00"}`); r.Status != http.StatusAccepted {
		t.Fatalf("a surrogate pair: %d %s", r.Status, r.Body)
	}
}
