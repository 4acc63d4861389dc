package e2e

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/testkit/fakes"
)

// The SMS delivery loop with the real binaries: `sluice api` takes three
// SMS, a `sluice worker` sends them through a Messaging Service (the
// provider sees MessagingServiceSid, no From), the fake provider reports
// their fates with signed status callbacks to the API, and the status
// endpoint shows delivered, undelivered (30007) and failed (30005). The
// 30005 puts the number on the tenant's suppression list: the next SMS to
// it is archived unsent. A forged callback is refused; the outcomes are
// counted; the records have TTLs and hold no number.
func TestCallbackDeliveryLoop(t *testing.T) {
	t.Parallel()
	const service = "MG0123456789abcdef0123456789abcdef"
	e := newEnv(t, "sms:recipient=5/1m,sms:tenant=1000/1h")
	addr := freeAddr(t)
	e.vars["SLUICE_SMS_STATUS_CALLBACK_URL"] = "http://" + addr
	e.vars["SLUICE_SMS_MESSAGING_SERVICE_SID"] = service
	delete(e.vars, "SLUICE_SMS_FROM")
	fates := map[string][]fakes.StatusUpdate{
		"+14155550150": {{Status: "sent"}, {Status: "delivered"}},
		"+14155550151": {{Status: "sent"}, {Status: "undelivered", ErrorCode: 30007}},
		"+14155550152": {{Status: "failed", ErrorCode: 30005}},
	}
	e.sms.SetCallbacks(func(d fakes.Delivery) []fakes.StatusUpdate { return fates[d.To] })
	a := e.startAPIAt(addr, nil, "acme")
	e.worker("w0", nil)

	ids := map[string]string{} // recipient → id
	for to := range fates {
		r := a.call("POST", "/v1/notifications", a.tokens["acme"], smsJSON(to, "hello"))
		if r.Status != http.StatusAccepted {
			t.Fatalf("enqueue: %d %s", r.Status, r.Body)
		}
		var acc api.Accepted
		r.JSON(t, &acc)
		ids[to] = acc.ID
	}
	ds := e.sms.WaitCount(t, 3, 30*time.Second)
	for _, d := range ds {
		if d.MessagingServiceSID != service || d.Form.Has("From") || d.StatusCallback != "http://"+addr+"/v1/callbacks/sms/acme/"+d.ID {
			t.Fatalf("the provider got %v", d.Form)
		}
	}
	for _, res := range e.sms.WaitCallbacks(t, 5, 30*time.Second) {
		if res.Code != http.StatusNoContent {
			t.Fatalf("callback %+v about %s answered %d (%v)", res.StatusUpdate, res.ID, res.Code, res.Err)
		}
	}
	want := map[string]struct {
		state string
		code  int
	}{"+14155550150": {api.StateDelivered, 0}, "+14155550151": {api.StateUndelivered, 30007}, "+14155550152": {api.StateFailed, 30005}}
	for to, id := range ids {
		var st api.Status
		a.call("GET", "/v1/notifications/"+id, a.tokens["acme"], nil).JSON(t, &st)
		if st.State != want[to].state || st.ErrorCode != want[to].code || st.MessageSID == "" {
			t.Errorf("%s: %+v; want %s with code %d", to, st, want[to].state, want[to].code)
		}
	}

	// The failed number is suppressed for acme: archived, never sent.
	r := a.call("POST", "/v1/notifications", a.tokens["acme"], smsJSON("+14155550152", "again"))
	var next api.Accepted
	r.JSON(t, &next)
	st := a.waitState(t, a.tokens["acme"], next.ID, 30*time.Second, api.StateArchived) // the SMS to a suppressed number
	if st.Reason != "suppressed" || len(e.sms.Deliveries()) != 3 {
		t.Fatalf("status %+v after %d deliveries; want reason suppressed and 3", st, len(e.sms.Deliveries()))
	}

	// A forged callback (another token) is refused and changes nothing.
	path := "/v1/callbacks/sms/acme/" + ids["+14155550150"]
	forged := url.Values{"MessageSid": {"SMx"}, "MessageStatus": {"undelivered"}, "ErrorCode": {"30005"}, "To": {"+14155550150"}}
	if code, err := e.sms.PostCallback(context.Background(), a.base+path, forged, fakes.Sign("not-the-token", a.base+path, forged)); err != nil || code != http.StatusForbidden {
		t.Fatalf("forged callback: %d, %v", code, err)
	}
	a.call("GET", "/v1/notifications/"+ids["+14155550150"], a.tokens["acme"], nil).JSON(t, &st)
	if st.State != api.StateDelivered {
		t.Fatalf("after a forged callback: %+v", st)
	}

	metrics := string(a.call("GET", "/metrics", "", nil).Body)
	for _, line := range []string{
		`sluice_delivery_outcomes_total{channel="sms",code_class="none",status="delivered"} 1`,
		`sluice_delivery_outcomes_total{channel="sms",code_class="filtered",status="undelivered"} 1`,
		`sluice_delivery_outcomes_total{channel="sms",code_class="recipient",status="failed"} 1`,
	} {
		if !strings.Contains(metrics, line) {
			t.Errorf("the API's metrics lack %s", line)
		}
	}
	// The delivery records and the consent state (suppression hash and
	// ledger) carry TTLs and no number.
	ctx := context.Background()
	dlv := e.rdb.Keys(ctx, "*:dlv").Val()
	cons := append(e.rdb.Keys(ctx, "*:consent:sms:*").Val(), e.rdb.Keys(ctx, "*:ledger:sms:*").Val()...)
	if len(dlv) != 3 || len(cons) != 2 {
		t.Fatalf("delivery keys %v and consent keys %v; want 3 and 2 (one hash, one ledger)", dlv, cons)
	}
	for _, k := range append(dlv, cons...) {
		dump := e.rdb.Dump(ctx, k).Val()
		if ttl := e.rdb.PTTL(ctx, k).Val(); ttl <= 0 || strings.Contains(k, "555015") || strings.Contains(dump, "555015") {
			t.Errorf("%s: TTL %v, or the number in its key or value", k, ttl)
		}
	}
}
