// Package report is the read model of quotas: what `sluice quota show`,
// GET /v1/quotas and the dashboard print about a tenant's windows and a
// recipient's quiet hours, read from the limiter without writing, and its
// JSON form. It plans with the same plans.Planner as the worker.
package report

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// ErrNoRules reports a quota query that no rule applies to.
var ErrNoRules = errors.New("no rules apply")

// QuotaQuery selects the windows a quota report covers.
type QuotaQuery struct {
	Tenant string
	// Channel is email, sms or whatsapp; empty: all.
	Channel tasks.Channel
	// Category selects category rules; empty: the default category.
	Category string
	// Recipient adds the recipient's windows (and quiet hours); empty:
	// tenant-wide and shared windows only.
	Recipient string
	// From is the sender of sender rules; empty: the configured default.
	From string
	// User adds the person's windows (user rules); empty: none.
	User string
}

// QuotaRow is one window's state.
type QuotaRow struct {
	Channel  tasks.Channel
	Category string
	Rule     plans.Entry
	throttle.Usage
}

// QuietRow is the quiet-hours state of the recipient on a channel.
type QuietRow struct {
	Channel  tasks.Channel
	Category string
	Hours    plans.QuietHours
	Zones    []string
	Quiet    bool      // quiet now in at least one candidate zone
	Until    time.Time // when the current quiet span ends (Quiet), else when the next one starts
}

// QuotaReport is what `sluice quota show` and the API's quota endpoint print.
type QuotaReport struct {
	Rows  []QuotaRow
	Quiet []QuietRow
	Now   time.Time
}

// Settings are what a report needs of the deployment's: the planner (zones,
// slack) and the default origins of sender rules.
type Settings interface {
	Planner() plans.Planner
	Origin(n tasks.Notification) string
}

// Quotas reads the windows and quiet hours that apply to q under policy.
// It writes nothing.
func Quotas(ctx context.Context, lim *throttle.Limiter, policy plans.Policy, cfg Settings, q QuotaQuery) (QuotaReport, error) {
	planner := cfg.Planner()
	if err := tasks.CheckTenant(q.Tenant); err != nil {
		return QuotaReport{}, err
	}
	channels := []tasks.Channel{tasks.Email, tasks.SMS, tasks.WhatsApp}
	if q.Channel != "" {
		if _, err := q.Channel.TaskType(); err != nil {
			return QuotaReport{}, err
		}
		channels = []tasks.Channel{q.Channel}
	}
	if q.Category != "" {
		if err := tasks.CheckCategory(q.Category); err != nil {
			return QuotaReport{}, err
		}
	}
	var rep QuotaReport
	var limits []throttle.Limit
	var rows []QuotaRow
	shown := map[string]bool{} // a user rule of every channel ('*') is one window: one row
	for _, ch := range channels {
		n := tasks.Notification{Tenant: q.Tenant, Channel: ch, To: q.Recipient, From: q.From, Category: q.Category, User: q.User}.Normalized()
		from := cfg.Origin(n)
		m := policy.Match(q.Tenant, ch, q.Category)
		for _, e := range m.Rates {
			if (e.Scope == plans.ScopeRecipient && n.To == "") || (e.Scope == plans.ScopeSender && from == "") || (e.Scope == plans.ScopeUser && n.User == "") {
				continue
			}
			rowCh := ch
			if e.Channel == plans.AnyChannel {
				if shown[e.String()] {
					continue
				}
				shown[e.String()], rowCh = true, plans.AnyChannel
			}
			limits = append(limits, e.Limit(n.To, from, n.User))
			rows = append(rows, QuotaRow{Channel: rowCh, Category: n.CategoryOrDefault(), Rule: e})
		}
		if m.Quiet != nil && n.To != "" {
			rep.Quiet = append(rep.Quiet, quietRow(planner, m, n))
		}
	}
	if len(limits) == 0 && len(rep.Quiet) == 0 {
		return QuotaReport{}, fmt.Errorf("%w: tenant-wide rules need SLUICE_RULES, recipient rules a recipient, sender rules a sender, user rules a user", ErrNoRules)
	}
	rep.Now = time.Now()
	if len(limits) > 0 {
		us, err := lim.Usage(ctx, q.Tenant, planner.SendSlack, limits...)
		if err != nil {
			return QuotaReport{}, err
		}
		for i := range rows {
			rows[i].Usage = us[i]
		}
		rep.Rows, rep.Now = rows, us[0].Now
	}
	return rep, nil
}

func quietRow(planner plans.Planner, m plans.Match, n tasks.Notification) QuietRow {
	zones := planner.Zones(m, n)
	r := QuietRow{Channel: n.Channel, Category: n.CategoryOrDefault(), Hours: *m.Quiet}
	for _, z := range zones {
		r.Zones = append(r.Zones, z.String())
	}
	now := time.Now()
	phone := ""
	if n.Channel == tasks.SMS {
		phone = tasks.NormalizePhone(n.To)
	}
	for _, s := range m.Quiet.ClosedFor(now, 8*24*time.Hour, zones, phone) {
		if s.Contains(now) {
			r.Quiet, r.Until = true, s.End
			break
		}
		if s.Start.After(now) {
			r.Until = s.Start
			break
		}
	}
	return r
}

// QuotaJSON is a QuotaReport as `sluice quota show --json` and the API print it.
type QuotaJSON struct {
	Now     time.Time         `json:"now"`
	Windows []QuotaWindowJSON `json:"windows"`
	Quiet   []QuietJSON       `json:"quiet,omitempty"`
}

// QuotaWindowJSON is one window.
type QuotaWindowJSON struct {
	Channel   string    `json:"channel"`
	Category  string    `json:"category"`
	Scope     string    `json:"scope"`
	Rule      string    `json:"rule"`
	Action    string    `json:"action"`
	Limit     int       `json:"limit"`
	Window    string    `json:"window"`
	Used      int       `json:"used"`
	Remaining int       `json:"remaining"`
	Booked    int       `json:"booked"`
	Oldest    time.Time `json:"oldest,omitzero"`
	NextFree  time.Time `json:"next_free"`
	ResetAt   time.Time `json:"reset_at"`
}

// QuietJSON is the quiet-hours state of the recipient on a channel.
type QuietJSON struct {
	Channel  string    `json:"channel"`
	Category string    `json:"category"`
	Hours    string    `json:"hours"`
	Zones    []string  `json:"zones"`
	Quiet    bool      `json:"quiet_now"`
	Until    time.Time `json:"until,omitzero"`
}

// JSON returns the report in its JSON form.
func (r QuotaReport) JSON() QuotaJSON {
	out := QuotaJSON{Now: r.Now.UTC(), Windows: []QuotaWindowJSON{}}
	for _, w := range r.Rows {
		action := "defer"
		if w.Rule.Drop {
			action = "drop"
		}
		out.Windows = append(out.Windows, QuotaWindowJSON{Channel: string(w.Channel), Category: w.Category, Scope: w.Limit.Scope,
			Rule: w.Limit.Rule.String(), Action: action, Limit: w.Limit.Rule.Limit, Window: w.Limit.Rule.WindowString(),
			Used: w.Used, Remaining: w.Remaining, Booked: w.Booked, Oldest: w.Oldest.UTC(), NextFree: w.NextFree.UTC(), ResetAt: w.ResetAt.UTC()})
	}
	for _, q := range r.Quiet {
		out.Quiet = append(out.Quiet, QuietJSON{Channel: string(q.Channel), Category: q.Category, Hours: q.Hours.String(), Zones: q.Zones, Quiet: q.Quiet, Until: q.Until.UTC()})
	}
	return out
}
