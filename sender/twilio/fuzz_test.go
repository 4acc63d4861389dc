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

// Any incoming-message form parses into a message Sluice can act on (an
// E.164 From, bounded fields) or named problems, never a panic.
func FuzzParseInbound(f *testing.F) {
	for _, s := range []string{"From=%2B14155550100&To=%2B15005550006&Body=STOP&MessageSid=SM1", "From=%2B1&Body=stop", "Body=START",
		"From=%2B14155550100&From=%2B14155550101", "From=whatsapp%3A%2B14155550100&Body=HELP", "MessageSid=SM%21&From=%2B14155550100", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		form, err := url.ParseQuery(body)
		if err != nil {
			return
		}
		m, bad := parseInbound(form)
		if len(bad) > 0 {
			for _, p := range bad {
				if p.Name == "" || p.Reason == "" {
					t.Fatalf("%q: unnamed problem %+v", body, p)
				}
			}
			return
		}
		if !tasks.IsE164(m.From) || len(m.To) > 64 || len(m.Body) > 1600 || delivery.CheckSID(m.MessageSID) != nil {
			t.Fatalf("%q: %+v", body, m)
		}
	})
}
