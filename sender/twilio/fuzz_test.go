package twilio

import (
	"net/url"
	"testing"

	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/tasks"
)

// Any form parses into a status callback or named problems, never a panic.
func FuzzParseStatusCallback(f *testing.F) {
	for _, s := range []string{"MessageStatus=delivered&MessageSid=SM1&To=%2B14155550100", "MessageStatus=undelivered&ErrorCode=30007", "MessageStatus=sent&MessageStatus=sent",
		"ErrorCode=00030007&MessageStatus=failed", "MessageStatus=read&To=whatsapp%3A%2B1", "", "MessageStatus=%ff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		form, err := url.ParseQuery(body)
		if err != nil {
			return
		}
		cb, bad := parseStatusCallback(form)
		if len(bad) > 0 {
			for _, p := range bad {
				if p.Name == "" || p.Reason == "" {
					t.Fatalf("%q: unnamed problem %+v", body, p)
				}
			}
			return
		}
		if _, err := delivery.ParseStatus(string(cb.Status)); err != nil {
			t.Fatalf("%q: status %q", body, cb.Status)
		}
		if cb.ErrorCode < 0 || cb.ErrorCode > delivery.MaxErrorCode || delivery.CheckSID(cb.MessageSID) != nil {
			t.Fatalf("%q: %+v", body, cb)
		}
		if cb.To != "" && !tasks.IsE164(cb.To) {
			t.Fatalf("%q: To %q", body, cb.To)
		}
	})
}
