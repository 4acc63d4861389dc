package worker

import (
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// quietHorizon is how far ahead quiet hours are handed to the limiter; a
// slot further out is checked again when its task wakes.
const quietHorizon = 15 * 24 * time.Hour

// check is what the limiter is asked for one notification.
type check struct {
	match  plans.Match
	limits []throttle.Limit
	opts   throttle.ReserveOptions
	// deadline is the latest moment a send may reach the provider: the
	// notification's expiry, or its enqueue time plus the maximum deferral.
	deadline time.Time
	reason   string // what set the deadline: "expires_at" or "max-defer"
}

// sender is the effective origin of a notification, what sender rules
// count: its own, else the worker's default. An SMS through a Messaging
// Service is sent by the service (SMSOrigin): the provider picks the
// number from its pool, so the pool is the sender Sluice can know.
func (w *Worker) sender(n tasks.Notification) string {
	if n.Channel == tasks.SMS {
		_, origin := SMSOrigin(n, w.cfg.SMSFrom, w.cfg.SMSMessagingServiceSID)
		return origin
	}
	if n.From != "" {
		return n.From
	}
	return w.cfg.SMTPFrom
}

// plan works out the rules, quiet hours and deadline of a notification
// under the policy p (one consistent version for the whole check).
func (w *Worker) plan(p plans.Policy, n tasks.Notification) check {
	m := p.Match(n.Tenant, n.Channel, n.Category)
	c := check{match: m, opts: w.reserveOptions()}
	for _, e := range m.Rates {
		c.limits = append(c.limits, e.Limit(n.To, w.sender(n)))
	}
	switch m.Rerun {
	case plans.AtMostOnce:
		c.opts.Policy = throttle.AtMostOnce
	case plans.AtLeastOnce:
		c.opts.Policy = throttle.AtLeastOnce
	}
	c.opts.StateTTL = w.dedupeTTL(c.limits)
	if !n.ExpiresAt.IsZero() {
		c.deadline, c.reason = n.ExpiresAt, "expires_at"
	}
	if m.MaxDefer > 0 && !n.EnqueuedAt.IsZero() {
		if d := n.EnqueuedAt.Add(m.MaxDefer); c.deadline.IsZero() || d.Before(c.deadline) {
			c.deadline, c.reason = d, "max-defer"
		}
	}
	if !c.deadline.IsZero() {
		// The send must reach the provider by then: leave it the slack.
		c.opts.Deadline = c.deadline.Add(-w.cfg.SendSlack)
	}
	if m.Quiet != nil {
		c.opts.Closed = w.quietSpans(*m.Quiet, n, m.Zone)
	}
	return c
}

// quietSpans are the spans of the next days in which the recipient's local
// time is quiet in any candidate zone, widened by the send slack so that a
// send made just before a span does not arrive inside it.
func (w *Worker) quietSpans(q plans.QuietHours, n tasks.Notification, tenantZone string) []throttle.Interval {
	fallback := w.defaultZone
	if tenantZone != "" {
		if zs, err := plans.Zones(tenantZone, "", nil); err == nil {
			fallback = zs[0]
		}
	}
	phone := ""
	if n.Channel == tasks.SMS {
		phone = n.To
	}
	zones, err := plans.Zones(n.TZ, phone, fallback)
	if err != nil {
		zones = []*time.Location{fallback}
	}
	spans := q.Closed(time.Now().Add(-time.Hour), quietHorizon, zones)
	out := make([]throttle.Interval, 0, len(spans))
	for _, s := range spans {
		out = append(out, throttle.Interval{Start: s.Start.Add(-w.cfg.SendSlack), End: s.End})
	}
	if len(out) > 64 {
		out = out[:64]
	}
	return out
}

// dedupeTTL: how long a notification's record lives — at least the longest
// window it counts in, so an unfinished attempt is known while it counts.
func (w *Worker) dedupeTTL(limits []throttle.Limit) time.Duration {
	ttl := w.cfg.DedupeTTL
	for _, l := range limits {
		ttl = max(ttl, l.Rule.Window+w.cfg.SendSlack)
	}
	return ttl
}
