package mailgun_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/testkit/webhooktest"
	"github.com/sluicehq/sluice/webhook"
	"github.com/sluicehq/sluice/webhook/mailgun"
)

const signingKey = "key-0123456789abcdef0123456789ab"

// sign builds a delivery as Mailgun does, from its documentation with the
// standard library only: hex HMAC-SHA256 of timestamp + token.
func sign(key, ts, token, eventData string) []byte {
	return withSignature(ts, token, mac(key, ts, token), eventData)
}

func mac(key, ts, token string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(ts + token))
	return hex.EncodeToString(m.Sum(nil))
}

// withSignature is a delivery carrying sig as its signature.
func withSignature(ts, token, sig, eventData string) []byte {
	return []byte(fmt.Sprintf(`{"signature":{"timestamp":%q,"token":%q,"signature":%q},"event-data":%s}`, ts, token, sig, eventData))
}

const (
	bounce    = `{"id":"G9Bn5sl1TC6nu79C8C0bwg","event":"failed","severity":"permanent","recipient":"bob@example.com","reason":"bounce","delivery-status":{"code":550,"message":"No such user"},"message":{"headers":{"message-id":"20130503182626.18666.16540@sandbox.mailgun.org"}}}`
	soft      = `{"id":"x1","event":"failed","severity":"temporary","recipient":"ed@example.com","delivery-status":{"code":452}}`
	complaint = `{"id":"x2","event":"complained","recipient":"cy@example.com"}`
	unsub     = `{"id":"x3","event":"unsubscribed","recipient":"di@example.com"}`
	opened    = `{"id":"x4","event":"opened","recipient":"fay@example.com"}`
)

func TestSignedEventsAreRecorded(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := webhooktest.New(t, mailgun.Provider{}, func() time.Time { return now })
	b.Set(t, "acme", webhook.Credentials{Key: signingKey})
	ts := strconv.FormatInt(now.Unix(), 10)
	stale := strconv.FormatInt(now.Add(-webhook.Tolerance-time.Second).Unix(), 10)

	for name, body := range map[string][]byte{
		"Unsigned":   []byte(`{"event-data":` + bounce + `}`),
		"NotJSON":    []byte(`signature=x&token=y`),
		"OtherKey":   sign("key-another-one-0123456789abcdef", ts, "tok-1", bounce),
		"Stale":      sign(signingKey, stale, "tok-2", bounce),
		"BadHex":     withSignature(ts, "tok-3", "zz", bounce),
		"OtherToken": withSignature(ts, "tok-4b", mac(signingKey, ts, "tok-4"), bounce),
		"OtherTime":  withSignature(stale, "tok-5", mac(signingKey, ts, "tok-5"), bounce),
	} {
		if r := b.Post(t, "acme", body); r.Status != http.StatusForbidden {
			t.Errorf("%s: %d %s, want 403", name, r.Status, r.Body)
		}
	}
	b.NothingRecorded(t, "a refused delivery")

	for i, ev := range []string{bounce, soft, complaint, unsub, opened} {
		r := b.Post(t, "acme", sign(signingKey, ts, "tok-ok-"+strconv.Itoa(i), ev))
		if r.Status != http.StatusOK || r.Answer.Recorded+r.Answer.Ignored != 1 {
			t.Fatalf("event %d: %d %s", i, r.Status, r.Body)
		}
	}
	want := map[string]consent.Event{
		"bob@example.com": {Action: consent.Undeliverable, Source: consent.SourceBounce, Code: 550, Ref: "mailgun.20130503182626.18666.16540_sandbox.mailgun.org"},
		"cy@example.com":  {Action: consent.OptOut, Source: consent.SourceComplaint, Ref: "mailgun.x2"},
		"di@example.com":  {Action: consent.OptOut, Source: consent.SourceAPI, Ref: "mailgun.x3"},
	}
	for addr, w := range want {
		l := b.Ledger(t, "acme", addr)
		if len(l) != 1 || l[0].Action != w.Action || l[0].Source != w.Source || l[0].Code != w.Code || l[0].Ref != w.Ref {
			t.Errorf("%s: ledger %+v, want %+v", addr, l, w)
		}
	}
	for _, addr := range []string{"ed@example.com", "fay@example.com"} {
		if l := b.Ledger(t, "acme", addr); len(l) != 0 {
			t.Errorf("%s: %+v recorded for a soft failure or an open", addr, l)
		}
	}
	// A replayed token records nothing.
	r := b.Post(t, "acme", sign(signingKey, ts, "tok-ok-0", bounce))
	if r.Status != http.StatusOK || !r.Answer.Duplicate {
		t.Errorf("replay: %d %s", r.Status, r.Body)
	}
	if l := b.Ledger(t, "acme", "bob@example.com"); len(l) != 1 {
		t.Errorf("a replay added to the ledger: %+v", l)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(sign(signingKey, "1700000000", "t", bounce))
	f.Add(sign(signingKey, "1700000000", "t", complaint))
	f.Add([]byte(`{"event-data":{"event":"failed","severity":"permanent","delivery-status":{"code":-1}}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := mailgun.Parse(body)
		if err != nil {
			return
		}
		b := mailgun.Map(p.EventData)
		if len(b.Items)+b.Ignored != 1 {
			t.Fatalf("one event became %+v", b)
		}
		for _, it := range b.Items {
			if _, _, err := it.Report.Event(time.Hour, time.Now()); err != nil {
				t.Fatalf("an item the parser kept does not map: %+v: %v", it, err)
			}
		}
	})
}

// withParent is a delivery of a subaccount's event: signature under the
// subaccount's key, parent-signature under the primary account's (Mailgun,
// "Securing Webhooks", documentation.mailgun.com/docs/mailgun/user-manual/webhooks/securing-webhooks).
func withParent(subKey, parentKey, ts, token, eventData string) []byte {
	return []byte(fmt.Sprintf(`{"signature":{"token":%q,"timestamp":%q,"signature":%q,"parent-signature":%q},"event-data":%s}`,
		token, ts, mac(subKey, ts, token), mac(parentKey, ts, token), eventData))
}

// A permanent failure shaped as Mailgun's published webhook payloads
// (account.id and domain.name on every event,
// documentation.mailgun.com/docs/mailgun/user-manual/webhooks/webhook-payloads).
const subBounce = `{"account":{"id":"1234567890303a4bd1f33898"},"domain":{"name":"sample.mailgun.com"},"envelope":{"sender":"sender@sample.mailgun.com","targets":"gil@example.com","transport":"smtp"},"event":"failed","severity":"permanent","reason":"bounce","delivery-status":{"code":550,"message":"5.1.1 The email account that you tried to reach does not exist"},"flags":{"is-authenticated":true,"is-test-mode":false},"id":"CCXMjJ7nQi2N3BPigGOdgQ","log-level":"error","message":{"headers":{"from":"Sample Sender <sender@sample.mailgun.com>","message-id":"20260203192638.000be97f99f8cea1@sample.mailgun.com","subject":"Sample webhook payload","to":"gil@example.com"},"size":341},"recipient":"gil@example.com","recipient-domain":"example.com","tags":["webhook_payload"],"timestamp":1770146798.372891,"user-variables":[]}`

// A subaccount's events, checked by parent-signature with the primary
// account's key the tenant configured (issue 53: refused 403): taken when
// the event is the tenant's subaccount's; refused when it is another
// subaccount's (the primary key signs them all), or when the tenant has no
// parent key; a replay records nothing again.
func TestParentSignature(t *testing.T) {
	t.Parallel()
	now := time.Now()
	const parentKey, subKey = "key-primary-0123456789abcdef0123", "key-subacct-unknown-to-sluice-01"
	b := webhooktest.New(t, mailgun.Provider{}, func() time.Time { return now })
	b.Set(t, "acme", webhook.Credentials{ParentKey: parentKey, Account: "1234567890303a4bd1f33898"})
	b.Set(t, "beta", webhook.Credentials{ParentKey: parentKey, Account: "aaaaaaaaaaaaaaaaaaaaaaaa"})
	b.Set(t, "own", webhook.Credentials{Key: signingKey})
	ts := strconv.FormatInt(now.Unix(), 10)
	for name, c := range map[string]struct {
		tenant string
		body   []byte
	}{
		"AnotherSubaccount": {"beta", withParent(subKey, parentKey, ts, "tok-p1", subBounce)},
		"NoParentKey":       {"own", withParent(subKey, parentKey, ts, "tok-p2", subBounce)},
		"ForgedParent":      {"acme", withParent(subKey, "key-not-the-primary-0123456789ab", ts, "tok-p3", subBounce)},
	} {
		if r := b.Post(t, c.tenant, c.body); r.Status != http.StatusForbidden {
			t.Errorf("%s: %d %s, want 403", name, r.Status, r.Body)
		}
	}
	b.NothingRecorded(t, "a refused delivery")
	body := withParent(subKey, parentKey, ts, "tok-p4", subBounce)
	if r := b.Post(t, "acme", body); r.Status != http.StatusOK || r.Answer.Recorded != 1 {
		t.Fatalf("the tenant's subaccount's event: %d %s", r.Status, r.Body)
	}
	l := b.Ledger(t, "acme", "gil@example.com")
	if len(l) != 1 || l[0].Action != consent.Undeliverable || l[0].Code != 550 {
		t.Fatalf("ledger %+v, want one undeliverable, 550", l)
	}
	for _, tenant := range []string{"acme", "beta"} {
		if r := b.Post(t, tenant, body); r.Status == http.StatusOK && !r.Answer.Duplicate {
			t.Errorf("replayed to %s: %d %s", tenant, r.Status, r.Body)
		}
	}
	if l := b.Ledger(t, "acme", "gil@example.com"); len(l) != 1 {
		t.Errorf("a replay added to the ledger: %+v", l)
	}
}
