package worker_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/worker"
)

// Every deferral the worker hands Asynq starts with DeferredPrefix and
// reads back as what it is — the reason, the rule and the slot — through
// ReadTaskError, the one reader; the texts of earlier versions (no prefix)
// still read the same, and archive texts do not read as deferrals.
func TestTaskErrorRoundTrip(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 5, 4, 9, 12, 3, 114_000_000, time.FixedZone("CEST", 2*3600))
	for _, c := range []struct {
		err    error
		reason string
		rule   string
	}{
		{&worker.ThrottledError{RetryAt: at, Rule: "sms:recipient 1/1m"}, "throttled", "sms:recipient 1/1m"},
		{&worker.ThrottledError{RetryAt: at, Rule: "sms.marketing:tenant 1000/1h"}, "throttled", "sms.marketing:tenant 1000/1h"},
		{&worker.ThrottledError{RetryAt: at, Rule: "quiet hours"}, "quiet_hours", ""},
		{&worker.ThrottledError{RetryAt: at, Rule: "shutdown"}, "shutdown", ""},
		{&worker.ThrottledError{RetryAt: at, Rule: "late wake-ups"}, "throttled", "late wake-ups"},
		{&worker.UnavailableError{Err: errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")}, "unavailable", ""},
	} {
		msg := c.err.Error()
		if !strings.HasPrefix(msg, worker.DeferredPrefix) {
			t.Errorf("%q does not start with %q", msg, worker.DeferredPrefix)
		}
		for _, text := range []string{msg, strings.TrimPrefix(msg, worker.DeferredPrefix)} { // new, and as before
			got := worker.ReadTaskError(text, true)
			if !got.Deferred || got.Reason != c.reason || got.Rule != c.rule {
				t.Errorf("%q reads as %+v; want a deferral, reason %s, rule %q", text, got, c.reason, c.rule)
			}
			if _, throttled := c.err.(*worker.ThrottledError); throttled && !got.Until.Equal(at) {
				t.Errorf("%q: until %v, want %v", text, got.Until, at)
			}
		}
	}
	for msg, reason := range map[string]string{
		"expired: the earliest slot (2026-05-04T09:12:03Z, sms:recipient 1/1m) is past the expires_at deadline 2026-05-04T09:00:00Z: task skipped": worker.ReasonExpired,
		"throttled: sms.marketing:recipient 3/1d is full and drops what exceeds it: task skipped":                                                  "dropped",
		"invalid notification: list_unsubscribe is required: category news is bulk mail (email.news:bulk); give …: task skipped":                   worker.ReasonInvalid,
		"suppressed: an earlier SMS to this recipient failed permanently (provider code 21610); not sent: task skipped":                            worker.ReasonSuppressed,
		"smtp: 550 mailbox unavailable: task skipped": worker.ReasonPermanent,
	} {
		if got := worker.ReadTaskError(msg, false); got.Deferred || got.Reason != reason {
			t.Errorf("%q reads as %+v; want %s, not deferred", msg, got, reason)
		}
	}
	if got := worker.ReadTaskError("smtp: 451 try later", true); got.Deferred || got.Reason != "retry" {
		t.Errorf("a transient failure reads as %+v; want a retry, not a deferral", got)
	}
	if got := worker.ReadTaskError(worker.DeferredPrefix+"something new", true); !got.Deferred {
		t.Errorf("an unknown deferral reads as %+v", got)
	}
}

// FuzzReadTaskError: any text reads as some reason, and a rule it names is
// in the text.
func FuzzReadTaskError(f *testing.F) {
	for _, s := range []string{"throttled by sms:recipient 1/1m until 2026-01-02T03:04:05.678Z", "throttled by quiet hours until 2026-01-02T03:04:05Z",
		"expired: the earliest slot", "quota check unavailable, nothing sent: EOF", "throttled by x until y", "smtp 451",
		worker.DeferredPrefix + "throttled by sms:tenant 1000/1h until 2026-01-02T03:04:05Z", worker.DeferredPrefix} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, waiting := range []bool{true, false} {
			le := worker.ReadTaskError(s, waiting)
			if le.Reason == "" {
				t.Fatalf("%q: no reason", s)
			}
			if le.Rule != "" && !strings.Contains(s, le.Rule) {
				t.Fatalf("%q: rule %q is not in the message", s, le.Rule)
			}
		}
	})
}
