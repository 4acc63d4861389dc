package dashboard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/digest"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/report"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// uiTenantRow is one tenant of the overview.
type uiTenantRow struct {
	Tenant  string
	Plan    uiPlan
	Windows []uiWindow
	Held    int // tasks in the queue
}

type uiOverview struct {
	Now        time.Time
	Tenants    []uiTenantRow
	More       bool
	Queues     []uiQueue
	Activity   uiActivity // every tenant's
	Unreadable int
	// Down are the providers marked down (their breakers open or waiting
	// for a probe: docs/channels.md, "Failover").
	Down []throttle.ProviderDown
}

// overview is the admin's page: every tenant with its plan and tenant-wide
// windows, the queues, and what waits or was lost across tenants. A tenant
// is sent to its own page.
func (u *Dashboard) overview(w http.ResponseWriter, r *http.Request) {
	s := sessionOf(r)
	if !s.Admin {
		http.Redirect(w, r, "/ui/tenants/"+s.Tenant, http.StatusSeeOther)
		return
	}
	ctx := r.Context()
	sc, err := u.scanTasks(ctx, "*")
	if err != nil {
		u.unavailable(w, r, err)
		return
	}
	v, err := u.overviewData(ctx, sc.Tenants)
	if err != nil {
		u.unavailable(w, r, err)
		return
	}
	v.Activity = summarize(sc, time.Now())
	v.Activity.ShowTenant = true
	v.Unreadable = sc.Unreadable
	if v.Queues, err = u.queueDepths(); err != nil {
		u.unavailable(w, r, err)
		return
	}
	if v.Down, err = u.b.Limiter.OpenBreakers(ctx); err != nil {
		u.unavailable(w, r, err)
		return
	}
	u.renderTitled(w, r, http.StatusOK, "overview", "All tenants", "/ui/live", v)
}

func (u *Dashboard) overviewData(ctx context.Context, held map[string]int) (uiOverview, error) {
	tenants, more, err := u.knownTenants(ctx, held)
	if err != nil {
		return uiOverview{}, err
	}
	return u.tenantRows(ctx, tenants, more, held)
}

// tenantRows reads the plan and tenant-wide windows of each tenant.
func (u *Dashboard) tenantRows(ctx context.Context, tenants []string, more bool, held map[string]int) (uiOverview, error) {
	v := uiOverview{More: more, Now: time.Now()}
	for _, t := range tenants {
		ws, now, err := u.tenantWindows(ctx, t)
		if err != nil {
			return v, err
		}
		p, err := u.tenantPlan(ctx, t, false)
		if err != nil {
			return v, err
		}
		v.Now = now
		v.Tenants = append(v.Tenants, uiTenantRow{Tenant: t, Plan: p, Windows: ws, Held: held[t]})
	}
	return v, nil
}

// openTenant sends the admin's "open a tenant" form to its page.
func (u *Dashboard) openTenant(w http.ResponseWriter, r *http.Request) {
	t := strings.TrimSpace(r.URL.Query().Get("tenant"))
	if err := tasks.CheckTenant(t); err != nil {
		u.fail(w, r, http.StatusBadRequest, "A tenant id is 1–64 of A–Z, a–z, 0–9, '.', '_' and '-'.")
		return
	}
	http.Redirect(w, r, "/ui/tenants/"+url.PathEscape(t), http.StatusSeeOther)
}

type uiTenantPage struct {
	Tenant   string
	Now      time.Time
	Plan     uiPlan
	Windows  []uiWindow
	Charts   []uiChart
	Activity uiActivity
	Queues   []uiQueue // admin only: queues are shared by every tenant
	Flash    string
	Lookup   uiLookupForm
	Queued   *uiQueued // nil: no caps to show
}

// uiQueued is a tenant's queued work against its caps.
type uiQueued struct {
	Notifications, MaxNotifications string
	Bytes, MaxBytes                 string
}

func newUIQueued(q tasks.QueuedUsage) *uiQueued {
	capOf := func(n int64, f func(int64) string) string {
		if n == 0 {
			return "no cap"
		}
		return f(n)
	}
	count := func(n int64) string { return fmt.Sprintf("%d", n) }
	return &uiQueued{Notifications: count(q.Notifications), MaxNotifications: capOf(q.MaxNotifications, count),
		Bytes: sizeText(q.Bytes), MaxBytes: capOf(q.MaxBytes, sizeText)}
}

// sizeText is a byte count for people: 1.5 MiB.
func sizeText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

type uiLookupForm struct {
	Error string
}

func (u *Dashboard) tenantPage(w http.ResponseWriter, r *http.Request, tenant string) {
	v, err := u.tenantData(r.Context(), sessionOf(r), tenant)
	if err != nil {
		u.unavailable(w, r, err)
		return
	}
	if f := r.URL.Query().Get("reset"); f != "" {
		// Only a window of this tenant is named back: a link cannot put
		// words of its own on the page.
		for _, win := range v.Windows {
			if f == win.Scope+" "+win.Rule {
				v.Flash = "Reset the window " + f + ": the sends made before no longer count."
			}
		}
	}
	u.renderTitled(w, r, http.StatusOK, "tenant", "Tenant "+tenant, "/ui/tenants/"+url.PathEscape(tenant)+"/live", v)
}

func (u *Dashboard) tenantData(ctx context.Context, s uiSession, tenant string) (uiTenantPage, error) {
	v := uiTenantPage{Tenant: tenant}
	var err error
	if v.Windows, v.Now, err = u.tenantWindows(ctx, tenant); err != nil {
		return v, err
	}
	if v.Plan, err = u.tenantPlan(ctx, tenant, true); err != nil {
		return v, err
	}
	for _, ch := range []tasks.Channel{tasks.SMS, tasks.Email} {
		c, ok, err := u.chartData(ctx, tenant, ch)
		if err != nil {
			return v, err
		}
		if ok {
			v.Charts = append(v.Charts, c)
		}
	}
	sc, err := u.scanTasks(ctx, tenant)
	if err != nil {
		return v, err
	}
	v.Activity = summarize(sc, time.Now())
	if u.b.Queued != nil {
		q, err := u.b.Queued.Usage(ctx, tenant)
		if err != nil {
			return v, err
		}
		v.Queued = newUIQueued(q)
	}
	if s.Admin {
		if v.Queues, err = u.queueDepths(); err != nil {
			return v, err
		}
	}
	return v, nil
}

// chart is the SVG picture of a channel's sends per minute against the
// tenant-wide limits, drawn here: no script, no library.
func (u *Dashboard) chart(w http.ResponseWriter, r *http.Request, tenant string) {
	ch := tasks.Channel(r.URL.Query().Get("channel"))
	if ch != tasks.SMS && ch != tasks.Email {
		http.Error(w, "channel must be sms or email", http.StatusBadRequest)
		return
	}
	c, ok, err := u.chartData(r.Context(), tenant, ch)
	if err != nil {
		u.b.Log.Error("redis trouble; chart refused", "err", err)
		http.Error(w, "Redis could not be asked", http.StatusServiceUnavailable)
		return
	}
	if !ok {
		http.Error(w, "no tenant-wide rule on this channel", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "image/svg+xml")
	_, _ = w.Write(drawChart(c))
}

// uiRecipientPage is a recipient's windows and messages; the recipient is
// shown masked, and only its keyed hash is ever stored (by the limiter).
type uiRecipientPage struct {
	Tenant   string
	Masked   string
	Subject  string // the keyed hash the limiter stores it under
	Channel  string
	Now      time.Time
	Windows  []uiWindow
	Quiet    []report.QuietRow
	Activity uiActivity
	Consent  *uiConsent
	Digests  []uiDigest
}

// uiDigest is a digest rule of the recipient's channel and the digest open
// for the recipient under it (one per recipient: a rule with a key has one
// per key value, not shown).
type uiDigest struct {
	Category string // "" every category
	Rule     string
	Max      int
	Key      string // the rule's key: one digest per value (not read here)
	Open     *digest.OpenDigest
	Error    string
}

// digestsView reads the digests open for a recipient of tenant on ch.
func digestsView(ctx context.Context, s *digest.Store, policy plans.Policy, tenant string, ch tasks.Channel, to string) []uiDigest {
	if s == nil {
		return nil
	}
	var out []uiDigest
	for _, d := range policy.Digests(tenant, ch) {
		v := uiDigest{Category: d.Category, Rule: "digest=" + d.Digest.String(), Max: d.Digest.Max, Key: d.Digest.Key}
		if d.Digest.Key == "" {
			o, err := s.OpenFor(ctx, tasks.Notification{Tenant: tenant, Channel: ch, To: to, Category: d.Category}, d.Digest)
			if err != nil {
				v.Error = "Redis could not be read"
			}
			v.Open = o
		}
		out = append(out, v)
	}
	return out
}

// uiConsent is what blocks sends to the recipient and its ledger.
type uiConsent struct {
	Marks  []uiMark
	Ledger []consent.Event
	Error  string
}

type uiMark struct {
	What string
	Mark consent.Mark
}

func consentView(ctx context.Context, store *consent.Store, tenant string, ch tasks.Channel, to string) *uiConsent {
	if store == nil {
		return nil
	}
	v := &uiConsent{}
	st, err := store.State(ctx, tenant, ch, to)
	if err != nil {
		v.Error = "its suppressions cannot be read: " + err.Error()
		return v
	}
	if st.Undeliverable != nil {
		v.Marks = append(v.Marks, uiMark{"undeliverable (every category, exempt ones too)", *st.Undeliverable})
	}
	if st.All != nil {
		v.Marks = append(v.Marks, uiMark{"opted out of every category but exempt ones", *st.All})
	}
	for _, c := range slices.Sorted(maps.Keys(st.OptedOut)) {
		v.Marks = append(v.Marks, uiMark{"opted out of " + c, st.OptedOut[c]})
	}
	for _, c := range slices.Sorted(maps.Keys(st.OptedIn)) {
		v.Marks = append(v.Marks, uiMark{"opted back in to " + c, st.OptedIn[c]})
	}
	if v.Ledger, err = store.Ledger(ctx, tenant, ch, to); err != nil {
		v.Error = "part of its ledger cannot be read: " + err.Error()
	}
	slices.Reverse(v.Ledger) // newest first
	return v
}

// recipient looks a recipient up: POSTed so the number or address never
// lands in a URL, the history or an access log, and never logged here.
func (u *Dashboard) recipient(w http.ResponseWriter, r *http.Request, tenant string) {
	raw := strings.TrimSpace(r.PostForm.Get("recipient"))
	ch, norm, problem := parseRecipient(raw)
	if problem != "" {
		v, err := u.tenantData(r.Context(), sessionOf(r), tenant)
		if err != nil {
			u.unavailable(w, r, err)
			return
		}
		v.Lookup.Error = problem
		u.renderTitled(w, r, http.StatusBadRequest, "tenant", "Tenant "+tenant, "/ui/tenants/"+url.PathEscape(tenant)+"/live", v)
		return
	}
	v := uiRecipientPage{Tenant: tenant, Masked: tasks.Mask(norm), Subject: u.b.Limiter.Subject(norm)[:12], Channel: string(ch)}
	rep, err := report.Quotas(r.Context(), u.b.Limiter, u.b.Plans.Policy(), u.b.Settings, report.QuotaQuery{Tenant: tenant, Channel: ch, Recipient: norm})
	switch {
	case errors.Is(err, report.ErrNoRules):
	case err != nil:
		u.unavailable(w, r, err)
		return
	default:
		v.Now = rep.Now
		v.Windows = toWindows(rep, func(e plans.Entry) bool { return e.Scope == plans.ScopeRecipient }, map[string]bool{})
		v.Quiet = rep.Quiet
	}
	if v.Now.IsZero() {
		v.Now = time.Now()
	}
	sc, err := u.scanTasks(r.Context(), tenant)
	if err != nil {
		u.unavailable(w, r, err)
		return
	}
	mine := sc.Tasks[:0]
	for _, t := range sc.Tasks {
		if t.to == norm && t.Channel == string(ch) {
			mine = append(mine, t)
		}
	}
	sc.Tasks = mine
	v.Activity = summarize(sc, time.Now())
	v.Consent = consentView(r.Context(), u.b.Consent, tenant, ch, norm)
	v.Digests = digestsView(r.Context(), u.b.Digests, u.b.Plans.Policy(), tenant, ch, norm)
	u.renderTitled(w, r, http.StatusOK, "recipient", "Recipient "+v.Masked, "", v)
}

// parseRecipient tells an address from a number and normalises it as the
// worker does; problem is set (without echoing the input) when it is neither.
func parseRecipient(raw string) (tasks.Channel, string, string) {
	switch {
	case raw == "":
		return "", "", "Enter a phone number (E.164, e.g. +14155550100) or an email address."
	case len(raw) > tasks.MaxEmailLen:
		return "", "", "That is too long for an address or a number."
	case strings.Contains(raw, "@"):
		n := tasks.Notification{Channel: tasks.Email, To: raw}.Normalized()
		if !strings.Contains(n.To, "@") || strings.ContainsAny(n.To, " <>\r\n") {
			return "", "", "That is not an email address."
		}
		return tasks.Email, n.To, ""
	}
	n := tasks.Notification{Channel: tasks.SMS, To: raw}.Normalized()
	if !tasks.IsE164(n.To) {
		return "", "", "That is neither an email address nor an E.164 phone number (+ and country code, e.g. +14155550100)."
	}
	return tasks.SMS, n.To, ""
}

// uiReset is the confirmation page of a window reset.
type uiReset struct {
	Tenant string
	Window uiWindow
}

// findWindow finds the tenant-wide window id names under the rules in force.
func (u *Dashboard) findWindow(ctx context.Context, tenant, id string) (uiWindow, bool, error) {
	ws, _, err := u.tenantWindows(ctx, tenant)
	if err != nil {
		return uiWindow{}, false, err
	}
	for _, w := range ws {
		if w.ID == id {
			return w, true, nil
		}
	}
	return uiWindow{}, false, nil
}

// resetForm asks before a window is reset. Only the admin resets: a quota
// is the operator's limit on a tenant, not the tenant's own to lift.
func (u *Dashboard) resetForm(w http.ResponseWriter, r *http.Request, tenant string) {
	if !sessionOf(r).Admin {
		u.fail(w, r, http.StatusForbidden, "Only the admin may reset a tenant's quota windows.")
		return
	}
	win, ok, err := u.findWindow(r.Context(), tenant, r.URL.Query().Get("window"))
	if err != nil {
		u.unavailable(w, r, err)
		return
	}
	if !ok {
		u.fail(w, r, http.StatusNotFound, "No tenant-wide window of this tenant has that name under the rules in force.")
		return
	}
	u.renderTitled(w, r, http.StatusOK, "reset", "Reset a window of "+tenant, "", uiReset{Tenant: tenant, Window: win})
}

// reset forgets every send in one tenant-wide window (CSRF-checked, confirmed).
func (u *Dashboard) reset(w http.ResponseWriter, r *http.Request, tenant string) {
	s := sessionOf(r)
	if !s.Admin {
		u.fail(w, r, http.StatusForbidden, "Only the admin may reset a tenant's quota windows.")
		return
	}
	if r.PostForm.Get("confirm") != "yes" {
		u.fail(w, r, http.StatusBadRequest, "The reset was not confirmed; nothing was done.")
		return
	}
	win, ok, err := u.findWindow(r.Context(), tenant, r.PostForm.Get("window"))
	if err != nil {
		u.unavailable(w, r, err)
		return
	}
	if !ok {
		u.fail(w, r, http.StatusNotFound, "No tenant-wide window of this tenant has that name under the rules in force; nothing was done.")
		return
	}
	if err := u.b.Limiter.Reset(r.Context(), tenant, win.limit); err != nil {
		u.unavailable(w, r, err)
		return
	}
	u.b.Log.Warn("quota window reset from the dashboard", "tenant", tenant, "window", win.Scope+" "+win.Rule, "used", win.Used, "booked", win.Booked, "by", s.TokenID)
	http.Redirect(w, r, "/ui/tenants/"+url.PathEscape(tenant)+"?reset="+url.QueryEscape(win.Scope+" "+win.Rule), http.StatusSeeOther)
}

// tenantLive streams the tenant's windows as HTML fragments (server-sent
// events), one a second: the page's script swaps them in.
func (u *Dashboard) tenantLive(w http.ResponseWriter, r *http.Request, tenant string) {
	s := sessionOf(r)
	u.stream(w, r, func(ctx context.Context, tick int) ([]uiEvent, error) {
		ws, now, err := u.tenantWindows(ctx, tenant)
		if err != nil {
			return nil, err
		}
		ev := []uiEvent{{"windows", "windows", uiWindowsPart{Tenant: tenant, Windows: ws, Now: now, Admin: s.Admin}}}
		if s.Admin && tick%5 == 0 {
			qs, err := u.queueDepths()
			if err != nil {
				return nil, err
			}
			ev = append(ev, uiEvent{"queues", "queues", qs})
		}
		return ev, nil
	})
}

// overviewLive streams every tenant's windows for the admin's overview.
func (u *Dashboard) overviewLive(w http.ResponseWriter, r *http.Request) {
	if !sessionOf(r).Admin {
		u.fail(w, r, http.StatusForbidden, "The overview is the admin's.")
		return
	}
	// The list of tenants is read when the stream starts and every minute:
	// finding them is the costly part, their windows are not.
	var tenants []string
	var held map[string]int
	var more bool
	u.stream(w, r, func(ctx context.Context, tick int) ([]uiEvent, error) {
		if tick%60 == 0 {
			sc, err := u.scanTasks(ctx, "")
			if err != nil {
				return nil, err
			}
			held = sc.Tenants
			if tenants, more, err = u.knownTenants(ctx, held); err != nil {
				return nil, err
			}
		}
		v, err := u.tenantRows(ctx, tenants, more, held)
		if err != nil {
			return nil, err
		}
		ev := []uiEvent{{"tenants", "tenants", v}}
		if tick%5 == 0 {
			qs, err := u.queueDepths()
			if err != nil {
				return nil, err
			}
			ev = append(ev, uiEvent{"queues", "queues", qs})
		}
		return ev, nil
	})
}

// uiWindowsPart is the live table of a tenant's windows.
type uiWindowsPart struct {
	Tenant  string
	Windows []uiWindow
	Now     time.Time
	Admin   bool
}

// uiEvent is one server-sent event: the element to replace and the partial
// template that renders its content.
type uiEvent struct {
	Name     string // event name = id of the element on the page ("live-" + Name)
	Template string
	Data     any
}

// stream sends the events next produces every uiLiveInterval until the
// browser leaves, the server stops, the session ends, or uiStreamMax passes
// (EventSource then reconnects by itself). The session is checked before
// every write after the first: a sign-out or a token revoked anywhere ends
// the stream before its next write (uiLiveInterval), a sign-out on this
// server at once.
func (u *Dashboard) stream(w http.ResponseWriter, r *http.Request, next func(context.Context, int) ([]uiEvent, error)) {
	s := sessionOf(r)
	ctx, end := context.WithCancel(r.Context())
	defer end()
	release, status, why := u.streams.take(s, end)
	if release == nil {
		u.streamRefused(status, why)
		w.Header().Set("Retry-After", "10")
		http.Error(w, why+"; the page still works, reload it for fresh figures", status)
		return
	}
	defer release()
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	until := time.Now().Add(uiStreamMax)
	tick := time.NewTicker(uiLiveInterval)
	defer tick.Stop()
	var buf bytes.Buffer
	buf.WriteString("retry: 2000\n\n")
	for i := 0; ; i++ {
		if i > 0 && !u.streamGoesOn(ctx, tick.C, s, until) {
			return
		}
		evs, err := next(ctx, i)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			u.b.Log.Warn("live dashboard: could not read the figures", "route", r.Pattern, "err", err)
			buf.WriteString("event: trouble\ndata: Redis could not be asked; the figures are stale.\n\n")
		}
		for _, ev := range evs {
			var part bytes.Buffer
			if err := uiPages["tenant"].ExecuteTemplate(&part, ev.Template, ev.Data); err != nil {
				u.b.Log.Error("live dashboard: fragment did not render", "fragment", ev.Template, "err", err)
				return
			}
			buf.WriteString("event: " + ev.Name + "\n")
			for _, line := range strings.Split(strings.TrimSpace(part.String()), "\n") {
				buf.WriteString("data: " + strings.TrimRight(line, "\r") + "\n")
			}
			buf.WriteString("\n")
		}
		_ = rc.SetWriteDeadline(time.Now().Add(30 * time.Second))
		if _, err := w.Write(buf.Bytes()); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
		buf.Reset()
	}
}

// streamGoesOn waits for the next tick and reports whether the stream may
// write again: the browser is there, the server is not stopping, the
// stream and the session have time left, and the session was not signed
// out nor its token revoked (asked of Redis each time; while Redis cannot
// answer the stream goes on, its figures marked stale).
func (u *Dashboard) streamGoesOn(ctx context.Context, tick <-chan time.Time, s uiSession, until time.Time) bool {
	select {
	case <-ctx.Done():
		return false
	case <-tick:
	}
	if u.b.Stopping() || time.Now().After(until) || time.Now().Unix() >= s.Expires {
		return false
	}
	ok, err := u.stillValid(ctx, s)
	return err != nil || ok
}

// streamRefused logs a refused live stream: a warning when the server's
// streams are all taken, at most one every 10 s (a client must not be
// able to fill the log); the shares of a session or a tenant are theirs
// to use up, logged at debug.
func (u *Dashboard) streamRefused(status int, why string) {
	if status != http.StatusServiceUnavailable {
		u.b.Log.Debug("live stream refused", "why", why)
		return
	}
	now := time.Now().UnixNano()
	if last := u.refusedWarn.Load(); now-last >= int64(10*time.Second) && u.refusedWarn.CompareAndSwap(last, now) {
		u.b.Log.Warn("live stream refused: the server's live streams are all taken", "max", u.streams.caps.Total)
	}
}
