package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
)

// Channel fallback with the real binaries: SMS taken by `sluice api`, sent
// by a worker, their fates reported by signed status callbacks. Audited at
// the fake SMTP server:
//   - an SMS answered undelivered falls back to its email within 3 s of
//     the callback (its After, 60 s, is not waited for);
//   - two more to the same address, undelivered too, wait for the email's
//     own rule (email:recipient=1/4s): their emails are ≥ 4 s apart;
//   - a delivered SMS's fallback (After 3 s) is not sent;
//   - an SMS with no report by its After (3 s) sends its fallback then;
//   - an undelivered SMS without a fallback changes nothing;
//   - a permanent refusal (21211) falls back at once;
//   - a fallback to an address that opted out is archived (suppressed), not mailed.
//
// Every fallback arrives once, under the id of the SMS with ".fb".
func TestChannelFallback(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=5/1m,email:recipient=1/4s")
	addr := freeAddr(t)
	e.vars["SLUICE_SMS_STATUS_CALLBACK_URL"] = "http://" + addr
	smtp := fakes.NewSMTPServer(t)
	smtp.SetSlots(e.slotOf)
	mail := smtpVars(smtp, "alerts@example.com", nil)
	undelivered := []fakes.StatusUpdate{{Status: "sent"}, {Status: "undelivered", ErrorCode: 30003}}
	fates := map[string][]fakes.StatusUpdate{
		"+14155550170": undelivered, "+14155550171": undelivered, "+14155550172": undelivered,
		"+14155550173": {{Status: "sent"}, {Status: "delivered"}},
		"+14155550174": {{Status: "sent"}},
		"+14155550175": undelivered, "+14155550177": undelivered,
	}
	e.sms.SetCallbacks(func(d fakes.Delivery) []fakes.StatusUpdate { return fates[d.To] })
	e.sms.SetReply(func(to, _ string) (int, string) {
		if to == "+14155550176" {
			return 21211, "" // invalid number: refused for good
		}
		return 0, ""
	})
	a := e.startAPIAt(addr, nil, "acme")
	// Consent holds for fallbacks as for any send: this address opted out.
	e.sluiceRun(nil, "suppression", "add", "--tenant", "acme", "--channel", "email", "--to", "gone@example.com")
	w := e.worker("w0", mail)

	ids := map[string]string{} // SMS recipient → notification id
	send := func(to, email, after string) {
		body := fmt.Sprintf(`{"channel":"sms","to":%q,"body":"Your code is 1234"`, to)
		if email != "" {
			f := fmt.Sprintf(`"channel":"email","to":%q,"subject":"Your code"`, email)
			if after != "" {
				f += fmt.Sprintf(`,"after":%q`, after)
			}
			body += `,"fallback":{` + f + `}`
		}
		r := a.call("POST", "/v1/notifications", a.tokens["acme"], body+"}")
		if r.Status != http.StatusAccepted {
			t.Fatalf("enqueue to %s: %d %s", to, r.Status, r.Body)
		}
		var acc api.Accepted
		r.JSON(t, &acc)
		ids[to] = acc.ID
	}
	send("+14155550170", "jane@example.com", "60s")
	send("+14155550171", "omar@example.com", "60s")
	send("+14155550172", "omar@example.com", "60s")
	send("+14155550173", "li@example.com", "3s")
	send("+14155550174", "ana@example.com", "3s")
	send("+14155550175", "", "")
	send("+14155550176", "raj@example.com", "")
	send("+14155550177", "gone@example.com", "60s") // undelivered, but its fallback's address opted out

	emails := smtp.WaitFor(t, 60*time.Second, "the fallbacks of 170, 171, 172, 174 and 176", func(ds []fakes.Delivery) bool {
		return len(ds) >= 5
	})
	byID := map[string]fakes.Delivery{}
	for _, d := range emails {
		if _, dup := byID[d.ID]; dup {
			t.Errorf("fallback %s received twice", d.ID)
		}
		byID[d.ID] = d
	}
	callbackAt := map[string]time.Time{}
	for _, r := range e.sms.WaitCallbacks(t, 13, 30*time.Second) {
		if r.Code != http.StatusNoContent {
			t.Fatalf("callback %+v answered %d (%v)", r.StatusUpdate, r.Code, r.Err)
		}
		if r.Status == "undelivered" {
			callbackAt[r.ID] = r.At
		}
	}
	smsAt := map[string]time.Time{}
	for _, d := range e.sms.Deliveries() {
		smsAt[d.ID] = d.At
	}
	fb := func(to string) (fakes.Delivery, bool) {
		d, ok := byID[tasks.FallbackID(ids[to])]
		return d, ok
	}
	if d, ok := fb("+14155550170"); !ok || d.To != "jane@example.com" || d.At.Sub(callbackAt[ids["+14155550170"]]) > 3*time.Second {
		t.Errorf("170's fallback: %+v (found %v), %v after its undelivered callback; want within 3 s", d.At, ok, d.At.Sub(callbackAt[ids["+14155550170"]]))
	}
	d1, ok1 := fb("+14155550171")
	d2, ok2 := fb("+14155550172")
	if !ok1 || !ok2 {
		t.Errorf("omar's fallbacks: %v %v", ok1, ok2)
	} else if gap := d2.At.Sub(d1.At); gap < 4*time.Second && -gap < 4*time.Second {
		t.Errorf("omar's two fallbacks %v apart: the email rule (1/4s) did not hold them", gap.Abs())
	}
	if d, ok := fb("+14155550174"); !ok || d.At.Sub(smsAt[ids["+14155550174"]]) < 3*time.Second {
		t.Errorf("174 (no report): fallback %v (found %v) after its SMS; want after its 3 s", d.At.Sub(smsAt[ids["+14155550174"]]), ok)
	}
	if d, ok := fb("+14155550176"); !ok || d.Header.Get("Subject") != "Your code" {
		t.Errorf("176 (refused 21211): fallback found %v, subject %q", ok, d.Header.Get("Subject"))
	}
	// 173 was delivered: its fallback ran at its 3 s and found that.
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(w.logText(), "fallback not sent: the notification it stands in for was delivered") {
		if time.Now().After(deadline) {
			t.Fatalf("173's fallback never ran (no log line); worker log:\n%s", tail(w.logText(), 30))
		}
		time.Sleep(100 * time.Millisecond) // polling a log file: no signal exists
	}
	for _, d := range smtp.Deliveries() {
		if d.ID == tasks.FallbackID(ids["+14155550173"]) || d.To == "li@example.com" {
			t.Errorf("a delivered SMS's fallback was sent: %+v", d.ID)
		}
	}
	// 177's fallback went to an address that opted out: archived, not mailed.
	gone := a.waitState(t, a.tokens["acme"], tasks.FallbackID(ids["+14155550177"]), 30*time.Second, api.StateArchived)
	if gone.Reason != "suppressed" {
		t.Errorf("177's fallback: %+v; want archived as suppressed", gone)
	}
	if n := len(smtp.Deliveries()); n != 5 {
		t.Errorf("%d emails; want the 5 fallbacks (none for 173, 175, 177)", n)
	}
	var st api.Status
	a.call("GET", "/v1/notifications/"+tasks.FallbackID(ids["+14155550170"]), a.tokens["acme"], nil).JSON(t, &st)
	t.Logf("fallbacks: 170 %v after its undelivered callback; omar's two %v apart; 174 %v after its SMS (After 3 s); the fallback's status %s",
		byID[tasks.FallbackID(ids["+14155550170"])].At.Sub(callbackAt[ids["+14155550170"]]).Round(time.Millisecond),
		d2.At.Sub(d1.At).Abs().Round(time.Millisecond),
		byID[tasks.FallbackID(ids["+14155550174"])].At.Sub(smsAt[ids["+14155550174"]]).Round(time.Millisecond), st.State)
}
