package worker

import (
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// check is what the limiter is asked for one notification.
type check struct {
	plans.Check
	opts throttle.ReserveOptions
	// digestItem: checked as a digest's item (no booking, no wait in
	// process; worker/digest.go): it carries no digest.
	digestItem bool
}

// plan works out the rules, quiet hours and deadline of a notification
// under the policy p (one consistent version for the whole check), with
// the planner every reader shares, and the limiter options they give.
func (w *Worker) plan(p plans.Policy, n tasks.Notification) check {
	c := check{Check: w.planner.Check(p, n, w.cfg.Origin(n), time.Now()), opts: w.reserveOptions()}
	switch c.Match.Rerun {
	case plans.AtMostOnce:
		c.opts.Policy = throttle.AtMostOnce
	case plans.AtLeastOnce:
		c.opts.Policy = throttle.AtLeastOnce
	}
	c.opts.StateTTL = w.dedupeTTL(c.Limits)
	c.opts.Deadline = c.SendBy(w.cfg.SendSlack) // the send must reach the provider by the deadline
	c.opts.Closed = c.Closed
	c.opts.Consent = w.consentCheck(p, n)
	// The provider's and its sender's holds are bound when the provider is
	// picked (bindProvider).
	return c
}

// Provider back-pressure: a hold without a Retry-After lasts holdBase,
// doubling with each hold that follows another, up to holdMax.
const (
	holdBase = time.Second
	holdMax  = time.Minute
)

// dedupeTTL: how long a notification's record lives — at least the longest
// window it counts in, so an unfinished attempt is known while it counts.
func (w *Worker) dedupeTTL(limits []throttle.Limit) time.Duration {
	ttl := w.cfg.DedupeTTL
	for _, l := range limits {
		ttl = max(ttl, l.Rule.Window+w.cfg.SendSlack)
	}
	return ttl
}
