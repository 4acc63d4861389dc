package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// enqueue enqueues one notification, failing the test on error.
func (e *env) enqueue(n tasks.Notification) {
	e.t.Helper()
	if _, err := tasks.Enqueue(context.Background(), e.client, e.keys, n); err != nil {
		e.t.Fatal(err)
	}
}

// (a) 200 marketing SMS to one number, then 5 OTPs: each OTP arrives within
// 2 s of its enqueue, while every marketing receipt keeps the marketing caps.
func TestOTPPassesMarketingBacklog(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=100/1m,sms.marketing:recipient=2/5s,sms.marketing:recipient=4/1m,sms.otp:exempt,sms.otp:recipient=10/1h")
	e.worker("w0", nil)
	e.worker("w1", nil)
	const to = "+14155550900"
	category := map[string]string{}
	for i := 0; i < 200; i++ {
		n := tasks.NewSMS("acme", to, fmt.Sprintf("sale %d", i))
		n.Category = "marketing"
		category[n.ID] = "marketing"
		e.enqueue(n)
	}
	e.sms.WaitCount(t, 2, 30*time.Second) // marketing has started going out
	enqueued := map[string]time.Time{}
	for i := 0; i < 5; i++ {
		n := tasks.NewSMS("acme", to, fmt.Sprintf("your code %d", i))
		n.Category = "otp"
		category[n.ID] = "otp"
		enqueued[n.ID] = time.Now()
		e.enqueue(n)
	}
	ds := e.sms.WaitFor(t, 30*time.Second, "the 5 OTPs", func(ds []fakes.Delivery) bool {
		n := 0
		for _, d := range ds {
			if category[d.ID] == "otp" {
				n++
			}
		}
		return n == 5
	})
	var worst time.Duration
	for _, d := range ds {
		if at, ok := enqueued[d.ID]; ok {
			worst = max(worst, d.At.Sub(at))
		}
	}
	var marketing []fakes.Delivery
	for _, d := range e.sms.Deliveries() {
		if category[d.ID] == "marketing" {
			marketing = append(marketing, d)
		}
	}
	r1 := audit(marketing, 2, 5*time.Second, byRecipient)
	r2 := audit(marketing, 4, time.Minute, byRecipient)
	t.Logf("5 OTPs behind 200 marketing: slowest OTP %v after its enqueue; %d marketing receipts so far, violations %d/%d", worst.Round(time.Millisecond), len(marketing), r1.violations, r2.violations)
	if worst > 2*time.Second {
		t.Fatalf("an OTP took %v from enqueue to the provider; want ≤ 2 s", worst)
	}
	if r1.violations+r2.violations != 0 {
		t.Fatalf("marketing cap exceeded: %s %s", r1.worst, r2.worst)
	}
}

// (b) Quiet hours around now in the recipient's zone: nothing of the
// category arrives inside the span, everything arrives after it, and the
// opening drains at the rate rule's pace instead of bursting.
func TestQuietHoursHoldUntilOpening(t *testing.T) {
	t.Parallel()
	loc, err := time.LoadLocation("Asia/Kolkata") // a half-hour zone
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().In(loc)
	start := now.Truncate(time.Minute)
	end := start.Add(time.Minute)
	if time.Until(end) < 20*time.Second {
		end = end.Add(time.Minute) // leave time to enqueue inside the span
	}
	rules := fmt.Sprintf("sms:recipient=100/1m,sms.promo:recipient=2/5s,sms.promo:quiet=%s-%s", start.Format("15:04"), end.Format("15:04"))
	e := newEnv(t, rules)
	e.worker("w0", nil)
	e.worker("w1", nil)
	ids := map[string]string{}
	for i := 0; i < 10; i++ {
		n := tasks.NewSMS("acme", fmt.Sprintf("+1415555%04d", 910+i%2), fmt.Sprintf("promo %d", i))
		n.Category, n.TZ = "promo", "Asia/Kolkata"
		ids[n.ID] = n.To
		e.enqueue(n)
	}
	control := tasks.NewSMS("acme", "+14155550999", "not promo")
	e.enqueue(control) // the default category has no quiet hours
	ds := e.waitAllDelivered(ids, end.Sub(time.Now())+time.Minute)
	for _, d := range ds {
		if _, promo := ids[d.ID]; promo && d.At.Before(end) {
			t.Fatalf("a promo arrived at %v, inside the quiet span ending %v", d.At.In(loc).Format("15:04:05.000"), end.Format("15:04:05"))
		}
	}
	var promos []fakes.Delivery
	controlAt := time.Time{}
	for _, d := range ds {
		if _, ok := ids[d.ID]; ok {
			promos = append(promos, d)
		} else if d.ID == control.ID {
			controlAt = d.At
		}
	}
	if controlAt.IsZero() || !controlAt.Before(end) {
		t.Fatalf("the default-category send waited for the promo's quiet hours (arrived %v)", controlAt)
	}
	r := audit(promos, 2, 5*time.Second, byRecipient)
	t.Logf("quiet until %s IST: first promo %v after the opening, last %v after; %d receipts, %d violations",
		end.Format("15:04"), promos[0].At.Sub(end).Round(time.Millisecond), promos[len(promos)-1].At.Sub(end).Round(time.Millisecond), r.receipts, r.violations)
	if r.violations != 0 || r.duplicates != 0 {
		t.Fatalf("the opening burst past the rate rule: %s (%d repeats)", r.worst, r.duplicates)
	}
}

// (c) A notification whose slot would be past its expires_at is never
// received: it is archived at once with reason expired.
func TestExpiredIsNeverSent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=1/1h")
	e.worker("w0", nil)
	first := tasks.NewSMS("acme", "+14155550920", "takes the hour")
	e.enqueue(first)
	e.sms.WaitCount(t, 1, 30*time.Second)
	var expiring []string
	for i := 0; i < 3; i++ {
		n := tasks.NewSMS("acme", "+14155550920", fmt.Sprintf("code %d", i))
		n.ExpiresAt = time.Now().Add(30 * time.Second)
		expiring = append(expiring, n.ID)
		e.enqueue(n)
	}
	type found struct {
		Task *asynq.TaskInfo
		Err  error
	}
	for _, id := range expiring {
		// Asynq has no completion signal to wait on.
		f := sluicetest.EventuallyValueEvery(t, 20*time.Second, 50*time.Millisecond, id+" archived as expired", func() (found, bool) {
			ti, err := tasks.DefaultLayout.FindTask(e.insp, "", nil, id)
			return found{ti, err}, err == nil && ti.State == asynq.TaskStateArchived
		})
		if !strings.Contains(f.Task.LastErr, "expired") {
			t.Fatalf("%s archived with %q", id, f.Task.LastErr)
		}
	}
	if n := len(e.sms.Deliveries()); n != 1 {
		t.Fatalf("%d receipts; the expiring ones must never arrive", n)
	}
}

// (d) A sender rule of 1 per second over a 50-message backlog to many
// recipients of several tenants: the provider never sees two messages of
// one sender within a second, and the backlog drains close to the ideal,
// one send per window plus the send slack after the first.
func TestSenderRuleDrainsABacklog(t *testing.T) {
	t.Parallel()
	// A send slack of 400 ms, not the harness's 150 ms: 100 consecutive
	// pairs under the whole suite's load on 2 cores have seen a worker
	// process or the provider's handler stalled by more than 150 ms between
	// two sends (2 receipts 892 ms and 833 ms apart, once each). The slack
	// is the stated tolerance: sends are kept window + slack apart, and the
	// rule holds at the provider while send latency varies by less.
	const n, slack = 50, 400 * time.Millisecond
	e := newEnv(t, "sms:sender=1/1s,sms:recipient=10/1m")
	extra := map[string]string{"SLUICE_SEND_SLACK": slack.String()}
	e.worker("w0", extra)
	e.worker("w1", extra)
	ids := map[string]string{}
	for i := 0; i < n; i++ {
		m := tasks.NewSMS(fmt.Sprintf("tenant-%d", i%4), fmt.Sprintf("+1415555%04d", 1000+i), "hello")
		ids[m.ID] = m.To
		e.enqueue(m)
	}
	ds := e.waitAllDelivered(ids, 3*time.Minute)
	r := audit(ds, 1, time.Second, func(fakes.Delivery) string { return "+15005550006" })
	closest := time.Duration(1<<63 - 1)
	for i := 1; i < len(ds); i++ {
		closest = min(closest, ds[i].At.Sub(ds[i-1].At))
	}
	drain := ds[len(ds)-1].At.Sub(ds[0].At)
	ideal := (n - 1) * (time.Second + slack)
	t.Logf("%d sends of one sender at 1/1s, slack %v: drained in %v, %.3f× the ideal %v; closest pair %v; %d receipts, %d violations",
		n, slack, drain.Round(time.Millisecond), drain.Seconds()/ideal.Seconds(), ideal, closest.Round(time.Millisecond), r.receipts, r.violations)
	if r.violations != 0 || r.duplicates != 0 {
		t.Fatalf("sender rule exceeded at the provider: %s (%d repeats)", r.worst, r.duplicates)
	}
	if drain > ideal*11/10 {
		t.Fatalf("drained in %v, over 1.1× the ideal %v", drain, ideal)
	}
}
