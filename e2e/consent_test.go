package e2e

import (
	"bytes"
	"context"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// STOP through the provider's signed incoming-message webhook, with the
// real binaries, audited at the SMS provider: a marketing drain to one
// number is under way (sms.marketing:recipient=2/1s, 21 SMS); the
// recipient texts STOP (twice). From then no marketing SMS reaches the
// provider — tolerance: a send admitted before the STOP was recorded may
// still arrive, so none later than 1 s after it — and every one left is
// archived, reason suppressed; an OTP (consent=exempt) still goes; the
// recipient gets exactly one confirmation, from the number it texted;
// START lets marketing through again. A forged webhook changes nothing.
func TestStopReplyEndsTheCampaign(t *testing.T) {
	t.Parallel()
	const num, tenantNumber = "+14155550160", "+15005550006"
	e := newEnv(t, "sms.marketing:recipient=2/1s,sms.otp:consent=exempt,"+
		"sms:reply-stop=Acme: you will get no more texts. Reply START to resume,sms:reply-start=Acme: welcome back,acme/sms:inbound="+tenantNumber)
	addr := freeAddr(t)
	e.vars["SLUICE_SMS_STATUS_CALLBACK_URL"] = "http://" + addr
	a := e.startAPIAt(addr, nil, "acme")
	e.worker("w0", nil)
	tok := a.tokens["acme"]

	enqueue := func(category, body string) string {
		t.Helper()
		r := a.call("POST", "/v1/notifications", tok, fmt.Sprintf(`{"channel":"sms","to":%q,"body":%q,"category":%q}`, num, body, category))
		if r.Status != http.StatusAccepted {
			t.Fatalf("enqueue: %d %s", r.Status, r.Body)
		}
		var acc api.Accepted
		r.JSON(t, &acc)
		return acc.ID
	}
	var campaign []string
	for i := range 21 {
		campaign = append(campaign, enqueue("marketing", "sale "+strconv.Itoa(i)))
	}
	e.sms.WaitCount(t, 2, 30*time.Second) // the drain is under way

	inbound := func(body, sid string, sign bool) int {
		t.Helper()
		path := "/v1/inbound/sms/acme"
		form := url.Values{"From": {num}, "To": {tenantNumber}, "Body": {body}, "MessageSid": {sid}, "AccountSid": {e.sms.AccountSID}}
		sig := fakes.Sign(e.sms.AuthToken, a.base+path, form)
		if !sign {
			sig = fakes.Sign("not-the-token", a.base+path, form)
		}
		code, err := e.sms.PostCallback(context.Background(), a.base+path, form, sig)
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	if code := inbound("STOP", "SM1", false); code != http.StatusForbidden {
		t.Fatalf("a forged STOP: %d", code)
	}
	var sup struct {
		Suppressed bool `json:"suppressed"`
	}
	if a.call("GET", "/v1/suppressions/sms/"+num, tok, nil).JSON(t, &sup); sup.Suppressed {
		t.Fatal("a forged STOP suppressed the number")
	}
	if code := inbound("Stop", "SM2", true); code != http.StatusOK {
		t.Fatalf("STOP: %d", code)
	}
	stopAt := time.Now()
	if a.call("GET", "/v1/suppressions/sms/"+num, tok, nil).JSON(t, &sup); !sup.Suppressed {
		t.Fatal("not suppressed once the webhook answered")
	}
	if code := inbound("STOP", "SM3", true); code != http.StatusOK {
		t.Fatalf("second STOP: %d", code)
	}
	otp := enqueue("otp", "code 123456")

	// Every campaign task ends: delivered before the STOP, or archived.
	// One bound for them all, taken in turn; the status is read from
	// Redis: nothing to wait on.
	suppressed := 0
	left := campaign
	type still struct {
		ID     string
		Status api.Status
	}
	sluicetest.EventuallyValueEvery(t, 60*time.Second, 50*time.Millisecond, "every campaign task delivered or archived", func() (still, bool) {
		for ; len(left) > 0; left = left[1:] {
			var st api.Status
			a.call("GET", "/v1/notifications/"+left[0], tok, nil).JSON(t, &st)
			switch st.State {
			case api.StateArchived:
				if st.Reason != tasks.ReasonSuppressed {
					t.Fatalf("%s archived as %+v", left[0], st)
				}
				suppressed++
			case api.StateDelivered, api.StateSent:
			default:
				return still{left[0], st}, false
			}
		}
		return still{}, true
	})
	ds := e.sms.WaitCount(t, 21-suppressed+2, 30*time.Second) // the delivered marketing, the OTP, one confirmation
	var marketing, otps, replies int
	for _, d := range ds {
		switch {
		case strings.HasPrefix(d.Body, "sale "):
			marketing++
			if d.At.After(stopAt.Add(time.Second)) {
				t.Errorf("a marketing SMS reached the provider %v after the STOP", d.At.Sub(stopAt))
			}
		case d.ID == otp:
			otps++
		case strings.HasPrefix(d.Body, "Acme: you will get no more texts"):
			replies++
			if d.To != num || d.From != tenantNumber {
				t.Errorf("the confirmation went from %s to %s", d.From, tasks.Mask(d.To))
			}
		default:
			t.Errorf("unexpected SMS %q", d.Body)
		}
	}
	if marketing+suppressed != 21 || otps != 1 || replies != 1 || suppressed == 0 {
		t.Fatalf("provider saw %d marketing (+%d archived), %d OTP, %d confirmations; want 21 in all, 1, 1", marketing, suppressed, otps, replies)
	}
	t.Logf("STOP after %d of 21 marketing SMS; %d archived as suppressed", marketing, suppressed)

	// START lifts it: marketing goes again, with one welcome.
	if code := inbound("start", "SM4", true); code != http.StatusOK {
		t.Fatalf("START: %d", code)
	}
	again := enqueue("marketing", "sale again")
	got := e.sms.WaitCount(t, len(ds)+2, 30*time.Second)
	var sawAgain, welcomes int
	for _, d := range got {
		sawAgain += btoi(d.ID == again)
		welcomes += btoi(d.Body == "Acme: welcome back")
	}
	if sawAgain != 1 || welcomes != 1 {
		t.Fatalf("after START: %d of the new marketing SMS, %d welcomes", sawAgain, welcomes)
	}
	var ledger struct {
		Ledger []struct{ Action, Source, Keyword, Ref string } `json:"ledger"`
	}
	a.call("GET", "/v1/suppressions/sms/"+num, tok, nil).JSON(t, &ledger)
	if len(ledger.Ledger) != 3 || ledger.Ledger[0].Keyword != "STOP" || ledger.Ledger[0].Ref != "SM2" || ledger.Ledger[2].Action != "in" {
		t.Fatalf("ledger %+v", ledger.Ledger)
	}
	for _, k := range e.rdb.Keys(context.Background(), "*").Val() {
		if strings.Contains(k, "5550160") {
			t.Fatalf("key %s names the number", k)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

var httpsLink = regexp.MustCompile(`<(https://[^>]+)>`)

// One-click unsubscribe exactly as a mailbox provider does it (RFC 8058):
// the worker puts Sluice's signed https link in List-Unsubscribe with
// List-Unsubscribe-Post; POSTing List-Unsubscribe=One-Click to it as
// multipart/form-data, no cookie, no token (the link's public host
// rewritten to the API on loopback) opts the address out; the next
// newsletter is archived unsent, reason suppressed, and never reaches the
// SMTP server, while a sign-in code (consent=exempt) still does. A forged
// link gets 404 and changes nothing.
func TestOneClickUnsubscribeAsAMailboxProvider(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "email:recipient=100/1m,email.newsletter:unsubscribe=hosted,email.signin:consent=exempt")
	smtp := fakes.NewSMTPServer(t)
	smtp.SetSlots(e.slotOf)
	addr := freeAddr(t)
	mail := smtpVars(smtp, "news@example.com", map[string]string{"SLUICE_UNSUBSCRIBE_URL": "https://unsub.example.com"})
	for k, v := range mail {
		e.vars[k] = v
	}
	a := e.startAPIAt(addr, nil, "acme")
	e.worker("w0", nil)
	tok := a.tokens["acme"]
	send := func(category string) string {
		t.Helper()
		r := a.call("POST", "/v1/notifications", tok, fmt.Sprintf(`{"channel":"email","to":"Reader@Example.org","subject":"s","body":"b","category":%q}`, category))
		if r.Status != http.StatusAccepted {
			t.Fatalf("enqueue: %d %s", r.Status, r.Body)
		}
		var acc api.Accepted
		r.JSON(t, &acc)
		return acc.ID
	}
	send("newsletter")
	d := smtp.WaitCount(t, 1, 30*time.Second)[0]
	lu := d.Header.Get("List-Unsubscribe")
	m := httpsLink.FindStringSubmatch(lu)
	if m == nil || d.Header.Get("List-Unsubscribe-Post") != "List-Unsubscribe=One-Click" || strings.Contains(lu, "example.org") {
		t.Fatalf("List-Unsubscribe %q, -Post %q", lu, d.Header.Get("List-Unsubscribe-Post"))
	}
	link, err := url.Parse(m[1])
	if err != nil || link.Host != "unsub.example.com" {
		t.Fatalf("link %q: %v", m[1], err)
	}
	post := func(path string) int {
		t.Helper()
		var body bytes.Buffer
		mw := multipart.NewWriter(&body)
		mw.WriteField("List-Unsubscribe", "One-Click")
		mw.Close()
		req, err := http.NewRequest("POST", a.base+path, &body)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", mw.FormDataContentType())
		req.Header.Set("User-Agent", "Mozilla/5.0 (compatible; mailbox-provider one-click)")
		resp, err := sluicetest.Client(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	forged := link.Path[:len(link.Path)-3] + "AAA"
	if code := post(forged); code != http.StatusNotFound {
		t.Fatalf("a forged link: %d", code)
	}
	next := send("newsletter")
	smtp.WaitCount(t, 2, 30*time.Second) // a forged POST changed nothing
	if code := post(link.Path); code != http.StatusOK {
		t.Fatalf("one-click: %d", code)
	}
	late := send("newsletter")
	signin := send("signin")
	st := a.waitState(t, tok, late, 30*time.Second, api.StateArchived) // the newsletter after the unsubscribe
	if st.Reason != tasks.ReasonSuppressed {
		t.Fatalf("archived as %+v", st)
	}
	ds := smtp.WaitCount(t, 3, 30*time.Second)
	ids := map[string]bool{}
	for _, d := range ds {
		ids[d.ID] = true
	}
	if len(ds) != 3 || !ids[next] || !ids[signin] || ids[late] {
		t.Fatalf("the SMTP server received %d messages %v; want the first two newsletters and the sign-in code", len(ds), ids)
	}
}
