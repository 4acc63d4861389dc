package worker_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/throttle"
)

// An OTP is a priority lane: a marketing backlog to the same number, capped
// hard, neither delays nor blocks it; the OTP's own cap still holds.
func TestPriorityLane(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=1/1m,sms.marketing:recipient=1/1h,sms.otp:exempt,sms.otp:recipient=3/1h")
	b.start(t, b.cfg)
	const to = "+14155550140"
	for i := 0; i < 30; i++ {
		n := tasks.NewSMS("acme", to, fmt.Sprintf("sale %d", i))
		n.Category = "marketing"
		b.enqueue(t, n)
	}
	b.sms.WaitCount(t, 1, 10*time.Second) // the one marketing send the caps allow
	sent := map[string]time.Time{}
	for i := 0; i < 4; i++ {
		n := tasks.NewSMS("acme", to, fmt.Sprintf("code %d", i))
		n.Category = "otp"
		sent[n.ID] = time.Now()
		b.enqueue(t, n)
	}
	// Three OTPs fit their own cap; the fourth waits for it (an hour).
	ds := b.sms.WaitCount(t, 4, 10*time.Second)
	otps := 0
	for _, d := range ds {
		if at, ok := sent[d.ID]; ok {
			otps++
			if lag := d.At.Sub(at); lag > 2*time.Second {
				t.Errorf("an OTP arrived %v after its enqueue", lag)
			}
		}
	}
	if otps != 3 || len(ds) != 4 {
		t.Fatalf("%d deliveries, %d OTPs; want 1 marketing + 3 OTPs", len(ds), otps)
	}
	// Marketing and the 4th OTP wait: once the worker handed them all back to
	// Asynq (no signal for that: poll), 30 wait and still only 4 went out.
	sluicetest.EventuallyValue(t, 10*time.Second, "marketing and the 4th OTP to wait (30 retry or scheduled)", func() (*asynq.QueueInfo, bool) {
		qi := b.queueStats(t)
		return qi, qi.Retry+qi.Scheduled == 30
	})
	if n := len(b.sms.Deliveries()); n != 4 {
		t.Fatalf("%d deliveries while 30 wait; want 4", n)
	}
}

// A rule whose action is drop archives what exceeds it (reason throttled);
// a deadline that the slot would pass archives at once (reason expired),
// whether it comes from expires_at or from the category's max-defer.
func TestDropAndExpire(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms.marketing:recipient=1/1h drop,sms:recipient=1/1h,sms.digest:max-defer=30s")
	r := b.start(t, b.cfg)
	first := tasks.NewSMS("acme", "+14155550150", "first")
	first.Category = "marketing"
	b.enqueue(t, first)
	b.sms.WaitCount(t, 1, 10*time.Second)
	over := tasks.NewSMS("acme", "+14155550150", "second")
	over.Category = "marketing"
	b.enqueue(t, over)

	b.enqueue(t, tasks.NewSMS("acme", "+14155550151", "fills the hour"))
	b.sms.WaitCount(t, 2, 10*time.Second)
	late := tasks.NewSMS("acme", "+14155550151", "code 1234")
	late.ExpiresAt = time.Now().Add(10 * time.Minute) // the slot is an hour away
	b.enqueue(t, late)
	digest := tasks.NewSMS("acme", "+14155550151", "digest")
	digest.Category = "digest"
	b.enqueue(t, digest)

	for _, c := range []struct {
		id, reason string
	}{{over.ID, "throttled: sms.marketing:recipient 1/1h is full"}, {late.ID, "past the expires_at deadline"}, {digest.ID, "past the max-defer deadline"}} {
		// 20 s: a wake-up the fair dispatch missed (docs/development.md,
		// fixed since) once left the third of these untaken for 10 s.
		ti := b.waitTask(t, c.id, 20*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateArchived })
		if !strings.Contains(ti.LastErr, c.reason) || ti.Retried != 0 {
			t.Errorf("%s: archived with %q after %d retries; want %q", c.id, ti.LastErr, ti.Retried, c.reason)
		}
	}
	for reason, want := range map[string]float64{"throttled": 1, "expired": 2} {
		if v := metric(t, r.reg, "sluice_archived_total", map[string]string{"reason": reason}); v != want {
			t.Errorf("archived{reason=%s} = %v, want %v", reason, v, want)
		}
	}
	if n := len(b.sms.Deliveries()); n != 2 {
		t.Fatalf("%d deliveries, want only the first two", n)
	}
}

// A sender rule holds across tenants and recipients: the provider never
// sees two messages of one sender closer than the window.
func TestSenderThroughput(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms:sender=1/500ms,sms:recipient=100/1m")
	// The slack is what keeps the window at the provider when sends take
	// varying time to get there: under the full suite's load (-race, four
	// test binaries on two cores) two sends' trips differed by more than
	// the harness's 100 ms (receipts 487 ms apart), so the slack is 300 ms.
	b.cfg.SendSlack = 300 * time.Millisecond
	b.start(t, b.cfg)
	const n = 12
	for i := 0; i < n; i++ {
		m := tasks.NewSMS(fmt.Sprintf("tenant-%d", i%3), fmt.Sprintf("+1415555%04d", 160+i), "hi")
		b.enqueue(t, m)
	}
	ds := b.sms.WaitCount(t, n, time.Minute)
	for i := 1; i < len(ds); i++ {
		if gap := ds[i].At.Sub(ds[i-1].At); gap <= 500*time.Millisecond {
			t.Fatalf("sends %d and %d of one sender %v apart; the rule is 1/500ms", i-1, i, gap)
		}
	}
	t.Logf("%d sends of one sender in %v (ideal %v)", n, ds[n-1].At.Sub(ds[0].At).Round(time.Millisecond), time.Duration(n-1)*800*time.Millisecond)
}

// In quiet hours (the recipient's zone: tz) a send is booked for the end of
// the quiet span, not sent.
func TestQuietHoursBookTheOpening(t *testing.T) {
	t.Parallel()
	loc, _ := time.LoadLocation("Asia/Kolkata")
	now := time.Now().In(loc)
	start, end := now.Add(-time.Hour), now.Add(2*time.Hour)
	rules := fmt.Sprintf("sms:recipient=5/1m,sms.marketing:quiet=%02d:%02d-%02d:%02d", start.Hour(), start.Minute(), end.Hour(), end.Minute())
	b := setup(t, rules)
	var mu sync.Mutex
	var got []throttle.Decision
	reg := b.startWith(t, b.cfg, app.WorkerOptions{OnDecision: func(_ tasks.Notification, d throttle.Decision) {
		mu.Lock()
		got = append(got, d)
		mu.Unlock()
	}})
	n := tasks.NewSMS("acme", "+14155550170", "evening sale")
	n.Category, n.TZ = "marketing", "Asia/Kolkata"
	b.enqueue(t, n)
	otp := tasks.NewSMS("acme", "+14155550170", "code")
	b.enqueue(t, otp) // the default category has no quiet hours
	b.sms.WaitCount(t, 1, 10*time.Second)
	b.waitTask(t, n.ID, 10*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateRetry })
	mu.Lock()
	defer mu.Unlock()
	var booked *throttle.Decision
	for i := range got {
		if got[i].Booked {
			booked = &got[i]
		}
	}
	opening := time.Date(end.Year(), end.Month(), end.Day(), end.Hour(), end.Minute(), 0, 0, loc)
	if booked == nil || !booked.At.Equal(opening) {
		t.Fatalf("decisions %+v; want a booking at the opening %v", got, opening)
	}
	if v := metric(t, reg, "sluice_throttle_decisions_total", map[string]string{"rule": "quiet hours", "result": "booked"}); v != 1 {
		t.Fatalf("booked by quiet hours: %v", v)
	}
	if ds := b.sms.Deliveries(); len(ds) != 1 || ds[0].ID != otp.ID {
		t.Fatalf("deliveries %+v; only the default-category send may go", ds)
	}
}

// Bulk mail needs a List-Unsubscribe: without one it is archived unsent; a
// tenant's default unsubscribe target fills it in, with the one-click header.
func TestBulkMailNeedsUnsubscribe(t *testing.T) {
	t.Parallel()
	b := setup(t, "email:recipient=10/1m,email.news:bulk,acme/email.news:unsubscribe=https://acme.example/u/{id}")
	b.start(t, b.cfg)
	bare := tasks.NewEmail("beta", "ann@example.com", "News", "text")
	bare.Category = "news"
	b.enqueue(t, bare)
	ti := b.waitTask(t, bare.ID, 10*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateArchived })
	if !strings.Contains(ti.LastErr, "list_unsubscribe is required: category news is bulk mail") {
		t.Fatalf("archived with %q", ti.LastErr)
	}
	n := tasks.NewEmail("acme", "ann@example.com", "News", "text")
	n.Category = "news"
	b.enqueue(t, n)
	ds := b.smtp.WaitCount(t, 1, 10*time.Second)
	if got := ds[0].Header.Get("List-Unsubscribe"); got != "<https://acme.example/u/"+n.ID+">" {
		t.Fatalf("List-Unsubscribe %q", got)
	}
	if got := ds[0].Header.Get("List-Unsubscribe-Post"); got != "List-Unsubscribe=One-Click" {
		t.Fatalf("List-Unsubscribe-Post %q", got)
	}
}
