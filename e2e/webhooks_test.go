package e2e

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// snsServer serves an SNS signing certificate over https on loopback and
// signs messages with its key (SHA256withRSA over SNS's canonical string,
// written here from SNS's documentation).
type snsServer struct {
	srv    *httptest.Server
	key    *rsa.PrivateKey
	caFile string
}

func newSNSServer(t *testing.T) *snsServer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "sns.amazonaws.com"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	s := &snsServer{key: key, srv: httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		pem.Encode(w, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}))}
	t.Cleanup(s.srv.Close)
	s.caFile = filepath.Join(t.TempDir(), "sns-ca.pem")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.srv.Certificate().Raw})
	if err := os.WriteFile(s.caFile, ca, 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// notification is a signed SNS Notification carrying message.
func (s *snsServer) notification(t *testing.T, topic, id, message string) []byte {
	t.Helper()
	f := map[string]string{"Type": "Notification", "MessageId": id, "TopicArn": topic, "Message": message,
		"Timestamp": time.Now().UTC().Format("2006-01-02T15:04:05.000Z"), "SignatureVersion": "2",
		"SigningCertURL": s.srv.URL + "/SimpleNotificationService-e2e.pem"}
	var canon strings.Builder
	for _, k := range []string{"Message", "MessageId", "Timestamp", "TopicArn", "Type"} {
		canon.WriteString(k + "\n" + f[k] + "\n")
	}
	sum := sha256.Sum256([]byte(canon.String()))
	sig, err := rsa.SignPKCS1v15(rand.Reader, s.key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	f["Signature"] = base64.StdEncoding.EncodeToString(sig)
	out, _ := json.Marshal(f)
	return out
}

func postJSON(t *testing.T, url string, body []byte, headers ...string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := sluicetest.Client(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// A SendGrid bounce and an SES complaint (through SNS), each signed by an
// independent signer and posted to the tenant's webhook URLs on `sluice
// api` — credentials set with `sluice webhook set` — stop the next
// marketing email to those two addresses: archived suppressed, never at
// the SMTP server, while a third address still gets its email. A forged
// delivery changes nothing.
func TestProviderWebhooksStopMarketingEmail(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "email:recipient=100/1m")
	smtp := fakes.NewSMTPServer(t)
	for k, v := range smtpVars(smtp, "news@example.com", nil) {
		e.vars[k] = v
	}
	sns := newSNSServer(t)
	a := e.startAPI(map[string]string{"SLUICETEST_SNS_HOST": strings.TrimPrefix(sns.srv.URL, "https://"), "SLUICETEST_SNS_CA_FILE": sns.caFile}, "acme")
	e.worker("w0", nil)
	tok := a.tokens["acme"]
	sg, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&sg.PublicKey)
	const topic = "arn:aws:sns:us-east-1:123456789012:ses-acme"
	e.sluiceRun(nil, "webhook", "set", "acme", "sendgrid", "--key", base64.StdEncoding.EncodeToString(der))
	e.sluiceRun(nil, "webhook", "set", "acme", "ses", "--topic", topic)

	send := func(to string) string {
		t.Helper()
		r := a.call("POST", "/v1/notifications", tok, fmt.Sprintf(`{"channel":"email","to":%q,"subject":"Sale","body":"50%% off","category":"marketing"}`, to))
		if r.Status != http.StatusAccepted {
			t.Fatalf("enqueue: %d %s", r.Status, r.Body)
		}
		var acc api.Accepted
		r.JSON(t, &acc)
		return acc.ID
	}
	for _, to := range []string{"bob@example.com", "cy@example.com", "dan@example.com"} {
		send(to)
	}
	smtp.WaitCount(t, 3, 30*time.Second)

	postProviderReports(t, a, sg, sns, topic)
	recordedAt := time.Now()

	late := map[string]string{}
	for _, to := range []string{"bob@example.com", "cy@example.com"} {
		late[send(to)] = to
	}
	control := send("dan@example.com")
	ds := smtp.WaitFor(t, 30*time.Second, "dan's second email", func(ds []fakes.Delivery) bool {
		for _, d := range ds {
			if d.ID == control {
				return true
			}
		}
		return false
	})
	for id, to := range late {
		st := a.waitState(t, tok, id, 30*time.Second, api.StateArchived, api.StateDelivered, api.StateSent)
		if st.Reason != tasks.ReasonSuppressed {
			t.Errorf("%s's email archived as %+v", to, st)
		}
	}
	for _, d := range smtp.Deliveries() {
		if _, blocked := late[d.ID]; blocked {
			t.Errorf("the SMTP server received %s's email %v after the webhook", d.To, d.At.Sub(recordedAt))
		}
	}
	t.Logf("%d emails at the SMTP server; the two suppressed never reached it", len(ds))
	for to, want := range map[string][2]string{"bob@example.com": {"bounce", "sendgrid.sg-1.filter"}, "cy@example.com": {"complaint", "ses.ses-msg-1"}} {
		var sup struct {
			Ledger []struct{ Source, Ref string } `json:"ledger"`
		}
		a.call("GET", "/v1/suppressions/email/"+to, tok, nil).JSON(t, &sup)
		if len(sup.Ledger) != 1 || sup.Ledger[0].Source != want[0] || sup.Ledger[0].Ref != want[1] {
			t.Errorf("%s's ledger %+v, want source %s ref %s", to, sup.Ledger, want[0], want[1])
		}
	}
}

// postProviderReports posts a forged SendGrid delivery (refused) and a
// signed SendGrid bounce for bob and SES complaint for cy (recorded).
func postProviderReports(t *testing.T, a *apiEnv, sg *ecdsa.PrivateKey, sns *snsServer, topic string) {
	t.Helper()
	// SendGrid: a bounce for bob, signed; then a forged one for dan.
	sgBody := []byte(`[{"email":"bob@example.com","event":"bounce","type":"bounce","reason":"550 5.1.1 no such user","sg_message_id":"sg-1.filter"}]`)
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	sum := sha256.Sum256(append([]byte(ts), sgBody...))
	sig, _ := ecdsa.SignASN1(rand.Reader, sg, sum[:])
	sgURL := a.base + "/v1/webhooks/sendgrid/acme"
	forged := []byte(strings.Replace(string(sgBody), "bob@", "dan@", 1))
	if code := postJSON(t, sgURL, forged, "X-Twilio-Email-Event-Webhook-Signature", base64.StdEncoding.EncodeToString(sig), "X-Twilio-Email-Event-Webhook-Timestamp", ts); code != http.StatusForbidden {
		t.Fatalf("a forged SendGrid delivery: %d", code)
	}
	if code := postJSON(t, sgURL, sgBody, "X-Twilio-Email-Event-Webhook-Signature", base64.StdEncoding.EncodeToString(sig), "X-Twilio-Email-Event-Webhook-Timestamp", ts); code != http.StatusOK {
		t.Fatalf("SendGrid bounce: %d", code)
	}
	// SES: a complaint for cy, through SNS.
	complaint := `{"notificationType":"Complaint","complaint":{"complainedRecipients":[{"emailAddress":"cy@example.com"}],"complaintFeedbackType":"abuse","feedbackId":"fb-1"},"mail":{"messageId":"ses-msg-1"}}`
	if code := postJSON(t, a.base+"/v1/webhooks/ses/acme", sns.notification(t, topic, "sns-1", complaint)); code != http.StatusOK {
		t.Fatalf("SES complaint: %d", code)
	}
}

// Telnyx end to end: the workers send through Telnyx's wire format (its
// fake records each message), Telnyx's signed delivery reports show in
// GET /v1/notifications/{id}, and an inbound STOP opts the number out: the
// next marketing SMS is archived suppressed and never reaches Telnyx.
func TestTelnyxSendsReportsAndStop(t *testing.T) {
	t.Parallel()
	const num, tenantNumber = "+14155550190", "+15005550006"
	e := newEnv(t, "sms:recipient=100/1m,acme/sms:inbound="+tenantNumber)
	tx := fakes.NewTelnyxAPI(t)
	tx.SetReports(func(fakes.Delivery) []string { return []string{"sent", "delivered"} })
	addr := freeAddr(t)
	for k, v := range map[string]string{"SLUICE_SMS_SENDER": "telnyx", "SLUICE_TELNYX_BASE_URL": tx.URL, "SLUICE_TELNYX_API_KEY": tx.APIKey,
		"SLUICE_TELNYX_PUBLIC_KEY": tx.PublicKey, "SLUICE_TELNYX_WEBHOOK_URL": "http://" + addr, "SLUICE_SMS_FROM": tenantNumber} {
		e.vars[k] = v
	}
	a := e.startAPIAt(addr, nil, "acme")
	e.worker("w0", nil)
	tok := a.tokens["acme"]
	send := func(category string) string {
		t.Helper()
		r := a.call("POST", "/v1/notifications", tok, fmt.Sprintf(`{"channel":"sms","to":%q,"body":"hello","category":%q}`, num, category))
		if r.Status != http.StatusAccepted {
			t.Fatalf("enqueue: %d %s", r.Status, r.Body)
		}
		var acc api.Accepted
		r.JSON(t, &acc)
		return acc.ID
	}
	id := send("transactional")
	d := tx.WaitCount(t, 1, 30*time.Second)[0]
	if d.ID != id || d.To != num || d.From != tenantNumber || d.StatusCallback != "http://"+addr+"/v1/callbacks/telnyx/acme/"+id {
		t.Fatalf("Telnyx received %+v", d)
	}
	// The status is read from Redis: nothing to wait on.
	type read struct {
		Status  api.Status
		Reports []fakes.TelnyxWebhook
	}
	st := sluicetest.EventuallyValueEvery(t, 15*time.Second, 50*time.Millisecond, "the notification to read as delivered after Telnyx's reports", func() (read, bool) {
		var st api.Status
		a.call("GET", "/v1/notifications/"+id, tok, nil).JSON(t, &st)
		return read{st, tx.Reports()}, st.State == api.StateDelivered
	}).Status
	if st.MessageSID != d.SID || st.ProviderStatus != "delivered" {
		t.Fatalf("status %+v, want delivered with Telnyx's id %s", st, d.SID)
	}

	inbound := "http://" + addr + "/v1/inbound/telnyx/acme"
	if code, err := tx.Inbound(context.Background(), inbound, num, tenantNumber, "STOP"); err != nil || code != http.StatusOK {
		t.Fatalf("inbound STOP: %d %v", code, err)
	}
	var sup struct {
		Suppressed bool                               `json:"suppressed"`
		Ledger     []struct{ Source, Keyword string } `json:"ledger"`
	}
	a.call("GET", "/v1/suppressions/sms/"+num, tok, nil).JSON(t, &sup)
	if !sup.Suppressed || len(sup.Ledger) != 1 || sup.Ledger[0].Keyword != "STOP" {
		t.Fatalf("after STOP: %+v", sup)
	}
	late := send("marketing")
	if st := a.waitState(t, tok, late, 30*time.Second, api.StateArchived, api.StateDelivered, api.StateSent); st.State != api.StateArchived || st.Reason != tasks.ReasonSuppressed {
		t.Fatalf("the marketing SMS after STOP: %+v", st)
	}
	for _, d := range tx.Deliveries() {
		if d.ID == late {
			t.Fatal("the marketing SMS after STOP reached Telnyx")
		}
	}
}

// A signed Telnyx event replayed into another tenant changes nothing
// there (issue 50: a STOP posted to acme's route, then to beta's, opted the
// number out for both). One key signs every tenant's events and neither
// the URL nor the tenant is signed, so an event is bound to a tenant by
// what it names: an inbound message by the number (or messaging profile)
// it was sent to, declared in the tenant's plan (sms:inbound=…); a
// delivery report by the number the notification of its URL went to. And
// an event id is taken once across every tenant.
func TestTelnyxReplayIntoAnotherTenantChangesNothing(t *testing.T) {
	t.Parallel()
	const num, acmeNumber, betaNumber = "+14155550191", "+15005550006", "+15005550007"
	e := newEnv(t, "sms:recipient=100/1m,acme/sms:inbound="+acmeNumber+",beta/sms:inbound="+betaNumber)
	tx := fakes.NewTelnyxAPI(t)
	tx.SetReports(func(fakes.Delivery) []string { return nil }) // the test posts the reports
	addr := freeAddr(t)
	for k, v := range map[string]string{"SLUICE_SMS_SENDER": "telnyx", "SLUICE_TELNYX_BASE_URL": tx.URL, "SLUICE_TELNYX_API_KEY": tx.APIKey,
		"SLUICE_TELNYX_PUBLIC_KEY": tx.PublicKey, "SLUICE_TELNYX_WEBHOOK_URL": "http://" + addr, "SLUICE_SMS_FROM": acmeNumber} {
		e.vars[k] = v
	}
	a := e.startAPIAt(addr, nil, "acme", "beta")
	e.worker("w0", nil)
	ctx := context.Background()
	suppressed := func(tenant string) bool {
		var sup struct {
			Suppressed bool `json:"suppressed"`
		}
		a.call("GET", "/v1/suppressions/sms/"+num, a.tokens[tenant], nil).JSON(t, &sup)
		return sup.Suppressed
	}
	stop := func() []byte {
		return []byte(fmt.Sprintf(`{"data":{"event_type":"message.received","id":%q,"occurred_at":%q,"payload":{"id":%q,"type":"SMS","direction":"inbound","from":{"phone_number":%q},"to":[{"phone_number":%q,"status":"webhook_delivered"}],"text":"STOP","errors":[]},"record_type":"event"}}`,
			fmt.Sprintf("ev-%d", time.Now().UnixNano()), time.Now().UTC().Format(time.RFC3339), fmt.Sprintf("m-%d", time.Now().UnixNano()), num, acmeNumber))
	}
	acmeIn, betaIn := "http://"+addr+"/v1/inbound/telnyx/acme", "http://"+addr+"/v1/inbound/telnyx/beta"
	// 1. Posted to beta first: refused, and its id not spent — acme's own
	// delivery of it still counts.
	body, at := stop(), time.Now()
	if code, _ := tx.Post(ctx, betaIn, body, at); code != http.StatusForbidden {
		t.Errorf("acme's STOP posted to beta: %d, want 403", code)
	}
	if code, _ := tx.Post(ctx, acmeIn, body, at); code != http.StatusOK {
		t.Errorf("acme's STOP posted to acme after beta's refusal: %d, want 200", code)
	}
	// 2. The same signed STOP replayed into beta after acme took it.
	if code, _ := tx.Post(ctx, betaIn, body, at); code == http.StatusOK {
		t.Errorf("acme's STOP replayed to beta: %d", code)
	}
	if !suppressed("acme") || suppressed("beta") {
		t.Errorf("after the replay: acme suppressed %v (want true), beta %v (want false)", suppressed("acme"), suppressed("beta"))
	}
	// 3. A delivery report: acme's, replayed to beta's notification.
	send := func(tenant, to string) string {
		r := a.call("POST", "/v1/notifications", a.tokens[tenant], fmt.Sprintf(`{"channel":"sms","to":%q,"body":"hello","category":"transactional"}`, to))
		if r.Status != http.StatusAccepted {
			t.Fatalf("enqueue: %d %s", r.Status, r.Body)
		}
		var acc api.Accepted
		r.JSON(t, &acc)
		return acc.ID
	}
	acmeID, betaID := send("acme", "+14155550192"), send("beta", "+14155550193")
	ds := tx.WaitCount(t, 2, 30*time.Second)
	var acmeMsg fakes.Delivery
	for _, d := range ds {
		if d.ID == acmeID {
			acmeMsg = d
		}
	}
	if code, err := tx.Report(ctx, acmeMsg, "delivery_failed", 40300); err != nil || code != http.StatusNoContent {
		t.Fatalf("acme's report: %d %v", code, err)
	}
	replayed := acmeMsg
	replayed.StatusCallback = "http://" + addr + "/v1/callbacks/telnyx/beta/" + betaID
	if code, _ := tx.Report(ctx, replayed, "delivery_failed", 40300); code != http.StatusForbidden {
		t.Errorf("acme's report posted to beta's notification: %d, want 403", code)
	}
	var st api.Status
	a.call("GET", "/v1/notifications/"+betaID, a.tokens["beta"], nil).JSON(t, &st)
	if st.State == api.StateUndelivered || st.ProviderStatus != "" {
		t.Errorf("beta's notification after acme's report: %+v; want it untouched", st)
	}
	var sup struct {
		Suppressed bool `json:"suppressed"`
	}
	a.call("GET", "/v1/suppressions/sms/+14155550192", a.tokens["beta"], nil).JSON(t, &sup)
	if sup.Suppressed {
		t.Error("acme's report marked its number undeliverable for beta")
	}
	a.call("GET", "/v1/notifications/"+acmeID, a.tokens["acme"], nil).JSON(t, &st)
	if st.State != api.StateUndelivered {
		t.Errorf("acme's own notification after its report: %+v, want undelivered", st)
	}
}
