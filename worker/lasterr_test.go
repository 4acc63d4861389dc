package worker_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/tasks"
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
		if !strings.HasPrefix(msg, tasks.DeferredPrefix) {
			t.Errorf("%q does not start with %q", msg, tasks.DeferredPrefix)
		}
		for _, text := range []string{msg, strings.TrimPrefix(msg, tasks.DeferredPrefix)} { // new, and as before
			got := tasks.ReadTaskError(text, true)
			if !got.Deferred || got.Reason != c.reason || got.Rule != c.rule {
				t.Errorf("%q reads as %+v; want a deferral, reason %s, rule %q", text, got, c.reason, c.rule)
			}
			if _, throttled := c.err.(*worker.ThrottledError); throttled && !got.Until.Equal(at) {
				t.Errorf("%q: until %v, want %v", text, got.Until, at)
			}
		}
	}
	for msg, reason := range map[string]string{
		"expired: the earliest slot (2026-05-04T09:12:03Z, sms:recipient 1/1m) is past the expires_at deadline 2026-05-04T09:00:00Z: task skipped": tasks.ReasonExpired,
		"throttled: sms.marketing:recipient 3/1d is full and drops what exceeds it: task skipped":                                                  "dropped",
		"invalid notification: list_unsubscribe is required: category news is bulk mail (email.news:bulk); give …: task skipped":                   tasks.ReasonInvalid,
		"suppressed: an earlier SMS to this recipient failed permanently (provider code 21610); not sent: task skipped":                            tasks.ReasonSuppressed,
		"smtp: 550 mailbox unavailable: task skipped": tasks.ReasonPermanent,
	} {
		if got := tasks.ReadTaskError(msg, false); got.Deferred || got.Reason != reason {
			t.Errorf("%q reads as %+v; want %s, not deferred", msg, got, reason)
		}
	}
	if got := tasks.ReadTaskError("smtp: 451 try later", true); got.Deferred || got.Reason != "retry" {
		t.Errorf("a transient failure reads as %+v; want a retry, not a deferral", got)
	}
	if got := tasks.ReadTaskError(tasks.DeferredPrefix+"something new", true); !got.Deferred {
		t.Errorf("an unknown deferral reads as %+v", got)
	}
}
