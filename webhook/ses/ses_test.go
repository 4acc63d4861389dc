package ses_test

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/testkit/webhooktest"
	"github.com/sluicehq/sluice/webhook"
	"github.com/sluicehq/sluice/webhook/ses"
)

const topic = "arn:aws:sns:us-east-1:123456789012:ses-acme"

// fakeSNS signs as SNS does, written from SNS's documentation with the
// standard library only: an RSA key and a self-signed certificate served
// over https from loopback, messages signed with SHA1withRSA (version 1)
// or SHA256withRSA (version 2) over the canonical string built here.
type fakeSNS struct {
	key       *rsa.PrivateKey
	srv       *httptest.Server
	certPath  string
	confirmed atomic.Int32
}

func newFakeSNS(t *testing.T) *fakeSNS {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sns.amazonaws.com"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSNS{key: key, certPath: "/SimpleNotificationService-0123.pem"}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+f.certPath, func(w http.ResponseWriter, _ *http.Request) {
		pem.Encode(w, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	})
	mux.HandleFunc("GET /confirm", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("Token") == "tok-1" {
			f.confirmed.Add(1)
		}
		w.Write([]byte("<ConfirmSubscriptionResponse/>"))
	})
	f.srv = httptest.NewTLSServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeSNS) provider() *ses.Provider {
	p := ses.New()
	p.Client = f.srv.Client()
	host := strings.TrimPrefix(f.srv.URL, "https://")
	p.AllowHost = func(h string) bool { return h == host }
	return p
}

// message builds a signed SNS message (fields by their documented names).
func (f *fakeSNS) message(t *testing.T, version string, fields map[string]string) []byte {
	t.Helper()
	fields["SignatureVersion"] = version
	if _, ok := fields["SigningCertURL"]; !ok {
		fields["SigningCertURL"] = f.srv.URL + f.certPath
	}
	order := []string{"Message", "MessageId", "Subject", "Timestamp", "TopicArn", "Type"}
	if fields["Type"] != "Notification" {
		order = []string{"Message", "MessageId", "SubscribeURL", "Timestamp", "Token", "TopicArn", "Type"}
	}
	var s strings.Builder
	for _, k := range order {
		if v, ok := fields[k]; ok {
			s.WriteString(k + "\n" + v + "\n")
		}
	}
	var sig []byte
	var err error
	if version == "1" {
		d := sha1.Sum([]byte(s.String()))
		sig, err = rsa.SignPKCS1v15(rand.Reader, f.key, crypto.SHA1, d[:])
	} else {
		d := sha256.Sum256([]byte(s.String()))
		sig, err = rsa.SignPKCS1v15(rand.Reader, f.key, crypto.SHA256, d[:])
	}
	if err != nil {
		t.Fatal(err)
	}
	fields["Signature"] = base64.StdEncoding.EncodeToString(sig)
	out, _ := json.Marshal(fields)
	return out
}

// SES's documented notifications, trimmed.
const (
	bounceJSON    = `{"notificationType":"Bounce","bounce":{"bounceType":"Permanent","bounceSubType":"General","bouncedRecipients":[{"emailAddress":"bob@example.com","action":"failed","status":"5.1.1","diagnosticCode":"smtp; 550 5.1.1 user unknown"},{"emailAddress":"jo@example.com","status":"5.1.1"}],"timestamp":"2016-01-27T14:59:38.237Z","feedbackId":"00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa068a-000000"},"mail":{"timestamp":"2016-01-27T14:59:38.237Z","source":"john@example.com","messageId":"00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa0680-000000","destination":["bob@example.com","jo@example.com"]}}`
	softJSON      = `{"notificationType":"Bounce","bounce":{"bounceType":"Transient","bouncedRecipients":[{"emailAddress":"ed@example.com"}]},"mail":{"messageId":"m-soft"}}`
	complaintJSON = `{"eventType":"Complaint","complaint":{"complainedRecipients":[{"emailAddress":"cy@example.com"}],"timestamp":"2016-01-27T14:59:38.237Z","feedbackId":"0000013786031775-fea503bc-7497-49e1-881b-a0379bb037d3-000000","complaintFeedbackType":"abuse"},"mail":{"messageId":"m-complaint"}}`
	deliveryJSON  = `{"notificationType":"Delivery","mail":{"messageId":"m-ok"},"delivery":{"recipients":["fay@example.com"]}}`
)

func notification(msgID, message string, at time.Time) map[string]string {
	return map[string]string{"Type": "Notification", "MessageId": msgID, "TopicArn": topic, "Message": message,
		"Timestamp": at.UTC().Format("2006-01-02T15:04:05.000Z"), "UnsubscribeURL": "https://sns.us-east-1.amazonaws.com/?Action=Unsubscribe"}
}

func TestSignedNotificationsAreRecorded(t *testing.T) {
	t.Parallel()
	f := newFakeSNS(t)
	now := time.Now()
	b := webhooktest.New(t, f.provider(), func() time.Time { return now })
	b.Set(t, "acme", webhook.Credentials{Topics: []string{topic}})
	b.Set(t, "globex", webhook.Credentials{Topics: []string{"arn:aws:sns:us-east-1:123456789012:ses-globex"}})

	signed := f.message(t, "2", notification("n-1", bounceJSON, now))
	var unsigned map[string]string
	json.Unmarshal(signed, &unsigned)
	delete(unsigned, "Signature")
	noSig, _ := json.Marshal(unsigned)
	tampered := strings.Replace(string(signed), "bob@example.com", "eve@example.com", 1)
	otherCert := notification("n-2", bounceJSON, now)
	otherCert["SigningCertURL"] = "https://sns.us-east-1.amazonaws.com.evil.example/cert.pem"
	httpCert := notification("n-3", bounceJSON, now)
	httpCert["SigningCertURL"] = "http://" + strings.TrimPrefix(f.srv.URL, "https://") + f.certPath
	for name, body := range map[string][]byte{
		"Unsigned":       noSig,
		"RawDelivery":    []byte(bounceJSON),
		"Tampered":       []byte(tampered),
		"Stale":          f.message(t, "2", notification("n-4", bounceJSON, now.Add(-ses.Tolerance-time.Minute))),
		"CertElsewhere":  f.message(t, "2", otherCert),
		"CertOverHTTP":   f.message(t, "2", httpCert),
		"UnknownVersion": f.message(t, "3", notification("n-5", bounceJSON, now)),
	} {
		if r := b.Post(t, "acme", body); r.Status != http.StatusForbidden {
			t.Errorf("%s: %d %s, want 403", name, r.Status, r.Body)
		}
	}
	// Another tenant's URL: signed by SNS, but not from its topic.
	if r := b.Post(t, "globex", signed); r.Status != http.StatusForbidden {
		t.Errorf("another tenant's topic: %d %s", r.Status, r.Body)
	}
	b.NothingRecorded(t, "a refused message")

	if r := b.Post(t, "acme", signed); r.Status != http.StatusOK || r.Answer.Recorded != 2 {
		t.Fatalf("signed bounce (v2): %d %s", r.Status, r.Body)
	}
	for i, msg := range []string{complaintJSON, softJSON, deliveryJSON} {
		r := b.Post(t, "acme", f.message(t, "1", notification("n-v1-"+string(rune('a'+i)), msg, now)))
		if r.Status != http.StatusOK {
			t.Fatalf("signed (v1) %d: %d %s", i, r.Status, r.Body)
		}
	}
	ref := "ses.00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa0680-000000"
	want := map[string]consent.Event{
		"bob@example.com": {Action: consent.Undeliverable, Source: consent.SourceBounce, Code: 550, Ref: ref},
		"jo@example.com":  {Action: consent.Undeliverable, Source: consent.SourceBounce, Ref: ref},
		"cy@example.com":  {Action: consent.OptOut, Source: consent.SourceComplaint, Ref: "ses.m-complaint"},
	}
	for addr, w := range want {
		l := b.Ledger(t, "acme", addr)
		if len(l) != 1 || l[0].Action != w.Action || l[0].Source != w.Source || l[0].Code != w.Code || l[0].Ref != w.Ref {
			t.Errorf("%s: ledger %+v, want %+v", addr, l, w)
		}
	}
	for _, addr := range []string{"ed@example.com", "fay@example.com", "eve@example.com"} {
		if l := b.Ledger(t, "acme", addr); len(l) != 0 {
			t.Errorf("%s: %+v recorded", addr, l)
		}
	}
	// SNS retrying the same message records nothing again.
	if r := b.Post(t, "acme", signed); r.Status != http.StatusOK || !r.Answer.Duplicate {
		t.Errorf("replay: %d %s", r.Status, r.Body)
	}
	if l := b.Ledger(t, "acme", "bob@example.com"); len(l) != 1 {
		t.Errorf("a replay added to the ledger: %+v", l)
	}
}

// A subscription is confirmed as SNS documents: by fetching SubscribeURL,
// only when it is signed, from the tenant's topic, on an SNS host.
func TestSubscriptionConfirmation(t *testing.T) {
	t.Parallel()
	f := newFakeSNS(t)
	b := webhooktest.New(t, f.provider(), nil)
	b.Set(t, "acme", webhook.Credentials{Topics: []string{topic}})
	sub := func(id, subscribeURL string) map[string]string {
		return map[string]string{"Type": "SubscriptionConfirmation", "MessageId": id, "Token": "tok-1", "TopicArn": topic,
			"Message": "You have chosen to subscribe to the topic " + topic + ".", "SubscribeURL": subscribeURL,
			"Timestamp": time.Now().UTC().Format(time.RFC3339Nano)}
	}
	good := f.srv.URL + "/confirm?Action=ConfirmSubscription&TopicArn=" + topic + "&Token=tok-1"
	for name, body := range map[string][]byte{
		"Elsewhere": f.message(t, "2", sub("s-1", "https://attacker.example/confirm?Token=tok-1")),
		"OverHTTP":  f.message(t, "2", sub("s-2", strings.Replace(good, "https://", "http://", 1))),
		"Forged":    []byte(strings.Replace(string(f.message(t, "2", sub("s-3", good))), "tok-1", "tok-2", 1)),
	} {
		if r := b.Post(t, "acme", body); r.Status != http.StatusForbidden {
			t.Errorf("%s: %d %s, want 403", name, r.Status, r.Body)
		}
	}
	if n := f.confirmed.Load(); n != 0 {
		t.Fatalf("%d confirmations for refused messages", n)
	}
	if r := b.Post(t, "acme", f.message(t, "2", sub("s-4", good))); r.Status != http.StatusOK {
		t.Fatalf("confirmation: %d %s", r.Status, r.Body)
	}
	if n := f.confirmed.Load(); n != 1 {
		t.Fatalf("SubscribeURL fetched %d times, want 1", n)
	}
}

func TestSNSHost(t *testing.T) {
	t.Parallel()
	for h, want := range map[string]bool{
		"sns.us-east-1.amazonaws.com": true, "sns.cn-north-1.amazonaws.com.cn": true, "sns.eu-central-1.amazonaws.com": true,
		"sns.us-east-1.amazonaws.com.evil.example": false, "evil.sns.us-east-1.amazonaws.com": false, "sns.amazonaws.com": false,
		"sqs.us-east-1.amazonaws.com": false, "sns.us-east-1.amazonaws.co": false,
	} {
		if got := ses.SNSHost(h); got != want {
			t.Errorf("SNSHost(%q) = %v", h, got)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"Type":"Notification","MessageId":"m","TopicArn":"t","Message":` + jsonString(bounceJSON) + `,"Timestamp":"2012-04-26T20:45:04.751Z"}`))
	f.Add([]byte(`{"Type":"SubscriptionConfirmation","Subject":null,"SubscribeURL":"https://x"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := ses.Parse(body)
		if err != nil {
			return
		}
		if _, err := ses.StringToSign(m); err != nil && m.Type == ses.TypeNotification {
			t.Fatalf("a notification has no canonical string: %v", err)
		}
	})
}

func FuzzNotification(f *testing.F) {
	for _, s := range []string{bounceJSON, softJSON, complaintJSON, deliveryJSON} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		b, err := ses.Notification(msg)
		if err != nil {
			return
		}
		for _, it := range b.Items {
			if _, _, err := it.Report.Event(time.Hour, time.Now()); err != nil {
				t.Fatalf("an item the parser kept does not map: %+v: %v", it, err)
			}
		}
	})
}

func jsonString(s string) string { b, _ := json.Marshal(s); return string(b) }

// countingTransport counts the requests a client makes (each would be a
// lookup and a connection) and fails them all.
type countingTransport struct{ n atomic.Int32 }

func (c *countingTransport) RoundTrip(*http.Request) (*http.Response, error) {
	c.n.Add(1)
	return nil, errors.New("connection refused")
}

// 200 deliveries naming 200 certificate hosts the sender chose (issue 50:
// sns.us-east-<i>.amazonaws.com): none is looked up — only the SNS host of
// the topic's own region may serve its certificate — and the refusals give
// at most 5 log lines. 200 naming the right host while it cannot be
// reached: one fetch (the failure is remembered for a minute), 503 with a
// true reason (check-unavailable, not "Redis cannot be reached"), and at
// most 5 log lines.
func TestCertificateHostsBoundAndSampled(t *testing.T) {
	t.Parallel()
	f := newFakeSNS(t)
	var logs bytes.Buffer
	var mu sync.Mutex
	p := ses.New()
	tr := &countingTransport{}
	p.Client = &http.Client{Transport: tr}
	now := time.Now()
	b := webhooktest.NewLogged(t, p, func() time.Time { return now }, slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil)))
	b.Set(t, "acme", webhook.Credentials{Topics: []string{topic}})
	for i := range 200 {
		n := notification(fmt.Sprintf("n-%d", i), bounceJSON, now)
		n["SigningCertURL"] = fmt.Sprintf("https://sns.us-east-%d.amazonaws.com/x.pem", i)
		if i == 1 {
			continue // us-east-1 is the topic's region: the next loop
		}
		if r := b.Post(t, "acme", f.message(t, "2", n)); r.Status != http.StatusForbidden {
			t.Fatalf("host %d: %d %s, want 403", i, r.Status, r.Body)
		}
	}
	if got := tr.n.Load(); got != 0 {
		t.Errorf("%d certificate fetches for hosts the sender chose, want 0", got)
	}
	for i := range 200 {
		n := notification(fmt.Sprintf("m-%d", i), bounceJSON, now)
		n["SigningCertURL"] = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-x.pem"
		r := b.Post(t, "acme", f.message(t, "2", n))
		if r.Status != http.StatusServiceUnavailable || !strings.Contains(string(r.Body), "urn:sluice:problem:check-unavailable") || strings.Contains(string(r.Body), "Redis") {
			t.Fatalf("an unreachable certificate host: %d %s, want 503 check-unavailable", r.Status, r.Body)
		}
	}
	if got := tr.n.Load(); got != 1 {
		t.Errorf("%d fetches of an unreachable certificate host for 200 deliveries, want 1 (its failure remembered)", got)
	}
	mu.Lock()
	lines := strings.Count(logs.String(), "\n")
	mu.Unlock()
	t.Logf("%d log lines for 399 refusals", lines)
	if lines > 5 {
		t.Errorf("%d log lines for 400 refusals, want at most 5:\n%s", lines, logs.String())
	}
	b.NothingRecorded(t, "a delivery whose certificate was not fetched")
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestTopicHost(t *testing.T) {
	t.Parallel()
	for arn, want := range map[string]string{
		topic: "sns.us-east-1.amazonaws.com",
		"arn:aws-cn:sns:cn-north-1:123456789012:t":        "sns.cn-north-1.amazonaws.com.cn",
		"arn:aws-us-gov:sns:us-gov-west-1:123456789012:t": "sns.us-gov-west-1.amazonaws.com",
		"arn:aws:sns:evil.example:123456789012:t":         "",
		"": "",
	} {
		if got := ses.TopicHost(arn); got != want {
			t.Errorf("TopicHost(%q) = %q, want %q", arn, got, want)
		}
	}
}
