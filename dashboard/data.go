package dashboard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/report"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// Where the dashboard's figures come from:
//   - windows: report.Quotas, as `sluice quota show` and GET /v1/quotas;
//   - waiting messages, denials, drops and expiries: the tasks Asynq holds
//     (retry, scheduled, archived), their payloads opened to learn the
//     tenant and their LastErr read as GET /v1/notifications/{id} reads it.
//     The worker records nothing extra: a denial is a task waiting in the
//     retry set with "throttled by RULE until SLOT" and the time of the
//     denial (LastFailedAt); a drop or an expiry is an archived task.
//   - queue depths: Asynq's Inspector;
//   - the chart: the entries of the tenant's own window (each is a send),
//     counted per minute by throttle.Limiter.Series.

const (
	uiScanLimit   = 2000 // tasks read per state and page view
	uiScanPage    = 500
	uiListLen     = 25 // rows of each list of messages
	uiExpirySoon  = time.Hour
	uiMaxTenants  = 200
	uiChartMinute = time.Minute
	uiChartSpan   = time.Hour
)

// The states of a message the dashboard lists, in the words of
// GET /v1/notifications/{id}.
const (
	stateQueued   = "queued"   // waiting for a worker, nothing in its way
	stateWaiting  = "waiting"  // held back: a quota's slot, quiet hours, a retry, Redis away
	stateArchived = "archived" // will not be sent; Reason says why
)

// uiWindow is one quota window as the dashboard shows it.
type uiWindow struct {
	ID        string // scope:window-ms, names the window in a reset
	Channel   string
	Category  string
	Scope     string // sms:tenant, sms.otp:recipient, …
	Rule      string // 1000/1h
	Drop      bool
	Limit     int
	Used      int
	Remaining int
	Booked    int
	NextFree  time.Time
	ResetAt   time.Time
	Now       time.Time
	limit     throttle.Limit
}

// UsedPct and BookedPct are the widths of the bar's two parts, in percent.
func (w uiWindow) UsedPct() float64 { return min(100, 100*float64(w.Used)/float64(max(1, w.Limit))) }
func (w uiWindow) BookedPct() float64 {
	return min(100-w.UsedPct(), 100*float64(w.Booked)/float64(max(1, w.Limit)))
}

// Full: no room now.
func (w uiWindow) Full() bool { return w.Remaining == 0 }

func windowID(l throttle.Limit) string {
	id := l.Scope + ":" + strconv.FormatInt(l.Rule.Window.Milliseconds(), 10)
	if l.Rule.Counter() || l.Rule.Distinct { // "1d@America/New_York" → "-1d-America-New_York"
		id += "-" + strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
				return r
			}
			return '-'
		}, l.Rule.WindowString())
	}
	return id
}

func toWindows(rep report.QuotaReport, keep func(plans.Entry) bool, seen map[string]bool) []uiWindow {
	var out []uiWindow
	for _, r := range rep.Rows {
		if !keep(r.Rule) {
			continue
		}
		id := windowID(r.Limit)
		if seen[id] {
			continue
		}
		seen[id] = true
		out = append(out, uiWindow{ID: id, Channel: string(r.Channel), Category: r.Category, Scope: r.Limit.Scope,
			Rule: r.Limit.Rule.String(), Drop: r.Rule.Drop, Limit: r.Limit.Rule.Limit, Used: r.Used, Remaining: r.Remaining,
			Booked: r.Booked, NextFree: r.NextFree, ResetAt: r.ResetAt, Now: r.Now, limit: r.Limit})
	}
	return out
}

// tenantCategories are the categories with tenant-wide windows of their
// own for tenant, besides the default one.
func tenantCategories(p plans.Policy, tenant string) []string {
	cats := []string{""}
	for _, e := range p.Entries() {
		if e.Kind == plans.KindRate && e.Scope == plans.ScopeTenant && e.Category != "" && (e.Tenant == "" || e.Tenant == tenant) &&
			!slices.Contains(cats, e.Category) {
			cats = append(cats, e.Category)
		}
	}
	return cats
}

// tenantWindows reads the tenant-wide windows of tenant, every category.
func (u *Dashboard) tenantWindows(ctx context.Context, tenant string) ([]uiWindow, time.Time, error) {
	policy := u.b.Plans.Policy()
	seen := map[string]bool{}
	var out []uiWindow
	var now time.Time
	for _, cat := range tenantCategories(policy, tenant) {
		rep, err := report.Quotas(ctx, u.b.Limiter, policy, u.b.Settings, report.QuotaQuery{Tenant: tenant, Category: cat})
		if errors.Is(err, report.ErrNoRules) {
			continue
		}
		if err != nil {
			return nil, now, err
		}
		now = rep.Now
		out = append(out, toWindows(rep, func(e plans.Entry) bool { return e.Scope == plans.ScopeTenant }, seen)...)
	}
	if now.IsZero() {
		now = time.Now()
	}
	return out, now, nil
}

// uiPlan is a tenant's plan, or the defaults.
type uiPlan struct {
	Own     bool
	Plan    plans.Plan
	Rules   []string // the rate rules in force for the tenant
	History []plans.Change
}

func (u *Dashboard) tenantPlan(ctx context.Context, tenant string, history bool) (uiPlan, error) {
	var p uiPlan
	if u.b.Plans.Following() {
		for _, pl := range u.b.Plans.Current().Plans {
			if pl.Tenant == tenant {
				p.Own, p.Plan = true, pl
			}
		}
	} else {
		pl, err := u.b.PlanStore.Get(ctx, tenant)
		switch {
		case err == nil:
			p.Own, p.Plan = true, pl
		case !errors.Is(err, plans.ErrNoPlan):
			return p, err
		}
	}
	policy := u.b.Plans.Policy()
	for _, e := range policy.Entries() {
		if e.Tenant == "" || e.Tenant == tenant {
			if e.Tenant == "" && slices.ContainsFunc(policy.Entries(), func(o plans.Entry) bool { return o.Tenant == tenant && sameTarget(o, e) }) {
				continue // replaced by the tenant's own
			}
			e.Tenant = ""
			p.Rules = append(p.Rules, e.String())
		}
	}
	if history {
		hist, err := u.b.PlanStore.History(ctx, 200)
		if err != nil {
			return p, err
		}
		for _, c := range hist {
			if c.Tenant == tenant && len(p.History) < 5 {
				p.History = append(p.History, c)
			}
		}
	}
	return p, nil
}

// sameTarget mirrors plans' rule replacement: a tenant's entry replaces the
// default with the same kind and target.
func sameTarget(a, b plans.Entry) bool {
	if a.Kind != b.Kind || a.Channel != b.Channel || a.Category != b.Category {
		return false
	}
	if a.Kind == plans.KindRate {
		return a.Scope == b.Scope && a.Rule.Same(b.Rule)
	}
	return true
}

// uiTask is a notification Asynq holds, as the dashboard lists it: no
// recipient in clear, no content.
type uiTask struct {
	ID          string
	Tenant      string
	Channel     string
	Category    string
	To          string // masked
	State       string // queued, waiting, archived
	Reason      string
	Rule        string
	Slot        time.Time // the slot held or told, for a throttled one
	NextAttempt time.Time
	LastAt      time.Time // when the worker last handed it back (denial, archive)
	Deadline    time.Time // the latest slot it may still be sent at (the worker's: Check.SendBy); zero: never
	to          string    // normalised recipient, only compared in memory
}

// ExpiresSoon: waiting, and its deadline within uiExpirySoon (or past:
// the worker archives it as expired when it wakes).
func (t uiTask) ExpiresSoon(now time.Time) bool {
	return t.State == stateWaiting && !t.Deadline.IsZero() && t.Deadline.Sub(now) < uiExpirySoon
}

// uiScan is what one pass over the queue found.
type uiScan struct {
	Tasks      []uiTask
	Tenants    map[string]int // tenant → tasks held (every tenant seen)
	Scanned    int
	Truncated  bool // a state held more than uiScanLimit tasks
	Unreadable int  // payloads that did not open (not counted for any tenant)
}

// scanTasks reads the tasks Asynq holds for the queue — queued (in the
// tenants' waiting rooms, and pending), waiting (retry and scheduled) and
// archived, up to uiScanLimit of each — and keeps those of tenant (""
// keeps none, counting tenants only; "*" keeps all).
func (u *Dashboard) scanTasks(ctx context.Context, tenant string) (uiScan, error) {
	sc := uiScan{Tenants: map[string]int{}}
	s := scanning{u: u, sc: &sc, tenant: tenant, policy: u.b.Plans.Policy(), now: time.Now()}
	queues := u.b.Settings.Layout().Queues()
	if tenant != "" && tenant != "*" {
		queues = u.b.Settings.Layout().Candidates(tenant, s.policy.Pins())
	}
	exist, err := u.b.Queues.Queues()
	if err != nil {
		return sc, fmt.Errorf("dashboard: queues: %w", err)
	}
	queues = slices.DeleteFunc(queues, func(q string) bool { return !slices.Contains(exist, q) })
	left := uiScanLimit
	for _, q := range queues {
		groups := []string{tenant}
		if tenant == "" || tenant == "*" {
			gs, err := u.b.Queues.Groups(q)
			if err != nil {
				return sc, fmt.Errorf("dashboard: waiting rooms of %s: %w", q, err)
			}
			groups = groups[:0]
			for _, g := range gs {
				groups = append(groups, g.Group)
			}
		}
		for _, g := range groups {
			list := func(q string, opts ...asynq.ListOption) ([]*asynq.TaskInfo, error) {
				return u.b.Queues.ListAggregatingTasks(q, g, opts...)
			}
			if err := s.pages(ctx, q, stateQueued, list, &left); err != nil {
				return sc, err
			}
		}
	}
	for _, l := range []struct {
		state string
		list  func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error)
	}{
		{stateQueued, u.b.Queues.ListPendingTasks},
		{stateWaiting, u.b.Queues.ListRetryTasks},
		{stateWaiting, u.b.Queues.ListScheduledTasks},
		{stateArchived, u.b.Queues.ListArchivedTasks},
	} {
		left := uiScanLimit // tasks of this state read, over every queue
		for _, q := range queues {
			if err := s.pages(ctx, q, l.state, l.list, &left); err != nil {
				return sc, err
			}
		}
	}
	return sc, nil
}

// scanning is one pass of scanTasks.
type scanning struct {
	u      *Dashboard
	sc     *uiScan
	tenant string
	policy plans.Policy
	now    time.Time
}

// pages reads the tasks list gives of queue q, page by page, while left
// (the tasks of this state still to read) lasts.
func (s scanning) pages(ctx context.Context, q, state string, list func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error), left *int) error {
	for page := 1; ; page++ {
		if *left <= 0 {
			s.sc.Truncated = true
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		infos, err := list(q, asynq.PageSize(uiScanPage), asynq.Page(page))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("dashboard: list %s tasks of %s: %w", state, q, err)
		}
		full := len(infos) == uiScanPage
		if len(infos) > *left {
			infos, s.sc.Truncated = infos[:*left], true
		}
		*left -= len(infos)
		for _, info := range infos {
			s.sc.Scanned++
			n, err := tasks.Open(s.u.b.Keys, info.ID, info.Type, info.Payload, s.u.b.Settings.PayloadPlaintext == "accept")
			if err != nil {
				s.sc.Unreadable++
				continue
			}
			s.sc.Tenants[n.Tenant]++
			if s.tenant == "" || (s.tenant != "*" && n.Tenant != s.tenant) {
				continue
			}
			s.sc.Tasks = append(s.sc.Tasks, s.u.uiTaskOf(s.policy, s.now, state, info, n))
		}
		if !full {
			return nil
		}
	}
}

// uiTaskOf is how the dashboard lists a task. Its deadline is the one the
// worker holds its send to: the shared planner's (expires_at, or the
// category's max-defer), less SLUICE_SEND_SLACK.
func (u *Dashboard) uiTaskOf(policy plans.Policy, now time.Time, state string, info *asynq.TaskInfo, n tasks.Notification) uiTask {
	n = n.Normalized()
	t := uiTask{ID: n.ID, Tenant: n.Tenant, Channel: string(n.Channel), Category: n.CategoryOrDefault(), To: tasks.Mask(n.To),
		State: state, LastAt: info.LastFailedAt, NextAttempt: info.NextProcessAt, to: n.To}
	if !t.LastAt.IsZero() {
		t.LastAt = t.LastAt.UTC()
	}
	switch state {
	case stateWaiting:
		if info.LastErr == "" {
			t.Reason = "scheduled" // enqueued to be sent later
			break
		}
		le := tasks.ReadTaskError(info.LastErr, true)
		t.Reason, t.Rule, t.Slot = le.Reason, le.Rule, le.Until
	case stateArchived:
		t.Reason = tasks.ReadTaskError(info.LastErr, false).Reason
	}
	t.Deadline = u.planner.Check(policy, n, u.b.Settings.Origin(n), now).SendBy(u.planner.SendSlack)
	return t
}

// uiReason counts the messages waiting for one reason (and rule).
type uiReason struct {
	Reason string
	Rule   string
	Count  int
	Next   time.Time // the earliest slot or next attempt among them
}

// uiActivity is a tenant's messages in the queue, summed up.
type uiActivity struct {
	Queued      int
	Waiting     int
	Archived    int
	ExpiringIn  time.Duration // uiExpirySoon, for the page's wording
	Reasons     []uiReason
	ExpiresSoon []uiTask // waiting, deadline within uiExpirySoon, soonest first
	Denials     []uiTask // waiting after a denial (a rule or quiet hours), newest denial first
	Lost        []uiTask // dropped or expired, newest first
	OtherLost   []uiTask // archived for another reason (invalid, permanent, …), newest first
	WaitingList []uiTask // every waiting message, next due first
	Scanned     int
	Truncated   bool
	ShowTenant  bool // the lists name each message's tenant (the admin's overview)
}

func summarize(sc uiScan, now time.Time) uiActivity {
	a := uiActivity{ExpiringIn: uiExpirySoon, Scanned: sc.Scanned, Truncated: sc.Truncated}
	reasons := map[[2]string]*uiReason{}
	for _, t := range sc.Tasks {
		switch t.State {
		case stateQueued:
			a.Queued++
		case stateWaiting:
			a.Waiting++
			k := [2]string{t.Reason, t.Rule}
			r := reasons[k]
			if r == nil {
				r = &uiReason{Reason: t.Reason, Rule: t.Rule}
				reasons[k] = r
			}
			r.Count++
			if due := t.due(); !due.IsZero() && (r.Next.IsZero() || due.Before(r.Next)) {
				r.Next = due
			}
			a.WaitingList = append(a.WaitingList, t)
			if t.ExpiresSoon(now) {
				a.ExpiresSoon = append(a.ExpiresSoon, t)
			}
			if t.Reason == "throttled" || t.Reason == "quiet_hours" {
				a.Denials = append(a.Denials, t)
			}
		case stateArchived:
			a.Archived++
			if t.Reason == "dropped" || t.Reason == "expired" {
				a.Lost = append(a.Lost, t)
			} else {
				a.OtherLost = append(a.OtherLost, t)
			}
		}
	}
	for _, r := range reasons {
		a.Reasons = append(a.Reasons, *r)
	}
	slices.SortFunc(a.Reasons, func(x, y uiReason) int {
		return cmp.Or(cmp.Compare(y.Count, x.Count), strings.Compare(x.Reason, y.Reason), strings.Compare(x.Rule, y.Rule))
	})
	newest := func(x, y uiTask) int { return cmp.Or(y.LastAt.Compare(x.LastAt), strings.Compare(x.ID, y.ID)) }
	slices.SortFunc(a.Denials, newest)
	slices.SortFunc(a.Lost, newest)
	slices.SortFunc(a.OtherLost, newest)
	slices.SortFunc(a.ExpiresSoon, func(x, y uiTask) int { return cmp.Or(x.Deadline.Compare(y.Deadline), strings.Compare(x.ID, y.ID)) })
	slices.SortFunc(a.WaitingList, func(x, y uiTask) int { return cmp.Or(x.due().Compare(y.due()), strings.Compare(x.ID, y.ID)) })
	a.Denials = head(a.Denials, uiListLen)
	a.Lost = head(a.Lost, uiListLen)
	a.OtherLost = head(a.OtherLost, uiListLen)
	a.ExpiresSoon = head(a.ExpiresSoon, uiListLen)
	a.WaitingList = head(a.WaitingList, uiListLen)
	return a
}

// due is when a waiting message should go: its slot, else its next attempt.
func (t uiTask) due() time.Time {
	if !t.Slot.IsZero() {
		return t.Slot
	}
	return t.NextAttempt
}

func head[T any](s []T, n int) []T {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// uiQueue is one Asynq queue's depths, or a lane's (its shards summed).
type uiQueue struct {
	Name                                                            string
	Lane                                                            string // a lane's row: its name; else ""
	Shards                                                          int    // a lane's row: its shards (busy ones are listed after it)
	Waiting, Pending, Active, Scheduled, Retry, Archived, Completed int
	Latency                                                         time.Duration
	Paused                                                          bool
	ProcessedToday, FailedToday                                     int
}

func (q *uiQueue) add(info *asynq.QueueInfo) {
	q.Waiting, q.Pending, q.Active = q.Waiting+info.Aggregating, q.Pending+info.Pending, q.Active+info.Active
	q.Scheduled, q.Retry = q.Scheduled+info.Scheduled, q.Retry+info.Retry
	q.Archived, q.Completed = q.Archived+info.Archived, q.Completed+info.Completed
	q.ProcessedToday, q.FailedToday = q.ProcessedToday+info.Processed, q.FailedToday+info.Failed
	q.Latency, q.Paused = max(q.Latency, info.Latency), q.Paused || info.Paused
}

func (q uiQueue) Busy() bool { return q.Waiting+q.Pending+q.Active+q.Scheduled+q.Retry+q.Archived > 0 }

// queueDepths lists each lane (its shards summed), after it the shards that
// hold work, then the legacy queue and any other queue Asynq knows.
func (u *Dashboard) queueDepths() ([]uiQueue, error) {
	names, err := u.b.Queues.Queues()
	if err != nil {
		return nil, fmt.Errorf("dashboard: queues: %w", err)
	}
	slices.Sort(names)
	layout := u.b.Settings.Layout()
	lanes := map[tasks.Lane]*uiQueue{}
	shards := map[tasks.Lane][]uiQueue{}
	var others []uiQueue
	for _, q := range names {
		info, err := u.b.Queues.GetQueueInfo(q)
		if err != nil {
			return nil, fmt.Errorf("dashboard: queue %s: %w", q, err)
		}
		row := uiQueue{Name: q}
		row.add(info)
		lane, _, ok := layout.Parse(q)
		if !ok {
			others = append(others, row)
			continue
		}
		if lanes[lane] == nil {
			lanes[lane] = &uiQueue{Name: string(lane) + " lane", Lane: string(lane), Shards: layout.Shards}
		}
		lanes[lane].add(info)
		if row.Busy() {
			shards[lane] = append(shards[lane], row)
		}
	}
	var out []uiQueue
	for _, lane := range tasks.Lanes {
		l := lanes[lane]
		if l == nil {
			l = &uiQueue{Name: string(lane) + " lane", Lane: string(lane), Shards: layout.Shards}
		}
		out = append(out, *l)
		out = append(out, shards[lane]...)
	}
	return append(out, others...), nil
}

// knownTenants: tenants with a plan, named in the rules, holding a token,
// or with tasks in the queue (seen), sorted, at most uiMaxTenants. more
// reports a longer list, or a token scan that stopped at its budget.
func (u *Dashboard) knownTenants(ctx context.Context, seen map[string]int) (tenants []string, more bool, err error) {
	set := map[string]bool{}
	for _, p := range u.b.Plans.Current().Plans {
		set[p.Tenant] = true
	}
	for _, e := range u.b.Plans.Policy().Entries() {
		if e.Tenant != "" {
			set[e.Tenant] = true
		}
	}
	for t := range seen {
		set[t] = true
	}
	withTokens, more, err := u.b.Auth.Tenants(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("dashboard: tenants with tokens: %w", err)
	}
	for _, t := range withTokens {
		set[t] = true
	}
	tenants = make([]string, 0, len(set))
	for t := range set {
		tenants = append(tenants, t)
	}
	slices.Sort(tenants)
	if len(tenants) > uiMaxTenants {
		return tenants[:uiMaxTenants], true, nil
	}
	return tenants, more, nil
}

// uiChart is a channel's sends per minute over the last hour and how the
// current window of its longest tenant-wide rule filled, both counted from
// that window's entries.
type uiChart struct {
	Channel string
	Now     time.Time
	Counts  []int // sends per minute, oldest first; the last minute ends now
	// InWindow is, at the end of each minute, how many of the sends that
	// count in the window now had been made; -1 before the window began.
	InWindow []int
	Rule     throttle.Rule   // the rule whose window is counted (the longest)
	Others   []throttle.Rule // the channel's other tenant-wide rules
	Used     int
	Booked   int // slots booked after now
	Total    int // sends in the hour
	Peak     int // most sends in one minute
}

// chartData reads tenant's tenant-wide window of ch with the longest span
// (throttle.Series): its entries are the sends (admissions) and, after
// now, booked slots; members are hashed ids, nothing personal.
func (u *Dashboard) chartData(ctx context.Context, tenant string, ch tasks.Channel) (uiChart, bool, error) {
	c := uiChart{Channel: string(ch)}
	rates := u.b.Plans.Policy().Match(tenant, ch, "").Rates
	var longest plans.Entry
	for _, e := range rates {
		if e.Scope == plans.ScopeTenant && e.Rule.Window > longest.Rule.Window {
			longest = e
		}
	}
	if longest.Rule.Window == 0 {
		return c, false, nil
	}
	for _, e := range rates {
		if e.Scope == plans.ScopeTenant && e.Rule != longest.Rule {
			c.Others = append(c.Others, e.Rule)
		}
	}
	c.Rule = longest.Rule
	s, err := u.b.Limiter.Series(ctx, tenant, longest.Limit("", "", ""), uiChartSpan, uiChartMinute)
	if err != nil {
		return c, false, fmt.Errorf("dashboard: chart: %w", err)
	}
	c.Now, c.Counts, c.InWindow = s.Now, s.Counts, s.InWindow
	c.Used, c.Booked, c.Total, c.Peak = s.Used, s.Booked, s.Total(), s.Peak()
	return c, true, nil
}
