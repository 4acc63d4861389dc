package tasks_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/tasks"
)

// A fallback is checked with its notification: another channel, a valid
// recipient (and subject) there, an id with room for ".fb", After within
// bounds and for SMS only; producers cannot set the fields Sluice sets.
// FallbackOf carries the tenant, category, person and expiry over.
func TestFallbackValidation(t *testing.T) {
	sms := tasks.NewSMS("acme", "+14155550100", "code 1234")
	sms.Category, sms.User = "otp", "u-1"
	sms.Fallback = &tasks.Fallback{Channel: tasks.Email, To: "Jane@Example.com", Subject: "Your code", After: tasks.Duration(2 * time.Minute)}
	if err := sms.Normalized().Validate(); err != nil {
		t.Fatalf("a good fallback: %v", err)
	}
	fb := tasks.FallbackOf(sms.Normalized())
	if fb.ID != sms.ID+".fb" || fb.Channel != tasks.Email || fb.To != "jane@example.com" || fb.Body != sms.Body ||
		fb.Category != "otp" || fb.User != "u-1" || fb.FallbackFor != sms.ID || !fb.FallbackOnTimeout || fb.Fallback != nil {
		t.Fatalf("FallbackOf: %+v", fb)
	}
	if err := fb.Validate(); err != nil {
		t.Fatalf("the fallback itself: %v", err)
	}
	for name, change := range map[string]func(n *tasks.Notification){
		"fallback.channel":                   func(n *tasks.Notification) { n.Fallback.Channel = tasks.SMS },
		"fallback.to":                        func(n *tasks.Notification) { n.Fallback.To = "" },
		"subject":                            func(n *tasks.Notification) { n.Fallback.Subject = "" },
		"fallback.after":                     func(n *tasks.Notification) { n.Fallback.After = tasks.Duration(25 * time.Hour) },
		"fallback_for":                       func(n *tasks.Notification) { n.FallbackFor = "other" },
		"id":                                 func(n *tasks.Notification) { n.ID = strings.Repeat("a", 62) },
		"fallback: invalid notification: to": func(n *tasks.Notification) { n.Fallback.To = "not an address" },
	} {
		n := sms
		f := *sms.Fallback
		n.Fallback = &f
		change(&n)
		err := n.Normalized().Validate()
		if !errors.Is(err, tasks.ErrInvalid) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v", name, err)
		}
	}
	mail := tasks.NewEmail("acme", "jane@example.com", "Hi", "hello")
	mail.Fallback = &tasks.Fallback{Channel: tasks.SMS, To: "+14155550100", After: tasks.Duration(time.Minute)}
	if err := mail.Validate(); err == nil || !strings.Contains(err.Error(), "SMS and WhatsApp only") {
		t.Errorf("an email's fallback with After: %v", err)
	}
	mail.Fallback.After = 0
	if err := mail.Validate(); err != nil {
		t.Errorf("an email's fallback on failure: %v", err)
	}
	wa := tasks.NewWhatsAppTemplate("acme", "+14155550100", "order_shipped", "")
	wa.Fallback = &tasks.Fallback{Channel: tasks.SMS, To: "+14155550100", After: tasks.Duration(time.Minute)}
	if err := wa.Validate(); err == nil || !strings.Contains(err.Error(), "body") {
		t.Errorf("a template's SMS fallback without its own body: %v, want body named", err)
	}
	wa.Fallback.Body = "Your order shipped"
	if err := wa.Validate(); err != nil {
		t.Errorf("a WhatsApp template's SMS fallback after a minute: %v", err)
	}
	// JSON: After as Go writes a duration.
	var n tasks.Notification
	if err := json.Unmarshal([]byte(`{"fallback":{"channel":"email","to":"a@b.co","after":"90s"}}`), &n); err != nil || time.Duration(n.Fallback.After) != 90*time.Second {
		t.Fatalf("after 90s: %+v, %v", n.Fallback, err)
	}
	if err := json.Unmarshal([]byte(`{"fallback":{"after":"soon"}}`), &n); !errors.Is(err, tasks.ErrInvalid) {
		t.Fatalf("after soon: %v", err)
	}
	b, _ := json.Marshal(tasks.Fallback{Channel: tasks.Email, To: "a@b.co", After: tasks.Duration(time.Minute)})
	if !strings.Contains(string(b), `"after":"1m0s"`) {
		t.Fatalf("marshalled: %s", b)
	}
}
