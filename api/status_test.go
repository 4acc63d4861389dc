package api_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/app"

	"github.com/sluicehq/sluice/api"
)

// A throttled notification reads as waiting, with the rule that holds it
// and the slot the limiter booked for it; once it went, as sent.
func TestStatusWaitingThenSent(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=1/3s", map[string]string{"SLUICE_DELAYED_CHECK_INTERVAL": "100ms", "SLUICE_POLL_INTERVAL": "50ms"})
	w, err := app.NewWorker(b.wcfg, app.WorkerOptions{Redis: b.rdb, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	tok := b.tokens["acme"]
	var ids []string
	for i := 0; i < 2; i++ {
		var a api.Accepted
		b.do(t, "POST", "/v1/notifications", tok, sms("+14155550100", "hi")).json(t, &a)
		ids = append(ids, a.ID)
	}
	// Both may be taken at once: either is the one that waits.
	var st api.Status
	eventually(t, 5*time.Second, "a notification to wait for its slot", func() bool {
		for i, id := range ids {
			if b.do(t, "GET", "/v1/notifications/"+id, tok, nil).json(t, &st); st.State == api.StateWaiting {
				ids[0], ids[1] = ids[1-i], id
				return true
			}
		}
		return false
	})
	if st.Reason != "throttled" || st.Rule != "sms:recipient 1/3s" || st.Slot.IsZero() || st.NextAttemptAt.IsZero() || st.NextAttemptAt.After(st.Slot) {
		t.Fatalf("waiting: %+v", st)
	}
	ds := b.sms.WaitCount(t, 2, 10*time.Second)
	if at := ds[1].At; at.Before(st.Slot) || at.After(st.Slot.Add(time.Second)) {
		t.Fatalf("sent at %v; the status said slot %v", at, st.Slot)
	}
	eventually(t, 5*time.Second, "the second notification to read as sent", func() bool {
		b.do(t, "GET", "/v1/notifications/"+ids[1], tok, nil).json(t, &st)
		return st.State == api.StateSent
	})
	if st.SentAt.IsZero() || st.SentAt.Before(st.Slot) && !st.Slot.IsZero() {
		t.Fatalf("sent: %+v", st)
	}
	t.Logf("waited under %s for slot %s; arrived %v after it", "sms:recipient 1/3s", st.Slot.Format("15:04:05.000"), ds[1].At.Sub(st.Slot).Round(time.Millisecond))
	// The admin finds sent notifications by naming the tenant.
	if r := b.do(t, "GET", "/v1/notifications/"+ids[0]+"?tenant=acme", adminToken, nil); r.status != 200 {
		t.Fatalf("admin: %d %s", r.status, r.body)
	}
	if r := b.do(t, "GET", "/v1/notifications/"+ids[0], b.tokens["globex"], nil); r.status != 404 {
		t.Fatalf("globex reading acme's sent notification: %d %s", r.status, r.body)
	}
}
