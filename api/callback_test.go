package api_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/testkit/apienv"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

const service = "MG0123456789abcdef0123456789abcdef"

// enqueue posts one notification as acme and returns its id.
func (b *bundle) enqueue(t *testing.T, n map[string]any) string {
	t.Helper()
	r := b.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], n)
	if r.Status != http.StatusAccepted {
		t.Fatalf("enqueue: %d %s", r.Status, r.Body)
	}
	var a api.Accepted
	r.JSON(t, &a)
	return a.ID
}

func (b *bundle) status(t *testing.T, id string) api.Status {
	t.Helper()
	var st api.Status
	r := b.Do(t, "GET", "/v1/notifications/"+id, b.Tokens["acme"], nil)
	if r.Status != http.StatusOK {
		t.Fatalf("status of %s: %d %s", id, r.Status, r.Body)
	}
	r.JSON(t, &st)
	return st
}

// delivery waits for the provider to receive the notification id.
func (b *bundle) delivery(t *testing.T, id string) fakes.Delivery {
	t.Helper()
	var got fakes.Delivery
	b.SMS.WaitFor(t, 10*time.Second, "notification "+id+" at the provider", func(ds []fakes.Delivery) bool {
		for _, d := range ds {
			if d.ID == id {
				got = d
				return true
			}
		}
		return false
	})
	return got
}

// outcomes reads sluice_delivery_outcomes_total{channel="sms"} of the API.
func outcomes(t *testing.T, b *bundle, status, class string) float64 {
	t.Helper()
	r := b.Do(t, "GET", "/metrics", "", nil)
	want := `sluice_delivery_outcomes_total{channel="sms",code_class="` + class + `",status="` + status + `"} `
	for _, line := range strings.Split(string(r.Body), "\n") {
		if v, ok := strings.CutPrefix(line, want); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			return f
		}
	}
	return 0
}

// An SMS through a Messaging Service reaches the provider with
// MessagingServiceSid and no From, asks for its status callback at the API,
// and the provider's signed callbacks (sent, then delivered) move it to
// delivered; the outcome is counted once.
func TestCallbackDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	b.SMS.SetCallbacks(func(fakes.Delivery) []fakes.StatusUpdate {
		return []fakes.StatusUpdate{{Status: "sent"}, {Status: "delivered"}}
	})
	b.RunWorker(t, app.WorkerOptions{})
	n := apienv.NewSMS("+14155550140", "Your code is 123456")
	n["messaging_service_sid"] = service
	id := b.enqueue(t, n)
	d := b.delivery(t, id)
	if d.MessagingServiceSID != service || d.Form.Has("From") {
		t.Fatalf("the provider got MessagingServiceSid %q and From %q; want the service and no From", d.MessagingServiceSID, d.Form.Get("From"))
	}
	if want := b.CallbackURL + "/v1/callbacks/sms/acme/" + id; d.StatusCallback != want {
		t.Fatalf("StatusCallback %q, want %q", d.StatusCallback, want)
	}
	for _, res := range b.SMS.WaitCallbacks(t, 2, 10*time.Second) {
		if res.Code != http.StatusNoContent {
			t.Fatalf("callback %+v answered %d", res.StatusUpdate, res.Code)
		}
	}
	var st api.Status
	// The provider's callback can arrive before the worker's done record
	// (which carries sent_at) is written: wait for both.
	sluicetest.Eventually(t, 5*time.Second, "the notification to read as delivered, with its send time", func() bool {
		st = b.status(t, id)
		return st.State == api.StateDelivered && !st.SentAt.IsZero()
	})
	if st.ProviderStatus != "delivered" || st.ErrorCode != 0 || st.MessageSID != d.SID || st.ProviderStatusAt.IsZero() {
		t.Fatalf("status %+v", st)
	}
	if v := outcomes(t, b, "delivered", "none"); v != 1 {
		t.Fatalf("delivered outcomes %v, want 1", v)
	}
	// Twilio repeats itself sometimes: a second delivered is not a second outcome.
	if code, err := b.SMS.SendCallback(context.Background(), d, fakes.StatusUpdate{Status: "delivered"}); err != nil || code != http.StatusNoContent {
		t.Fatalf("repeated callback: %d, %v", code, err)
	}
	if v := outcomes(t, b, "delivered", "none"); v != 1 {
		t.Fatalf("delivered outcomes after a repeat %v, want 1", v)
	}
}

// An undelivered status shows its error code; a late "sent" does not move
// the notification back; a code outside SLUICE_SMS_SUPPRESS_CODES (30007,
// carrier filtering: about the content, not the number) suppresses nothing.
func TestCallbackUndeliveredShowsTheCode(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	b.SMS.SetCallbacks(func(fakes.Delivery) []fakes.StatusUpdate {
		return []fakes.StatusUpdate{{Status: "undelivered", ErrorCode: 30007}}
	})
	b.RunWorker(t, app.WorkerOptions{})
	id := b.enqueue(t, apienv.NewSMS("+14155550141", "Win a prize"))
	d := b.delivery(t, id)
	b.SMS.WaitCallbacks(t, 1, 10*time.Second)
	var st api.Status
	sluicetest.Eventually(t, 5*time.Second, "the notification to read as undelivered", func() bool {
		st = b.status(t, id)
		return st.State == api.StateUndelivered
	})
	if st.ErrorCode != 30007 || st.ProviderStatus != "undelivered" {
		t.Fatalf("status %+v", st)
	}
	if code, err := b.SMS.SendCallback(context.Background(), d, fakes.StatusUpdate{Status: "sent"}); err != nil || code != http.StatusNoContent {
		t.Fatalf("late callback: %d, %v", code, err)
	}
	if st = b.status(t, id); st.State != api.StateUndelivered || st.ErrorCode != 30007 {
		t.Fatalf("after a late sent: %+v", st)
	}
	if v := outcomes(t, b, "undelivered", "filtered"); v != 1 {
		t.Fatalf("undelivered/filtered outcomes %v, want 1", v)
	}
	b.SMS.SetCallbacks(nil)
	again := b.enqueue(t, apienv.NewSMS("+14155550142", "second"))
	b.delivery(t, again)
}

// A callback without a signature, signed with another token, signed for
// another notification's URL, or whose fields were changed after signing
// is refused with 403, and nothing about the notification changes. A
// callback for a notification Sluice has no record of — or for the right id
// under another tenant — is 404 once its signature holds.
func TestCallbackSignatureRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	markSent(t, b, "acme", "n-1")
	markSent(t, b, "acme", "n-2")
	ctx := context.Background()
	base := b.CallbackURL
	u1, u2 := base+"/v1/callbacks/sms/acme/n-1", base+"/v1/callbacks/sms/acme/n-2"
	params := url.Values{"MessageSid": {"SM1"}, "MessageStatus": {"delivered"}, "To": {"+14155550143"}, "AccountSid": {b.SMS.AccountSID}}
	good := fakes.Sign(b.SMS.AuthToken, u1, params)
	failed := url.Values{"MessageSid": {"SM1"}, "MessageStatus": {"failed"}, "ErrorCode": {"30005"}, "To": {"+14155550143"}, "AccountSid": {b.SMS.AccountSID}}
	for _, c := range []struct {
		name, url string
		params    url.Values
		sig       string
	}{
		{"Unsigned", u1, params, ""},
		{"OtherToken", u1, params, fakes.Sign("another-token", u1, params)},
		{"OtherNotification", u2, params, good},
		{"ChangedFields", u1, failed, good},
		{"Garbage", u1, params, "not base64 at all"},
	} {
		code, err := b.SMS.PostCallback(ctx, b.HTTP.URL+strings.TrimPrefix(c.url, base), c.params, c.sig)
		if err != nil || code != http.StatusForbidden {
			t.Errorf("%s: %d, %v; want 403", c.name, code, err)
		}
	}
	for _, id := range []string{"n-1", "n-2"} {
		if st := b.status(t, id); st.State != api.StateSent || st.ProviderStatus != "" {
			t.Fatalf("%s after refused callbacks: %+v", id, st)
		}
	}
	if keys := b.RDB.Keys(ctx, "*:dlv").Val(); len(keys) != 0 {
		t.Fatalf("delivery records written: %v", keys)
	}
	if keys := b.RDB.Keys(ctx, "*suppressed*").Val(); len(keys) != 0 {
		t.Fatalf("suppressions written: %v", keys)
	}
	for _, path := range []string{"/v1/callbacks/sms/acme/never-sent", "/v1/callbacks/sms/globex/n-1"} {
		code, err := b.SMS.PostCallback(ctx, b.HTTP.URL+path, params, fakes.Sign(b.SMS.AuthToken, base+path, params))
		if err != nil || code != http.StatusNotFound {
			t.Errorf("%s: %d, %v; want 404", path, code, err)
		}
	}
	// The signature is checked against the configured base, not the Host the
	// request came in with; the URL with its default port is taken too.
	if code, _ := b.SMS.PostCallback(ctx, b.HTTP.URL+"/v1/callbacks/sms/acme/n-1", params, fakes.Sign(b.SMS.AuthToken, b.HTTP.URL+"/v1/callbacks/sms/acme/n-1?x", params)); code != http.StatusForbidden {
		t.Errorf("signed for another URL: %d", code)
	}
	if code, _ := b.SMS.PostCallback(ctx, u1, params, good); code != http.StatusNoContent {
		t.Fatalf("the well-signed callback: %d", code)
	}
	if st := b.status(t, "n-1"); st.State != api.StateDelivered {
		t.Fatalf("after the signed callback: %+v", st)
	}
}

// A permanent failure whose code is in SLUICE_SMS_SUPPRESS_CODES (30005,
// unknown handset) puts the number on the tenant's suppression list: the
// next SMS to it is archived with reason suppressed and never reaches the
// provider; other tenants still send to it.
func TestCallbackFeedsSuppression(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=5/1m", nil)
	b.SMS.SetCallbacks(func(fakes.Delivery) []fakes.StatusUpdate {
		return []fakes.StatusUpdate{{Status: "sent"}, {Status: "undelivered", ErrorCode: 30005}}
	})
	b.RunWorker(t, app.WorkerOptions{})
	id := b.enqueue(t, apienv.NewSMS("+14155550144", "hello"))
	b.delivery(t, id)
	b.SMS.WaitCallbacks(t, 2, 10*time.Second)
	if st := b.status(t, id); st.State != api.StateUndelivered || st.ErrorCode != 30005 {
		t.Fatalf("status %+v", st)
	}
	b.SMS.SetCallbacks(nil)
	next := b.enqueue(t, apienv.NewSMS("+1 415 555 0144", "are you there?"))
	var st api.Status
	sluicetest.Eventually(t, 10*time.Second, "the next SMS to be archived", func() bool {
		st = b.status(t, next)
		return st.State == api.StateArchived
	})
	if st.Reason != "suppressed" || !strings.Contains(st.Detail, "undeliverable") || !strings.Contains(st.Detail, "code 30005") {
		t.Fatalf("status %+v", st)
	}
	r := b.Do(t, "POST", "/v1/notifications", b.Tokens["globex"], apienv.NewSMS("+14155550144", "globex's own"))
	var a api.Accepted
	r.JSON(t, &a)
	b.delivery(t, a.ID)
	if got := len(b.SMS.Deliveries()); got != 2 {
		t.Fatalf("%d deliveries, want 2 (acme's first, globex's)", got)
	}
	ti, err := b.Task(t, next)
	if err != nil || ti.State != asynq.TaskStateArchived {
		t.Fatalf("task %+v, %v", ti, err)
	}
}

// Without SLUICE_SMS_STATUS_CALLBACK_URL the route answers 404 and says
// why; other methods on it are 405.
func TestCallbackRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, map[string]string{"SLUICE_SMS_STATUS_CALLBACK_URL": "https://sluice.example.com"})
	off := setup(t, rules, map[string]string{"SLUICE_SMS_STATUS_CALLBACK_URL": "", "SLUICE_SMS_SENDER": "log", "SLUICE_SMS_AUTH_TOKEN": ""})
	if r := off.Do(t, "POST", "/v1/callbacks/sms/acme/n-1", "", "MessageStatus=sent", "Content-Type", "application/x-www-form-urlencoded", "X-Twilio-Signature", "x"); r.Status != 404 || !strings.Contains(r.Problem(t).Detail, "SLUICE_SMS_STATUS_CALLBACK_URL") {
		t.Fatalf("callbacks off: %d %s", r.Status, r.Body)
	}
	if r := b.Do(t, "GET", "/v1/callbacks/sms/acme/n-1", "", nil); r.Status != 405 || r.Header.Get("Allow") != "POST" {
		t.Fatalf("GET: %d %v", r.Status, r.Header)
	}
	markSent(t, b, "acme", "n-1")
	path := "/v1/callbacks/sms/acme/n-1"
	sign := func(body string) string {
		p, _ := url.ParseQuery(body)
		return fakes.Sign(b.SMS.AuthToken, "https://sluice.example.com"+path, p)
	}
	for _, c := range []struct {
		body, ctype string
		status      int
		field       string
	}{
		{"MessageStatus=sent", "application/json", 415, ""},
		{"MessageStatus=bounced", "application/x-www-form-urlencoded", 400, "MessageStatus"},
		{"MessageStatus=failed&ErrorCode=-1", "application/x-www-form-urlencoded", 400, "ErrorCode"},
		{"MessageStatus=sent&MessageStatus=delivered", "application/x-www-form-urlencoded", 400, "MessageStatus"},
		{"MessageStatus=sent&MessageSid=SM%3A1", "application/x-www-form-urlencoded", 400, "MessageSid"},
		{"MessageStatus=sent&" + strings.Repeat("x", 70<<10) + "=1", "application/x-www-form-urlencoded", 413, ""},
	} {
		r := b.Do(t, "POST", path, "", c.body, "Content-Type", c.ctype, "X-Twilio-Signature", sign(c.body))
		if r.Status != c.status {
			t.Errorf("%.40s: %d, want %d: %s", c.body, r.Status, c.status, r.Body)
			continue
		}
		if p := r.Problem(t); c.field != "" && (len(p.InvalidParams) == 0 || p.InvalidParams[0].Name != c.field) {
			t.Errorf("%.40s: %+v, want %s named", c.body, p, c.field)
		}
	}
	// Behind a proxy: the provider calls the public URL, the API sees only
	// the path; a signature over the public URL with its default port is good.
	body := "MessageStatus=sent&MessageSid=SM2"
	p, _ := url.ParseQuery(body)
	sig := fakes.Sign(b.SMS.AuthToken, "https://sluice.example.com:443"+path, p)
	if r := b.Do(t, "POST", path, "", body, "Content-Type", "application/x-www-form-urlencoded", "X-Twilio-Signature", sig); r.Status != 204 {
		t.Fatalf("signed with the default port: %d %s", r.Status, r.Body)
	}
	if st := b.status(t, "n-1"); st.State != api.StateSent || st.ProviderStatus != "sent" || st.MessageSID != "SM2" {
		t.Fatalf("status %+v", st)
	}
}
