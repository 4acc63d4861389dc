package twilio_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/sender/twilio"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
)

// Throttling answers hold a scope: 429 and Twilio 20429 the provider, 30001
// (queue overflow) the sender; Retry-After is kept; a 503 holds nothing.
func TestThrottlingAnswers(t *testing.T) {
	t.Parallel()
	f := fakes.NewSMSAPI(t)
	s, err := twilio.NewSender(twilio.Config{BaseURL: f.URL, AccountSID: f.AccountSID, AuthToken: f.AuthToken, From: "+15005550006"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		code      int
		ra        string
		throttled bool
		hold      string
		after     time.Duration
	}{
		{429, "5", true, sender.HoldProvider, 5 * time.Second},
		{20429, "", true, sender.HoldProvider, 0},
		{30001, "2", true, sender.HoldSender, 2 * time.Second},
		{503, "1", false, "", time.Second},
		{21211, "", false, "", 0},
	} {
		f.SetReply(func(string, string) (int, string) { return c.code, c.ra })
		err := s.Send(context.Background(), tasks.NewSMS("acme", "+14155550100", "hi"))
		var se *sender.SendError
		if !errors.As(err, &se) || se.Throttled != c.throttled || se.Hold != c.hold || se.RetryAfter != c.after || (c.throttled && !se.NotSent) {
			t.Errorf("answer %d: %+v", c.code, se)
		}
	}
}
