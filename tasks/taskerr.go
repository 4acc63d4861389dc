package tasks

import (
	"errors"
	"strings"
	"time"
)

// Why a worker archived a notification unsent: the reason of
// sluice_archived_total{reason}, of an archived task's error text, and of
// GET /v1/notifications/{id}.
const (
	ReasonInvalid    = "invalid"         // bad input: never sendable as it is
	ReasonUnreadable = "unreadable"      // the payload did not open (keys, or not sealed)
	ReasonUnknown    = "outcome_unknown" // an earlier attempt may have sent it (at-most-once)
	ReasonExpired    = "expired"         // its earliest slot is past its deadline
	ReasonThrottled  = "throttled"       // a drop rule was full (reported as "dropped")
	ReasonPermanent  = "permanent"       // the provider refused it for good
	ReasonBudget     = "retry_budget"    // transient failures used up its retries
	ReasonSuppressed = "suppressed"      // the recipient is on the tenant's suppression list
	ReasonTemplate   = "template"        // the tenant's digest template passed a limit of its box
	ReasonWindow     = "outside_window"  // a free-form WhatsApp message, its recipient's service window closed
)

// Why a task waits without a failure (TaskError.Reason of a deferral).
const (
	DeferThrottled   = "throttled"   // a rate rule sets its slot
	DeferQuiet       = "quiet_hours" // its recipient's quiet hours
	DeferShutdown    = "shutdown"    // a slot given back when the worker stopped
	DeferUnavailable = "unavailable" // Redis could not be asked
	DeferRetry       = "retry"       // a real failure, tried again
)

// DeferredPrefix starts the error text of every task a worker hands back to
// Asynq without a failure: a send waiting for its slot (a rate rule, quiet
// hours, a slot given back at shutdown or after a late wake-up) or for
// Redis to answer. Asynq v0.26 has no state for "scheduled again by the
// handler": such a task sits in the Retry list (asynqmon's Retry tab) with
// its LastErr and LastFailedAt set, beside real failures — but its Retried
// count does not grow and the queue's failed counters do not count it. The
// prefix is what tells it from a failure there, at a glance and by filter
// (strings.HasPrefix(info.LastErr, tasks.DeferredPrefix)).
const DeferredPrefix = "deferred, not a failure: "

// archivedPrefix starts the error text of a task a worker archived unsent:
// "archived, <reason>: <what happened>".
const archivedPrefix = "archived, "

// ThrottledText is a deferral's error text: the rule (or "quiet hours",
// "shutdown", "late wake-ups") that sets the slot, and the slot.
func ThrottledText(rule string, until time.Time) string {
	return DeferredPrefix + "throttled by " + rule + " until " + until.Format(time.RFC3339Nano)
}

// UnavailableText is the error text of a task that waits for Redis.
func UnavailableText(cause string) string {
	return DeferredPrefix + "quota check unavailable, nothing sent: " + cause
}

// ArchivedError is what a worker returns for a notification it archives
// unsent: its text names the reason, which ReadTaskError reads back.
type ArchivedError struct {
	Reason string
	Err    error
}

// Archived returns the ArchivedError of reason with err as what happened.
func Archived(reason string, err error) *ArchivedError {
	return &ArchivedError{Reason: reason, Err: err}
}

func (e *ArchivedError) Error() string { return archivedPrefix + e.Reason + ": " + e.Err.Error() }
func (e *ArchivedError) Unwrap() error { return e.Err }

// TaskError is what a worker's error text on an Asynq task (TaskInfo's
// LastErr) says, read back by ReadTaskError.
type TaskError struct {
	// Deferred: the task waits and nothing failed.
	Deferred bool
	// Reason: for a waiting task a Defer* reason; for an archived one a
	// Reason* (ReasonThrottled reads as "dropped").
	Reason string
	// Rule is the rule that set the slot ("sms:recipient 1/1m"), for throttled.
	Rule string
	// Until is the slot the worker was told, for a deferral; zero if unknown.
	Until time.Time
}

// ReadTaskError classifies a worker's error text on a task. waiting is true
// for a task Asynq holds for another attempt (retry or scheduled), false
// for an archived one. It reads the texts of this version and of earlier
// ones (before the prefixes).
func ReadTaskError(msg string, waiting bool) TaskError {
	if rest, ok := strings.CutPrefix(msg, archivedPrefix); ok {
		reason, _, _ := strings.Cut(rest, ":")
		if reason == ReasonThrottled {
			reason = "dropped"
		}
		return TaskError{Reason: reason}
	}
	rest, deferred := strings.CutPrefix(msg, DeferredPrefix)
	if r, ok := strings.CutPrefix(rest, "throttled by "); ok {
		te := TaskError{Deferred: true, Reason: DeferThrottled, Rule: r}
		if i := strings.LastIndex(r, " until "); i >= 0 {
			te.Rule = r[:i]
			if t, err := time.Parse(time.RFC3339Nano, r[i+len(" until "):]); err == nil {
				te.Until = t.UTC()
			}
		}
		switch te.Rule {
		case "quiet hours":
			te.Reason, te.Rule = DeferQuiet, ""
		case "shutdown":
			te.Reason, te.Rule = DeferShutdown, ""
		}
		return te
	}
	if strings.HasPrefix(rest, "quota check unavailable") {
		return TaskError{Deferred: true, Reason: DeferUnavailable}
	}
	if deferred { // a deferral this version does not know
		return TaskError{Deferred: true, Reason: DeferRetry}
	}
	// The texts of releases before archivedPrefix.
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
		return TaskError{Reason: DeferRetry}
	}
	return TaskError{Reason: ReasonPermanent}
}

// IsArchived reports whether err is (or wraps) an ArchivedError, and its reason.
func IsArchived(err error) (string, bool) {
	var ae *ArchivedError
	if errors.As(err, &ae) {
		return ae.Reason, true
	}
	return "", false
}
