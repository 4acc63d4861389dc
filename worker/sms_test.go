package worker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/report"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/sender/twilio"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/throttle"
)

const (
	serviceA = "MG0123456789abcdef0123456789abcdef"
	serviceB = "MGfedcba9876543210fedcba9876543210"
)

// An SMS through a Messaging Service reaches the provider with
// MessagingServiceSid and no From — the configured service, or the
// notification's own — while a notification's own from still goes from that
// number; each asks for its status callback under the configured base.
func TestSMSThroughMessagingService(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=5/1m")
	cfg := b.cfg
	cfg.SMSFrom, cfg.SMSMessagingServiceSID = "", serviceA
	cfg = withEnv(cfg, "SLUICE_SMS_STATUS_CALLBACK_URL", "https://sluice.example.com/")
	b.start(t, cfg)
	def := tasks.NewSMS("acme", "+14155550180", "through the default service")
	own := tasks.NewSMS("acme", "+14155550181", "through its own service")
	own.MessagingServiceSID = serviceB
	num := tasks.NewSMS("acme", "+14155550182", "from a number")
	num.From = "+15005550009"
	for _, n := range []tasks.Notification{def, own, num} {
		b.enqueue(t, n)
	}
	ds := b.sms.WaitCount(t, 3, 10*time.Second)
	byID := map[string]fakes.Delivery{}
	for _, d := range ds {
		byID[d.ID] = d
	}
	for _, c := range []struct {
		n             tasks.Notification
		service, from string
	}{{def, serviceA, ""}, {own, serviceB, ""}, {num, "", "+15005550009"}} {
		d := byID[c.n.ID]
		if d.MessagingServiceSID != c.service || d.From != c.from || d.Form.Has("From") != (c.from != "") || d.Form.Has("MessagingServiceSid") != (c.service != "") {
			t.Errorf("%s: the provider got MessagingServiceSid %q, From %q (form %v); want %q, %q", c.n.Body, d.MessagingServiceSID, d.From, d.Form, c.service, c.from)
		}
		if want := "https://sluice.example.com/v1/callbacks/sms/acme/" + c.n.ID; d.StatusCallback != want {
			t.Errorf("%s: StatusCallback %q, want %q", c.n.Body, d.StatusCallback, want)
		}
	}
}

// Sender rules count a Messaging Service as the sender: two messages
// through one service wait for each other whatever their recipients, one
// through another service does not.
func TestSenderRuleCountsTheMessagingService(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:sender=1/1h,sms:recipient=5/1m")
	cfg := b.cfg
	cfg.SMSFrom, cfg.SMSMessagingServiceSID = "", serviceA
	b.start(t, cfg)
	first := tasks.NewSMS("acme", "+14155550183", "service A, first")
	b.enqueue(t, first)
	b.sms.WaitCount(t, 1, 10*time.Second)
	second := tasks.NewSMS("globex", "+14155550184", "service A, second")
	other := tasks.NewSMS("acme", "+14155550185", "service B")
	other.MessagingServiceSID = serviceB
	b.enqueue(t, second)
	b.enqueue(t, other)
	ds := b.sms.WaitCount(t, 2, 10*time.Second)
	if ds[1].ID != other.ID {
		t.Fatalf("second delivery %s (%s); want the one through service B", ds[1].ID, ds[1].Body)
	}
	ti := b.waitTask(t, second.ID, 10*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateRetry })
	if !strings.HasPrefix(ti.LastErr, tasks.DeferredPrefix+"throttled by sms:sender 1/1h") {
		t.Fatalf("the second message through service A waits with %q; want the sender rule", ti.LastErr)
	}
	// What Asynq's Inspector (and asynqmon's Retry tab) shows of a deferral:
	// the marker, no retry spent, and the reader's view of it.
	if te := tasks.ReadTaskError(ti.LastErr, true); ti.Retried != 0 || !te.Deferred || te.Reason != "throttled" || te.Rule != "sms:sender 1/1h" {
		t.Fatalf("a deferral reads as %+v with %d retries; want a deferral by sms:sender 1/1h, no retry spent", te, ti.Retried)
	}
	// The quota report's default sender is the configured service too.
	lim, err := throttle.New(b.rdb, throttle.Options{Secret: []byte(cfg.SubjectSecret), CompactMembers: cfg.CompactMembers})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	policy, err := plans.Parse(cfg.Rules)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := report.Quotas(context.Background(), lim, policy, cfg, report.QuotaQuery{Tenant: "acme", Channel: tasks.SMS})
	if err != nil {
		t.Fatal(err)
	}
	senders := 0
	for _, row := range rep.Rows {
		if row.Rule.Scope == plans.ScopeSender {
			senders++
			if row.Used != 1 || row.Booked != 1 {
				t.Fatalf("quota of the default sender (service A): used %d, booked %d; want 1 and 1", row.Used, row.Booked)
			}
		}
	}
	if senders != 1 {
		t.Fatalf("%d sender rows in %+v", senders, rep.Rows)
	}
}

// A provider's refusal keeps its error code (Twilio's JSON "code"), and is
// permanent and not sent.
func TestSMSErrorCode(t *testing.T) {
	t.Parallel()
	f := fakes.NewSMSAPI(t)
	s, err := twilio.NewSender(twilio.Config{BaseURL: f.URL, AccountSID: f.AccountSID, AuthToken: f.AuthToken, From: "+15005550006"})
	if err != nil {
		t.Fatal(err)
	}
	f.SetReply(func(string, string) (int, string) { return 21211, "" })
	err = s.Send(context.Background(), tasks.NewSMS("acme", "+14155550186", "hi"))
	var se *sender.SendError
	if !errors.As(err, &se) || !se.Permanent || !se.NotSent || se.Code != 21211 {
		t.Fatalf("Send = %#v; want a permanent, unsent SendError with code 21211", err)
	}
	f.SetReply(func(string, string) (int, string) { return 500, "" })
	if err = s.Send(context.Background(), tasks.NewSMS("acme", "+14155550186", "hi")); !errors.As(err, &se) || se.Code != 0 || se.Permanent {
		t.Fatalf("Send = %#v; want a transient SendError without a code", err)
	}
}

// A provider's permanent refusal with a code of SLUICE_SMS_SUPPRESS_CODES
// puts the recipient on the tenant's suppression list: the next SMS to it
// is archived (reason suppressed) before the limiter, without reaching the
// provider, while other recipients and other tenants are sent to. With the
// list off, the next SMS is tried.
func TestPermanentFailureSuppressesTheRecipient(t *testing.T) {
	t.Parallel()
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "On", false: "Off"}[on], func(t *testing.T) {
			t.Parallel()
			b := setup(t, "sms:recipient=5/1m")
			cfg := b.cfg
			if !on {
				cfg.SMSSuppressCodes = nil // SMS_SUPPRESS_CODES=none
			}
			r := b.start(t, cfg)
			const bad = "+14155550190"
			b.sms.SetReply(func(to, _ string) (int, string) {
				if to == bad {
					return 21211, ""
				}
				return 0, ""
			})
			first := tasks.NewSMS("acme", bad, "first")
			b.enqueue(t, first)
			ti := b.waitTask(t, first.ID, 10*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateArchived })
			if !strings.Contains(ti.LastErr, `"code":21211`) {
				t.Fatalf("first archived with %q", ti.LastErr)
			}
			second := tasks.NewSMS("acme", "+1 415 555 0190", "second")
			b.enqueue(t, second)
			ti = b.waitTask(t, second.ID, 10*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateArchived })
			te := tasks.ReadTaskError(ti.LastErr, false)
			if got := te.Reason == tasks.ReasonSuppressed && strings.Contains(ti.LastErr, "the recipient is undeliverable since ") && strings.Contains(ti.LastErr, "(code 21211)"); got != on {
				t.Fatalf("second archived with %q; suppression on: %v", ti.LastErr, on)
			}
			if want := map[bool]int{true: 1, false: 2}[on]; b.sms.Attempts() != want {
				t.Fatalf("%d attempts at the provider, want %d", b.sms.Attempts(), want)
			}
			other := tasks.NewSMS("acme", "+14155550191", "another number")
			globex := tasks.NewSMS("globex", bad, "another tenant")
			b.sms.SetReply(nil)
			b.enqueue(t, other)
			b.enqueue(t, globex)
			b.sms.WaitCount(t, 2, 10*time.Second)
			if v := metric(t, r.reg, "sluice_archived_total", map[string]string{"reason": "suppressed"}); v != map[bool]float64{true: 1, false: 0}[on] {
				t.Fatalf("archived as suppressed: %v", v)
			}
		})
	}
}
