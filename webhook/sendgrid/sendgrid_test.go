package sendgrid_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/base64"
	"math/big"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/testkit/webhooktest"
	"github.com/sluicehq/sluice/webhook"
	"github.com/sluicehq/sluice/webhook/sendgrid"
)

// signer signs as SendGrid does, written from its documentation with the
// standard library only: ECDSA P-256 over SHA-256 of timestamp + body,
// ASN.1 DER, base64.
type signer struct{ key *ecdsa.PrivateKey }

func newSigner(t *testing.T) signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return signer{k}
}

func (s signer) public(t *testing.T) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(&s.key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(der)
}

func (s signer) sign(t *testing.T, ts string, body []byte) string {
	t.Helper()
	sum := sha256.Sum256(append([]byte(ts), body...))
	sig, err := ecdsa.SignASN1(rand.Reader, s.key, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(sig)
}

const events = `[
 {"email":"bob@example.com","timestamp":1700000000,"event":"bounce","type":"bounce","status":"5.1.1","reason":"550 5.1.1 The email account that you tried to reach does not exist","sg_message_id":"14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0","sg_event_id":"e1"},
 {"email":"cy@example.com","timestamp":1700000000,"event":"spamreport","sg_message_id":"m2","sg_event_id":"e2"},
 {"email":"di@example.com","timestamp":1700000000,"event":"unsubscribe","sg_message_id":"m3","sg_event_id":"e3"},
 {"email":"ed@example.com","timestamp":1700000000,"event":"bounce","type":"blocked","status":"4.0.0","reason":"421 try later","sg_event_id":"e4"},
 {"email":"fay@example.com","timestamp":1700000000,"event":"delivered","sg_event_id":"e5"},
 {"email":"not an address","timestamp":1700000000,"event":"spamreport","sg_event_id":"e6"}
]`

func TestSignedEventsAreRecorded(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := webhooktest.New(t, sendgrid.Provider{}, func() time.Time { return now })
	s := newSigner(t)
	b.Set(t, "acme", webhook.Credentials{Key: s.public(t)})
	ts := strconv.FormatInt(now.Unix(), 10)
	body := []byte(events)

	// Refused, and nothing recorded: no signature, a forged one, a changed
	// body, a stale or future timestamp, another key.
	other := newSigner(t)
	stale := strconv.FormatInt(now.Add(-webhook.Tolerance-time.Second).Unix(), 10)
	future := strconv.FormatInt(now.Add(webhook.Tolerance+time.Second).Unix(), 10)
	for name, h := range map[string][]string{
		"Unsigned":      nil,
		"NoTimestamp":   {sendgrid.SignatureHeader, s.sign(t, ts, body)},
		"OtherKey":      {sendgrid.SignatureHeader, other.sign(t, ts, body), sendgrid.TimestampHeader, ts},
		"OtherBody":     {sendgrid.SignatureHeader, s.sign(t, ts, []byte("[]")), sendgrid.TimestampHeader, ts},
		"OtherTime":     {sendgrid.SignatureHeader, s.sign(t, ts, body), sendgrid.TimestampHeader, stale},
		"Stale":         {sendgrid.SignatureHeader, s.sign(t, stale, body), sendgrid.TimestampHeader, stale},
		"Future":        {sendgrid.SignatureHeader, s.sign(t, future, body), sendgrid.TimestampHeader, future},
		"NotBase64":     {sendgrid.SignatureHeader, "!!", sendgrid.TimestampHeader, ts},
		"NotDER":        {sendgrid.SignatureHeader, base64.StdEncoding.EncodeToString([]byte("xyz")), sendgrid.TimestampHeader, ts},
		"NotANumberNow": {sendgrid.SignatureHeader, s.sign(t, "soon", body), sendgrid.TimestampHeader, "soon"},
	} {
		if r := b.Post(t, "acme", body, h...); r.Status != http.StatusForbidden {
			t.Errorf("%s: %d %s, want 403", name, r.Status, r.Body)
		}
	}
	b.NothingRecorded(t, "a refused delivery")
	if r := b.Post(t, "globex", body, sendgrid.SignatureHeader, s.sign(t, ts, body), sendgrid.TimestampHeader, ts); r.Status != http.StatusNotFound {
		t.Errorf("a tenant without a SendGrid webhook: %d, want 404", r.Status)
	}

	sig := s.sign(t, ts, body)
	r := b.Post(t, "acme", body, sendgrid.SignatureHeader, sig, sendgrid.TimestampHeader, ts)
	if r.Status != http.StatusOK || r.Answer.Recorded != 3 || r.Answer.Ignored != 3 {
		t.Fatalf("signed delivery: %d %s; want 3 recorded, 3 ignored", r.Status, r.Body)
	}
	want := map[string]consent.Event{
		"bob@example.com": {Action: consent.Undeliverable, Source: consent.SourceBounce, Code: 550, Ref: "sendgrid.14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0"},
		"cy@example.com":  {Action: consent.OptOut, Source: consent.SourceComplaint, Ref: "sendgrid.m2"},
		"di@example.com":  {Action: consent.OptOut, Source: consent.SourceAPI, Ref: "sendgrid.m3"},
	}
	for addr, w := range want {
		l := b.Ledger(t, "acme", addr)
		if len(l) != 1 || l[0].Action != w.Action || l[0].Source != w.Source || l[0].Code != w.Code || l[0].Ref != w.Ref || l[0].Scope.String() != "*" {
			t.Errorf("%s: ledger %+v, want %+v", addr, l, w)
		}
	}
	if l := b.Ledger(t, "acme", "bob@example.com"); l[0].Until.Sub(now) < 719*time.Hour {
		t.Errorf("the bounce lapses at %v, want after SLUICE_EMAIL_SUPPRESS_TTL", l[0].Until)
	}
	for _, addr := range []string{"ed@example.com", "fay@example.com"} {
		if l := b.Ledger(t, "acme", addr); len(l) != 0 {
			t.Errorf("%s: %+v recorded for a blocked or delivered event", addr, l)
		}
	}

	// The same delivery again — a replay, or SendGrid retrying — records
	// nothing, even with its signature encoded anew.
	for name, again := range map[string]string{"Same": sig, "Reencoded": reencode(t, sig)} {
		r := b.Post(t, "acme", body, sendgrid.SignatureHeader, again, sendgrid.TimestampHeader, ts)
		if r.Status != http.StatusOK || !r.Answer.Duplicate || r.Answer.Recorded != 0 {
			t.Errorf("%s replay: %d %s", name, r.Status, r.Body)
		}
	}
	if l := b.Ledger(t, "acme", "bob@example.com"); len(l) != 1 {
		t.Errorf("a replay added to the ledger: %+v", l)
	}
}

// reencode writes an ECDSA signature with s replaced by n−s: another
// encoding that verifies the same bytes.
func reencode(t *testing.T, sig string) string {
	t.Helper()
	der, _ := base64.StdEncoding.DecodeString(sig)
	var rs struct{ R, S *big.Int }
	if _, err := asn1.Unmarshal(der, &rs); err != nil {
		t.Fatal(err)
	}
	rs.S.Sub(elliptic.P256().Params().N, rs.S)
	out, err := asn1.Marshal(rs)
	if err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(out)
}

func TestCheck(t *testing.T) {
	t.Parallel()
	s := newSigner(t)
	if err := (sendgrid.Provider{}).Check(webhook.Credentials{Key: s.public(t)}); err != nil {
		t.Fatal(err)
	}
	rsaLike := base64.StdEncoding.EncodeToString([]byte("not a key"))
	for _, c := range []webhook.Credentials{{}, {Key: "!"}, {Key: rsaLike}, {Key: s.public(t), User: "u"}} {
		if err := (sendgrid.Provider{}).Check(c); err == nil {
			t.Errorf("%+v passed", c)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(events))
	f.Add([]byte(`[{"event":"bounce","email":"a@b.co","reason":"smtp; 550 x"}]`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := sendgrid.Parse(body)
		if err != nil {
			return
		}
		for _, it := range b.Items {
			if len(it.Report.Ref) > consent.MaxRefLen {
				t.Fatalf("ref %q too long", it.Report.Ref)
			}
			if _, _, err := it.Report.Event(time.Hour, time.Now()); err != nil {
				t.Fatalf("an item the parser kept does not map: %+v: %v", it, err)
			}
		}
	})
}

// SendGrid's published sample events (the Event Webhook reference,
// twilio.com/docs/sendgrid/for-developers/tracking-events/event), each to
// an address of its own: group_unsubscribe — what a sender using unsubscribe
// groups gets instead of unsubscribe — opts the address out; dropped with
// reason "Bounced Address", "Unsubscribed Address" or "Spam Reporting
// Address" is a bounce, an unsubscribe, a complaint (the reasons from the
// same page's list of drop reasons); another drop reason changes nothing;
// the delivery replayed, to this tenant or another, records nothing again
// (issue 53: each was ignored).
func TestGroupUnsubscribeAndDrops(t *testing.T) {
	t.Parallel()
	now := time.Now()
	b := webhooktest.New(t, sendgrid.Provider{}, func() time.Time { return now })
	s := newSigner(t)
	b.Set(t, "acme", webhook.Credentials{Key: s.public(t)})
	b.Set(t, "globex", webhook.Credentials{Key: s.public(t)})
	const published = `[
 {"email":"gu@example.com","timestamp":1513299569,"smtp-id":"<14c5d75ce93.dfd.64b469@ismtpd-555>","event":"group_unsubscribe","category":"cat facts","sg_event_id":"sg_event_id","sg_message_id":"sg_message_id","useragent":"Mozilla/4.0 (compatible; MSIE 6.1; Windows XP; .NET CLR 1.1.4322; .NET CLR 2.0.50727)","ip":"255.255.255.255","url":"http://www.sendgrid.com/","asm_group_id":10},
 {"email":"db@example.com","timestamp":1513299569,"smtp-id":"<14c5d75ce93.dfd.64b469@ismtpd-555>","event":"dropped","category":"cat facts","sg_event_id":"sg_event_id","sg_message_id":"sg_message_id","reason":"Bounced Address","status":"5.0.0"},
 {"email":"du@example.com","timestamp":1513299569,"smtp-id":"<14c5d75ce93.dfd.64b469@ismtpd-555>","event":"dropped","category":"cat facts","sg_event_id":"sg_event_id","sg_message_id":"sg_message_id","reason":"Unsubscribed Address","status":"5.0.0"},
 {"email":"ds@example.com","timestamp":1513299569,"smtp-id":"<14c5d75ce93.dfd.64b469@ismtpd-555>","event":"dropped","category":"cat facts","sg_event_id":"sg_event_id","sg_message_id":"sg_message_id","reason":"Spam Reporting Address","status":"5.0.0"},
 {"email":"dx@example.com","timestamp":1513299569,"smtp-id":"<14c5d75ce93.dfd.64b469@ismtpd-555>","event":"dropped","category":"cat facts","sg_event_id":"sg_event_id","sg_message_id":"sg_message_id","reason":"Invalid SMTPAPI header","status":"5.0.0"},
 {"email":"gr@example.com","timestamp":1513299569,"smtp-id":"<14c5d75ce93.dfd.64b469@ismtpd-555>","event":"group_resubscribe","category":"cat facts","sg_event_id":"sg_event_id","sg_message_id":"sg_message_id","asm_group_id":10}
]`
	ts := strconv.FormatInt(now.Unix(), 10)
	body := []byte(published)
	sig := s.sign(t, ts, body)
	r := b.Post(t, "acme", body, sendgrid.SignatureHeader, sig, sendgrid.TimestampHeader, ts)
	if r.Status != http.StatusOK || r.Answer.Recorded != 4 || r.Answer.Ignored != 2 {
		t.Fatalf("the published events: %d %s; want 4 recorded, 2 ignored", r.Status, r.Body)
	}
	want := map[string]consent.Event{
		"gu@example.com": {Action: consent.OptOut, Source: consent.SourceAPI},
		"db@example.com": {Action: consent.Undeliverable, Source: consent.SourceBounce},
		"du@example.com": {Action: consent.OptOut, Source: consent.SourceAPI},
		"ds@example.com": {Action: consent.OptOut, Source: consent.SourceComplaint},
	}
	for addr, w := range want {
		l := b.Ledger(t, "acme", addr)
		if len(l) != 1 || l[0].Action != w.Action || l[0].Source != w.Source || l[0].Ref != "sendgrid.sg_message_id" || l[0].Scope.String() != "*" {
			t.Errorf("%s: ledger %+v, want %+v", addr, l, w)
		}
	}
	for _, addr := range []string{"dx@example.com", "gr@example.com"} {
		if l := b.Ledger(t, "acme", addr); len(l) != 0 {
			t.Errorf("%s: %+v recorded", addr, l)
		}
	}
	for _, tenant := range []string{"acme", "globex"} {
		r := b.Post(t, tenant, body, sendgrid.SignatureHeader, sig, sendgrid.TimestampHeader, ts)
		if r.Status != http.StatusOK || !r.Answer.Duplicate || r.Answer.Recorded != 0 {
			t.Errorf("replayed to %s: %d %s", tenant, r.Status, r.Body)
		}
	}
	for addr := range want {
		if l := b.Ledger(t, "acme", addr); len(l) != 1 {
			t.Errorf("%s: %d ledger events after the replays", addr, len(l))
		}
		if l := b.Ledger(t, "globex", addr); len(l) != 0 {
			t.Errorf("%s: replayed into globex: %+v", addr, l)
		}
	}
}
