package smtp_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/sender/smtp"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
)

// A hard bounce — any 5xx to RCPT TO, or 550, 551, 553 at the end of DATA —
// comes back as a permanent SendError that asks the worker to mark the
// address undeliverable, with the reply code; a 554 at the end of DATA (the
// content, the sender) and every 4xx do not. Both ways of sending are
// checked: go-mail's, and the raw transaction a DKIM signature needs.
func TestHardBounces(t *testing.T) {
	t.Parallel()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, signed := range []bool{false, true} {
		srv := fakes.NewSMTPServer(t)
		cfg := smtp.Config{Host: srv.Host, Port: srv.Port, TLS: "none", From: "sluice@example.com", Timeout: 5 * time.Second}
		if signed {
			cfg.DKIM = &smtp.DKIMConfig{Domain: "example.com", Selector: "s1", Key: key}
		}
		s, err := smtp.NewSender(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for _, tc := range []struct {
			rcpt, data int
			permanent  bool
			suppress   bool
			code       int
		}{
			{rcpt: 550, permanent: true, suppress: true, code: 550},
			{rcpt: 553, permanent: true, suppress: true, code: 553},
			{rcpt: 451},
			{data: 550, permanent: true, suppress: true, code: 550},
			{data: 554, permanent: true, code: 554},
			{data: 452},
		} {
			srv.SetRcptReply(func(string) int { return tc.rcpt })
			srv.SetReply(func(string, string) (int, string) { return tc.data, "" })
			n := tasks.NewEmail("acme", "gone@example.net", "hi", "body")
			err := s.Send(context.Background(), n)
			var se *sender.SendError
			if !errors.As(err, &se) {
				t.Fatalf("signed %v, RCPT %d DATA %d: %v, want a SendError", signed, tc.rcpt, tc.data, err)
			}
			if se.Permanent != tc.permanent || se.Suppress != tc.suppress || (tc.suppress && se.Code != tc.code) || !se.NotSent {
				t.Errorf("signed %v, RCPT %d DATA %d: permanent %v suppress %v code %d not sent %v; want %v %v %d true",
					signed, tc.rcpt, tc.data, se.Permanent, se.Suppress, se.Code, se.NotSent, tc.permanent, tc.suppress, tc.code)
			}
		}
		if n := len(srv.Deliveries()); n != 0 {
			t.Fatalf("%d messages delivered through refusals", n)
		}
	}
}
