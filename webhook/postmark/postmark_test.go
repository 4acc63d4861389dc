package postmark_test

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/testkit/webhooktest"
	"github.com/sluicehq/sluice/webhook"
	"github.com/sluicehq/sluice/webhook/postmark"
)

// Postmark's documented examples, trimmed.
const (
	hardBounce = `{"RecordType":"Bounce","ID":4323372036854775807,"Type":"HardBounce","TypeCode":1,"Name":"Hard bounce","MessageID":"883953f4-6105-42a2-a16a-77a8eac79483","Description":"The server was unable to deliver your message (ex: unknown user, mailbox not found).","Details":"smtp;550 5.1.1 The email account that you tried to reach does not exist.","Email":"bob@example.com","From":"sender@example.com","BouncedAt":"2019-11-05T16:33:54.9070259Z","Inactive":true,"CanActivate":true,"Subject":"Test subject","ServerID":23,"MessageStream":"outbound"}`
	softBounce = `{"RecordType":"Bounce","ID":42,"Type":"SoftBounce","TypeCode":4096,"MessageID":"m-soft","Email":"ed@example.com"}`
	complaint  = `{"RecordType":"SpamComplaint","ID":42,"Type":"SpamComplaint","TypeCode":512,"MessageID":"00000000-0000-0000-0000-000000000000","Email":"cy@example.com"}`
	unsub      = `{"RecordType":"SubscriptionChange","MessageID":"883953f4-6105-42a2-a16a-77a8eac79483","ServerID":123456,"MessageStream":"outbound","ChangedAt":"2020-02-01T10:53:34.416071Z","Recipient":"di@example.com","Origin":"Recipient","SuppressSending":true,"SuppressionReason":"ManualSuppression","Tag":"my-tag"}`
	reactivate = `{"RecordType":"SubscriptionChange","MessageID":"m-re","Recipient":"di@example.com","SuppressSending":false,"SuppressionReason":null}`
)

const user, pass = "sluice", "0123456789abcdef0123"

func post(t *testing.T, b *webhooktest.Bundle, tenant, body, u, p string) webhooktest.Reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.URL(tenant), bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if u != "" {
		req.SetBasicAuth(u, p)
	}
	return b.Do(t, req)
}

func TestAuthenticatedEventsAreRecorded(t *testing.T) {
	t.Parallel()
	b := webhooktest.New(t, postmark.Provider{}, nil)
	b.Set(t, "acme", webhook.Credentials{User: user, Password: pass})
	b.Set(t, "walled", webhook.Credentials{User: user, Password: pass, AllowIPs: []string{"10.0.0.0/8", "192.0.2.7"}})
	for name, r := range map[string]webhooktest.Reply{
		"NoAuth":        post(t, b, "acme", hardBounce, "", ""),
		"WrongPassword": post(t, b, "acme", hardBounce, user, pass+"x"),
		"WrongUser":     post(t, b, "acme", hardBounce, "other", pass),
		"NotAllowedIP":  post(t, b, "walled", hardBounce, user, pass),
	} {
		if r.Status != http.StatusForbidden {
			t.Errorf("%s: %d %s, want 403", name, r.Status, r.Body)
		}
	}
	b.NothingRecorded(t, "a refused delivery")

	for _, body := range []string{hardBounce, softBounce, complaint, unsub, reactivate} {
		if r := post(t, b, "acme", body, user, pass); r.Status != http.StatusOK || r.Answer.Recorded+r.Answer.Ignored != 1 {
			t.Fatalf("%s: %d %s", body[:40], r.Status, r.Body)
		}
	}
	want := map[string]consent.Event{
		"bob@example.com": {Action: consent.Undeliverable, Source: consent.SourceBounce, Code: 550, Ref: "postmark.883953f4-6105-42a2-a16a-77a8eac79483"},
		"cy@example.com":  {Action: consent.OptOut, Source: consent.SourceComplaint, Ref: "postmark.00000000-0000-0000-0000-000000000000"},
		"di@example.com":  {Action: consent.OptOut, Source: consent.SourceAPI, Ref: "postmark.883953f4-6105-42a2-a16a-77a8eac79483"},
	}
	for addr, w := range want {
		l := b.Ledger(t, "acme", addr)
		if len(l) != 1 || l[0].Action != w.Action || l[0].Source != w.Source || l[0].Code != w.Code || l[0].Ref != w.Ref {
			t.Errorf("%s: ledger %+v, want %+v", addr, l, w)
		}
	}
	if l := b.Ledger(t, "acme", "ed@example.com"); len(l) != 0 {
		t.Errorf("a soft bounce was recorded: %+v", l)
	}
	// An allowlist that names the client lets it in.
	b.Set(t, "walled", webhook.Credentials{User: user, Password: pass, AllowIPs: []string{"127.0.0.0/8"}})
	if r := post(t, b, "walled", strings.Replace(complaint, `"ID":42`, `"ID":43`, 1), user, pass); r.Status != http.StatusOK || r.Answer.Recorded != 1 {
		t.Fatalf("allowed client: %d %s", r.Status, r.Body)
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	p := postmark.Provider{}
	if err := p.Check(webhook.Credentials{User: user, Password: pass, AllowIPs: []string{"3.134.147.250", "50.31.156.0/24"}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []webhook.Credentials{{}, {User: user}, {User: user, Password: "short"}, {User: "a:b", Password: pass},
		{User: user, Password: pass, AllowIPs: []string{"nope"}}, {User: user, Password: pass, Key: "k"}} {
		if err := p.Check(c); err == nil {
			t.Errorf("%+v passed", c)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{hardBounce, softBounce, complaint, unsub, reactivate, `{"RecordType":"Bounce","Type":"HardBounce","ID":"x y"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := postmark.Parse(body)
		if err != nil {
			return
		}
		if len(b.Items)+b.Ignored != 1 {
			t.Fatalf("one record became %+v", b)
		}
		for _, it := range b.Items {
			if _, _, err := it.Report.Event(time.Hour, time.Now()); err != nil {
				t.Fatalf("an item the parser kept does not map: %+v: %v", it, err)
			}
		}
	})
}

// Postmark signs no nonce: a replayed delivery — Postmark's retry, or
// anyone holding the basic auth — records nothing again, keyed by its
// RecordType and ID (a subscription change by its MessageID, recipient,
// time and direction), whatever the tenant (issue 53: a replayed delivery
// was recorded again). Postmark's documented bounce, spam complaint and
// subscription change examples (postmarkapp.com/developer/webhooks).
func TestReplaysRecordNothingAgain(t *testing.T) {
	t.Parallel()
	b := webhooktest.New(t, postmark.Provider{}, nil)
	b.Set(t, "acme", webhook.Credentials{User: user, Password: pass})
	b.Set(t, "globex", webhook.Credentials{User: user, Password: pass})
	for _, c := range []struct{ body, addr string }{{hardBounce, "bob@example.com"}, {complaint, "cy@example.com"}, {unsub, "di@example.com"}} {
		if r := post(t, b, "acme", c.body, user, pass); r.Status != http.StatusOK || r.Answer.Recorded != 1 || r.Answer.Duplicate {
			t.Fatalf("first: %d %s", r.Status, r.Body)
		}
		for _, tenant := range []string{"acme", "globex"} {
			if r := post(t, b, tenant, c.body, user, pass); r.Status != http.StatusOK || !r.Answer.Duplicate || r.Answer.Recorded != 0 {
				t.Errorf("%s replayed to %s: %d %s, want a duplicate", c.addr, tenant, r.Status, r.Body)
			}
		}
		if l := b.Ledger(t, "acme", c.addr); len(l) != 1 {
			t.Errorf("%s: %d ledger events after the replays, want 1", c.addr, len(l))
		}
		if l := b.Ledger(t, "globex", c.addr); len(l) != 0 {
			t.Errorf("%s: replayed into globex: %+v", c.addr, l)
		}
	}
	// A later change of the same message's subscription is another record.
	lifted := strings.Replace(unsub, `"ChangedAt":"2020-02-01T10:53:34.416071Z"`, `"ChangedAt":"2020-02-02T10:53:34.416071Z"`, 1)
	if r := post(t, b, "acme", lifted, user, pass); r.Status != http.StatusOK || r.Answer.Duplicate {
		t.Errorf("a later subscription change: %d %s", r.Status, r.Body)
	}
}
