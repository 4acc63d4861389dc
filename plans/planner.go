package plans

import (
	"slices"
	"time"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// QuietHorizon is how far ahead a check lists quiet spans; a slot further
// out is planned again when its task wakes.
const QuietHorizon = 15 * 24 * time.Hour

// maxClosed is the most quiet spans one check hands the limiter.
const maxClosed = 64

// Planner works out, for one notification under one policy, what it is
// checked against: its rate limits, the spans its recipient's quiet hours
// close, and its deadline. The worker plans every check with it, and the
// quota report and the dashboard work out what they show with it, so the
// three agree (one zone fallback, one deadline rule).
type Planner struct {
	// DefaultZone is the zone of recipients whose zone nothing else tells
	// (SLUICE_DEFAULT_TZ); nil means UTC.
	DefaultZone *time.Location
	// SendSlack widens every window and must be left before a deadline
	// (SLUICE_SEND_SLACK).
	SendSlack time.Duration
}

// Check is what one notification is checked against.
type Check struct {
	Match Match
	// Limits are the rate rules bound to the notification's recipient and
	// origin, in Match.Rates order.
	Limits []throttle.Limit
	// Caps are the in-flight caps bound to the recipient and origin, in Match.Caps order.
	Caps []throttle.Cap
	// Zones are the recipient's candidate zones, when quiet hours apply.
	Zones []*time.Location
	// Closed are the spans quiet hours close from an hour before now to
	// QuietHorizon ahead, each starting SendSlack early (a send just before
	// one must not arrive inside it); at most 64.
	Closed []throttle.Interval
	// Deadline is the latest a send may reach the provider: the
	// notification's expires_at, or its enqueue time plus the category's
	// max-defer, whichever is earlier; zero when neither applies.
	Deadline time.Time
	// DeadlineBy names what set Deadline: "expires_at" or "max-defer".
	DeadlineBy string
}

// SendBy is the latest slot a send may take to reach the provider by the
// deadline (the deadline less the slack); zero when there is none.
func (pl Check) SendBy(slack time.Duration) time.Time {
	if pl.Deadline.IsZero() {
		return time.Time{}
	}
	return pl.Deadline.Add(-slack)
}

// Check works out what n is checked against under p at now. origin is who
// sender rules count as sending it (a From number, a Messaging Service, a
// From address).
func (pr Planner) Check(p Policy, n tasks.Notification, origin string, now time.Time) Check {
	m := p.Match(n.Tenant, n.Channel, n.Category)
	if n.User == "" {
		// A notification that names no person is not counted by user rules.
		m.Rates = slices.DeleteFunc(m.Rates, func(e Entry) bool { return e.Scope == ScopeUser })
	}
	pl := Check{Match: m}
	for _, e := range m.Rates {
		pl.Limits = append(pl.Limits, e.Limit(n.To, origin, n.User))
	}
	for _, e := range m.Caps {
		pl.Caps = append(pl.Caps, e.Cap(n.To, origin))
	}
	if !n.ExpiresAt.IsZero() {
		pl.Deadline, pl.DeadlineBy = n.ExpiresAt, "expires_at"
	}
	if m.MaxDefer > 0 && !n.EnqueuedAt.IsZero() {
		if d := n.EnqueuedAt.Add(m.MaxDefer); pl.Deadline.IsZero() || d.Before(pl.Deadline) {
			pl.Deadline, pl.DeadlineBy = d, "max-defer"
		}
	}
	if m.Quiet != nil {
		pl.Zones = pr.Zones(m, n)
		for _, s := range m.Quiet.ClosedFor(now.Add(-time.Hour), QuietHorizon, pl.Zones, phoneOf(n)) {
			if len(pl.Closed) == maxClosed {
				break
			}
			pl.Closed = append(pl.Closed, throttle.Interval{Start: s.Start.Add(-pr.SendSlack), End: s.End})
		}
	}
	return pl
}

// phoneOf is the number a preset reads the recipient's place from: an
// SMS's recipient; "" for email.
func phoneOf(n tasks.Notification) string {
	if n.Channel == tasks.SMS {
		return tasks.NormalizePhone(n.To)
	}
	return ""
}

// Zones are the recipient's candidate zones for quiet hours: the
// notification's tz, else the zones of its phone number's region, else the
// tenant's tz= rule, else the deployment's default zone.
func (pr Planner) Zones(m Match, n tasks.Notification) []*time.Location {
	fallback := pr.DefaultZone
	if fallback == nil {
		fallback = time.UTC
	}
	if m.Zone != "" {
		if zs, err := Zones(m.Zone, "", nil); err == nil {
			fallback = zs[0]
		}
	}
	phone := ""
	if n.Channel == tasks.SMS {
		phone = n.To
	}
	zones, err := Zones(n.TZ, phone, fallback)
	if err != nil {
		return []*time.Location{fallback}
	}
	return zones
}
