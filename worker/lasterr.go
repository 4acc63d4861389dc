package worker

import (
	"strings"
	"time"
)

// DeferredPrefix starts the error text of every task the worker hands back
// to Asynq without a failure: a send waiting for its slot (a rate rule,
// quiet hours, a slot given back at shutdown or after a late wake-up) or
// for Redis to answer. Asynq v0.26 has no state for "scheduled again by the
// handler": such a task sits in the Retry list (asynqmon's Retry tab) with
// its LastErr and LastFailedAt set, beside real failures — but its Retried
// count does not grow and the queue's failed counters do not count it. The
// prefix is what tells it from a failure there, at a glance and by filter
// (strings.HasPrefix(info.LastErr, worker.DeferredPrefix)). The handler
// cannot set a task header for the retry, nor move the task to the
// Scheduled list without losing its id, in Asynq v0.26.
const DeferredPrefix = "deferred, not a failure: "

// TaskError is what the worker's error text on an Asynq task (TaskInfo's
// LastErr) says, read back by ReadTaskError.
type TaskError struct {
	// Deferred: the task waits and nothing failed (DeferredPrefix, or a
	// text from before the prefix that means the same).
	Deferred bool
	// Reason for a waiting task: throttled, quiet_hours, shutdown,
	// unavailable, retry (a real failure, retried); for an archived one:
	// expired, dropped, outcome_unknown, invalid, unreadable, suppressed,
	// retry_budget, permanent.
	Reason string
	// Rule is the rule that set the slot ("sms:recipient 1/1m"), for throttled.
	Rule string
	// Until is the slot the worker was told, for a deferral; zero if unknown.
	Until time.Time
}

// ReadTaskError classifies the worker's error text on a task. waiting is
// true for a task Asynq holds for another attempt (retry or scheduled),
// false for an archived one. It reads the texts of this version and of
// earlier ones (before DeferredPrefix).
func ReadTaskError(msg string, waiting bool) TaskError {
	rest, deferred := strings.CutPrefix(msg, DeferredPrefix)
	if r, ok := strings.CutPrefix(rest, "throttled by "); ok {
		te := TaskError{Deferred: true, Reason: "throttled", Rule: r}
		if i := strings.LastIndex(r, " until "); i >= 0 {
			te.Rule = r[:i]
			if t, err := time.Parse(time.RFC3339Nano, r[i+len(" until "):]); err == nil {
				te.Until = t.UTC()
			}
		}
		switch te.Rule {
		case "quiet hours":
			te.Reason, te.Rule = "quiet_hours", ""
		case "shutdown":
			te.Reason, te.Rule = "shutdown", ""
		}
		return te
	}
	if strings.HasPrefix(rest, "quota check unavailable") {
		return TaskError{Deferred: true, Reason: "unavailable"}
	}
	if deferred { // a deferral this version does not know
		return TaskError{Deferred: true, Reason: "retry"}
	}
	switch {
	case strings.HasPrefix(msg, "expired:"):
		return TaskError{Reason: ReasonExpired}
	case strings.HasPrefix(msg, "throttled:"):
		return TaskError{Reason: "dropped"}
	case strings.HasPrefix(msg, "outcome of an earlier attempt unknown"):
		return TaskError{Reason: ReasonUnknown}
	case strings.Contains(msg, "sealed payload does not open"), strings.Contains(msg, "payload is not sealed"):
		return TaskError{Reason: ReasonUnreadable}
	case strings.HasPrefix(msg, "suppressed:"):
		return TaskError{Reason: ReasonSuppressed}
	case strings.HasPrefix(msg, "invalid notification"):
		return TaskError{Reason: ReasonInvalid}
	case strings.Contains(msg, "retry budget of"):
		return TaskError{Reason: ReasonBudget}
	}
	if waiting {
		return TaskError{Reason: "retry"}
	}
	return TaskError{Reason: ReasonPermanent}
}
