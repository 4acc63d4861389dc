package api_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/testkit/apienv"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// A throttled notification reads as waiting, with the rule that holds it
// and the slot the limiter booked for it; once it went, as sent.
func TestStatusWaitingThenSent(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms:recipient=1/3s", map[string]string{"SLUICE_DELAYED_CHECK_INTERVAL": "100ms", "SLUICE_POLL_INTERVAL": "50ms"})
	b.RunWorker(t, app.WorkerOptions{})
	tok := b.Tokens["acme"]
	var ids []string
	for i := 0; i < 2; i++ {
		var a api.Accepted
		b.Do(t, "POST", "/v1/notifications", tok, apienv.NewSMS("+14155550100", "hi")).JSON(t, &a)
		ids = append(ids, a.ID)
	}
	// Both may be taken at once: either is the one that waits.
	var st api.Status
	sluicetest.Eventually(t, 5*time.Second, "a notification to wait for its slot", func() bool {
		for i, id := range ids {
			if b.Do(t, "GET", "/v1/notifications/"+id, tok, nil).JSON(t, &st); st.State == api.StateWaiting {
				ids[0], ids[1] = ids[1-i], id
				return true
			}
		}
		return false
	})
	if st.Reason != "throttled" || st.Rule != "sms:recipient 1/3s" || st.Slot.IsZero() || st.NextAttemptAt.IsZero() || st.NextAttemptAt.After(st.Slot) {
		t.Fatalf("waiting: %+v", st)
	}
	// Never before the slot the status gave (exact); after it on a latency
	// budget of 5 s (a few ms alone; 2.75 s beside two CPU hogs, where a
	// starved wake-up gives its slot back and asks again).
	ds := b.SMS.WaitCount(t, 2, 10*time.Second)
	if at := ds[1].At; at.Before(st.Slot) || at.After(st.Slot.Add(5*time.Second)) {
		t.Fatalf("sent at %v; the status said slot %v", at, st.Slot)
	}
	sluicetest.Eventually(t, 5*time.Second, "the second notification to read as sent", func() bool {
		b.Do(t, "GET", "/v1/notifications/"+ids[1], tok, nil).JSON(t, &st)
		return st.State == api.StateSent
	})
	if st.SentAt.IsZero() || st.SentAt.Before(st.Slot) && !st.Slot.IsZero() {
		t.Fatalf("sent: %+v", st)
	}
	t.Logf("waited under %s for slot %s; arrived %v after it", "sms:recipient 1/3s", st.Slot.Format("15:04:05.000"), ds[1].At.Sub(st.Slot).Round(time.Millisecond))
	// The admin finds sent notifications by naming the tenant.
	if r := b.Do(t, "GET", "/v1/notifications/"+ids[0]+"?tenant=acme", adminToken, nil); r.Status != 200 {
		t.Fatalf("admin: %d %s", r.Status, r.Body)
	}
	if r := b.Do(t, "GET", "/v1/notifications/"+ids[0], b.Tokens["globex"], nil); r.Status != 404 {
		t.Fatalf("globex reading acme's sent notification: %d %s", r.Status, r.Body)
	}
}
