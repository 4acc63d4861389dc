package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// providerSet is each channel's providers in this worker, in the order
// they are tried, with the state of their breakers and holds as this
// worker last read it.
type providerSet struct {
	*core
	providers map[tasks.Channel][]*provider
	shown     stateShown // what this worker shows of their states (provstate.go)
}

// Failover. A channel may have several providers (SMS_PROVIDERS,
// EMAIL_PROVIDERS), tried in order. Each is its own subject of provider and
// sender rules and caps, has its own hold and its own request slots, and a
// circuit breaker kept in Redis for every worker (throttle.Breaker): the
// transient failures every worker sees there within PROVIDER_FAILURE_WINDOW
// mark it down for PROVIDER_COOLDOWN, then one worker's send probes it and
// a success takes it back.
//
// Before each check the send picks its provider (pickProvider): the first
// that is up. A priority-lane send passes over one that is down or held at
// once; a standard or bulk one waits FAILOVER_GRACE from the moment it went
// down or was held (a hold that ends sooner is waited for). A send whose
// request a provider definitely did not take (a refused connection, 503,
// 429: sender.SendError.NotSent) moves on — a priority send in the same run,
// the others through Asynq, without spending a retry. One whose outcome is
// unknown (a timeout after the request left) is not sent anywhere else in
// that run: it is retried as every transient failure is, and the re-run is
// settled from the provider's status report first (reachedProvider), so a
// notification is accepted by at most one provider but in the one case
// docs/channels.md names (no report within the retry's backoff).

// provider is one of a channel's providers in this worker.
type provider struct {
	name    string
	channel tasks.Channel
	send    sender.Sender
	// slots and prioritySlots bound this worker's requests at it at once
	// (CONCURRENCY, PRIORITY_CONCURRENCY).
	slots, prioritySlots *reqSlots
	// breaker is its breaker's key; "" when its channel has one provider
	// (nothing to fail over to: no breaker is kept).
	breaker string
	// hold is its provider-scope hold key.
	hold string
	// base is the shared settings as it reads them: its own sender
	// settings (From, messaging service; ProviderSenderVars) in place of
	// the deployment's, which sender rules and holds count by (origin).
	base config.Base
	// down: this worker last read it as down, held or being probed.
	down atomic.Bool
	// state is the state shown, read at readAt (guarded by
	// providerSet.shown.mu: observe).
	state  provState
	readAt time.Time
}

// named reports whether the provider is one of a list's named providers:
// its rules and holds count under its name. The default provider keeps the
// keys a single-provider deployment has always used.
func (p *provider) named() bool { return p.name != DefaultProvider }

// pick is a send's provider for one check.
type pick struct {
	p *provider
	// probe: p's breaker is half-open and this send is its probe: a
	// success closes it.
	probe bool
	// wasDown: p was read as down or held (a success closes its breaker).
	wasDown bool
	// replan is closed when a provider of the channel changes state; set
	// when p is not the first of the send's providers: a send admitted at
	// p and waiting for its slot plans again when an earlier one may be
	// back (waitForSlot).
	replan <-chan struct{}
	// replanAt is when a provider passed over for p may come back: the
	// earliest end of their cooldowns (a probe may go) and holds. A send
	// booked at p past it is in process by then to plan again (check.wakeBy).
	replanAt  time.Time
	replanFor string // the provider that may come back at replanAt
}

// errProviderWait is a standard send's wait for a provider: within its
// grace, for its cooldown, or before it is tried again. changed is closed
// when a provider of the send's channel changes state (a reason to plan
// again at once).
type errProviderWait struct {
	until   time.Time
	p       string
	changed <-chan struct{}
}

func (e *errProviderWait) Error() string { return "waiting for provider " + e.p }

// providerKey carries the picked provider to the send handler.
type providerKey struct{}

// errFailover ends a dispatch whose provider did not take the request and
// that goes to the next provider in the same run (a priority send).
type errFailover struct {
	from string
	err  error
}

func (e *errFailover) Error() string { return "failing over from " + e.from + ": " + e.err.Error() }
func (e *errFailover) Unwrap() error { return e.err }

// giveBackProbe ends the probe pk won when the limiter did not admit its
// send for now (booked behind the provider's earlier bookings, say):
// another send, one whose slot comes first, may probe at once instead of
// every send passing the provider over until the probe's lease lapses.
func (ps *providerSet) giveBackProbe(ctx context.Context, pk pick, d throttle.Decision, log *slog.Logger) {
	if !pk.probe {
		return
	}
	if err := ps.limiter.GiveBackProbe(ctx, pk.p.breaker); err != nil {
		log.Warn("could not give back a provider's probe; another send probes once its lease lapses", "provider", pk.p.name, "err", err)
		return
	}
	log.Info("gave back a provider's probe: this send waits for its slot", "provider", pk.p.name, "status", d.Status.String())
	ps.announce(ctx, log) // the sends waiting on the provider may probe it now
}

// canFailOver reports whether a send that failed at p has another provider
// (in the order its plan gives) it has not tried in this run.
func (ps *providerSet) canFailOver(n tasks.Notification, p *provider, order, tried []string) bool {
	for _, q := range ps.planned(n, order) {
		if q != p && !slices.Contains(tried, q.name) {
			return true
		}
	}
	return false
}

// planned is n's channel's providers in the order a tenant plan's
// CHANNEL:providers=A+B gives (those of them this worker has; none: the
// configured list).
func (ps *providerSet) planned(n tasks.Notification, order []string) []*provider {
	all := ps.providers[n.Channel]
	if len(order) == 0 || len(all) < 2 {
		return all
	}
	var out []*provider
	for _, name := range order {
		if i := slices.IndexFunc(all, func(p *provider) bool { return p.name == name }); i >= 0 {
			out = append(out, all[i])
		}
	}
	if len(out) == 0 {
		return all
	}
	return out
}

// noteProvider records which provider took n, where a channel has
// several (GET /v1/notifications/{id} shows it): one write per send, only
// then.
func (ps *providerSet) noteProvider(ctx context.Context, n tasks.Notification, p *provider, log *slog.Logger) {
	if len(ps.providers[n.Channel]) < 2 {
		return
	}
	ctx, cancel := ps.afterSendContext(ctx)
	defer cancel()
	if err := ps.delivery.NoteProvider(ctx, n.Tenant, n.ID, p.name, ps.cfg.DedupeTTL); err != nil {
		log.Warn("could not record which provider took the send", "provider", p.name, "err", err)
	}
}

// providerRecovered closes p's breaker after a send that went through
// while it was read as down (a probe, or a send that waited out a hold).
func (ps *providerSet) providerRecovered(ctx context.Context, pk pick, log *slog.Logger) {
	if !pk.wasDown || pk.p.breaker == "" {
		return
	}
	ctx, cancel := ps.afterSendContext(ctx)
	defer cancel()
	if err := ps.limiter.ProviderRecovered(ctx, pk.p.breaker); err != nil {
		log.Warn("could not mark a provider up again; its next probe will", "provider", pk.p.name, "err", err)
		return
	}
	ps.markProvider(pk.p, true)
	ps.announce(ctx, log)
	if pk.probe {
		log.Info("provider answered its probe: back in service", "provider", pk.p.name)
	}
}

// providerFailed counts a transient failure at p toward its breaker (with a
// single provider there is none).
func (ps *providerSet) providerFailed(ctx context.Context, p *provider, log *slog.Logger) {
	if p.breaker == "" {
		return
	}
	ctx, cancel := ps.afterSendContext(ctx)
	defer cancel()
	b, err := ps.limiter.ProviderFailed(ctx, p.breaker, throttle.BreakerPolicy{Failures: ps.cfg.ProviderFailures,
		Window: ps.cfg.ProviderFailureWindow, Cooldown: ps.cfg.ProviderCooldown})
	if err != nil {
		log.Warn("could not count a provider failure toward its breaker", "provider", p.name, "err", err)
		return
	}
	if b.Open {
		ps.markProvider(p, false)
		ps.announce(ctx, log)
		log.Warn("provider marked down: sends go to the next provider", "provider", p.name, "failures", b.Fails,
			"down_since", b.Since.UTC(), "probe_at", b.Until.UTC())
	}
}

// providerWarnings are /readyz's lines for the providers this worker last
// read as down: degraded, not down, while another provider serves (or,
// when all are down, while sends wait for them).
func (ps *providerSet) providerWarnings() []string {
	var out []string
	for _, ch := range Channels {
		var down, up []string
		for _, p := range ps.providers[ch] {
			if p.down.Load() {
				down = append(down, p.name)
			} else {
				up = append(up, p.name)
			}
		}
		switch {
		case len(down) == 0:
		case len(up) == 0:
			out = append(out, fmt.Sprintf("degraded: every %s provider is down or held (%s): its sends wait", ch, strings.Join(down, ", ")))
		default:
			out = append(out, fmt.Sprintf("degraded: %s provider %s down or held; sending through %s", ch, strings.Join(down, ", "), strings.Join(up, ", ")))
		}
	}
	return out
}

// markProvider shows p up, or down, as this worker just made it (closed
// or opened its breaker in Redis).
func (ps *providerSet) markProvider(p *provider, up bool) {
	st := provDown
	if up {
		st = provUp
	}
	ps.observe(p, st, time.Now())
}

// pickProvider picks n's provider for this check among those of its
// channel not in tried: the first that is up. Down or held ones are passed
// over at once by a priority send, after FAILOVER_GRACE by the others,
// which wait for it until then (errProviderWait), and wait for a hold that
// ends within it (the check books them after it). When every one is down,
// the first is picked: its hold books the send after it; a down breaker
// puts the send back until its probe (errProviderWait).
//
// order, the tenant's plan's CHANNEL:providers=A+B, puts those providers
// (the ones this worker has) in that order and leaves the others out; nil
// or naming none of them: the channel's list as configured.
func (ps *providerSet) pickProvider(ctx context.Context, n tasks.Notification, priority bool, order, tried []string, log *slog.Logger) (pick, error) {
	all := ps.planned(n, order)
	var list []*provider
	for _, p := range all {
		if !slices.Contains(tried, p.name) {
			list = append(list, p)
		}
	}
	if len(list) == 0 {
		return pick{}, fmt.Errorf("%w %s: every provider was tried", sender.ErrNoSender, n.Channel)
	}
	if len(ps.providers[n.Channel]) == 1 {
		return pick{p: list[0]}, nil
	}
	changed := ps.changes(n.Channel) // before the reading: no change falls between the two
	states, spans, now, err := ps.readList(ctx, list, log)
	if err != nil {
		return pick{}, err
	}
	var replanAt time.Time // when one passed over may come back
	var replanFor string
	for i, p := range list {
		b, h := states[i], spans[i]
		held := h.Until.After(now)
		if !b.Open && !b.HalfOpen && !held {
			pk := pick{p: p}
			if p != all[0] {
				pk.replan, pk.replanAt, pk.replanFor = changed, replanAt, replanFor // one ahead of it may come back while it waits for its slot
			}
			if i > 0 {
				ps.metrics.Failovers.WithLabelValues(string(n.Channel), list[0].name).Inc()
			}
			return pk, nil
		}
		if b.HalfOpen && !b.Open && !held {
			won, err := ps.limiter.TryProbe(ctx, p.breaker, ps.cfg.ProviderCooldown)
			if err == nil && won {
				log.Info("probing a provider marked down", "provider", p.name, "down_since", b.Since.UTC(), "probe_at", b.Until.UTC())
				return pick{p: p, probe: true, wasDown: true}, nil
			}
		}
		// Down (or held, or half-open with another worker's probe on its way).
		for _, t := range []time.Time{b.Until, h.Until} {
			if t.After(now) && (replanAt.IsZero() || t.Before(replanAt)) {
				replanAt, replanFor = t, p.name
			}
		}
		since := b.Since
		if held && (since.IsZero() || h.Since.Before(since)) {
			since = h.Since
		}
		if priority {
			continue
		}
		graceEnd := since.Add(ps.cfg.FailoverGrace)
		if held && !b.Open && !b.HalfOpen && !h.Until.After(graceEnd) {
			return pick{p: p, wasDown: true}, nil // the hold ends within the grace: booked after it
		}
		if now.Before(graceEnd) {
			return pick{}, &errProviderWait{until: graceEnd, p: p.name, changed: changed}
		}
	}
	// Every one is down: the first it is. A hold books the send after it;
	// a down breaker puts it back until its cooldown ends.
	p, b := list[0], states[0]
	if b.Open {
		return pick{}, &errProviderWait{until: b.Until, p: p.name, changed: changed}
	}
	return pick{p: p, wasDown: true}, nil
}

// readList reads the states of list's providers for a pick, shows them
// (observe), and returns them with the instant they are judged at.
func (ps *providerSet) readList(ctx context.Context, list []*provider, log *slog.Logger) ([]throttle.Breaker, []throttle.HoldSpan, time.Time, error) {
	breakers, holds := make([]string, len(list)), make([]string, len(list))
	for i, p := range list {
		breakers[i], holds[i] = p.breaker, p.hold
	}
	var states []throttle.Breaker
	var spans []throttle.HoldSpan
	at := time.Now()
	err := ps.withRedis(ctx, log, "provider states", func(ctx context.Context) error {
		var err error
		at = time.Now()
		states, spans, err = ps.limiter.ProviderStates(ctx, breakers, holds)
		return err
	})
	if err != nil {
		return nil, nil, time.Time{}, &UnavailableError{Err: err}
	}
	now := time.Now()
	for i, p := range list {
		ps.observe(p, stateOf(states[i], spans[i], now), at)
	}
	return states, spans, now, nil
}

// heldAsPicked reports whether a standard send's booking d at pk's
// provider, which its pick read as up, is behind a hold of that provider
// that began as it picked (no rule booked it, and the hold is live): it
// is to pick again — wait out the grace, then the next provider — as a
// pick after the hold began would have, not wait the hold out at this
// provider (issue 53: such sends reached the backup at the 30 s hold's
// end). The caller gives the booking back.
func (ps *providerSet) heldAsPicked(ctx context.Context, n tasks.Notification, c check, pk pick, d throttle.Decision, log *slog.Logger) bool {
	if d.Status != throttle.StatusBooked || d.DeniedBy >= 0 || pk.wasDown || pk.probe || c.Match.Exempt || !ps.several(n.Channel) {
		return false
	}
	until, err := ps.limiter.HeldUntil(ctx, pk.p.hold)
	if err != nil || !until.After(time.Now()) {
		return false
	}
	log.Info("booked behind a hold of its provider that began as it was picked; picking again", "provider", pk.p.name, "hold_until", until.UTC())
	return true
}

// bindProvider makes c a check of a send through p: its provider and
// sender rules and caps count p's sends, and it honours p's holds.
func (ps *providerSet) bindProvider(c *check, n tasks.Notification, p *provider) {
	c.opts.Holds = []string{p.hold}
	o := p.origin(n)
	if o != "" {
		c.opts.Holds = append(c.opts.Holds, ps.senderHoldKey(p, o))
	}
	if !p.named() {
		return
	}
	// Sender rules count p's origin at p: the plan was made with the
	// deployment's, and a named provider may have its own From.
	c.Limits = slices.Clone(c.Limits)
	for i, e := range c.Match.Rates {
		if sub, ok := p.subject(e.Scope, o); ok {
			c.Limits[i].Subject = sub
		}
	}
	c.Caps = slices.Clone(c.Caps)
	for i, e := range c.Match.Caps {
		if sub, ok := p.subject(e.Scope, o); ok {
			c.Caps[i].Subject = sub
		}
	}
}

// subject is whom a provider or sender rule counts for a send through p
// from origin o (ok false for any other scope): a named provider counts
// under its name; the deployment's own provider, as the plan made them,
// the channel ("") and the origin.
func (p *provider) subject(scope, o string) (string, bool) {
	switch {
	case scope == plans.ScopeProvider && p.named():
		return p.name, true
	case scope == plans.ScopeProvider:
		return "", true
	case scope == plans.ScopeSender && p.named():
		return p.name + ":" + o, true
	case scope == plans.ScopeSender:
		return o, true
	}
	return "", false
}

// forgetElsewhere takes a send placed at a provider that is not its first
// (failing over: pk.replan is set) out of the provider and sender windows
// of the channel's other providers, where a run of it before may have
// booked it: that booking is not the one it is sent on. Left there, the
// bookings of the sends that moved held the primary's window for up to a
// window after its return, and its first sends were booked behind them
// (issue 53: the return 0.5-0.78 s after the probe). The attempt was never
// admitted at another provider (throttle.Limiter.Forget), so only
// bookings go. Best effort: one left counts until its window passes.
func (ps *providerSet) forgetElsewhere(ctx context.Context, n tasks.Notification, c check, pk pick, attempt int, log *slog.Logger) {
	if pk.replan == nil {
		return
	}
	var limits []throttle.Limit
	for _, q := range ps.providers[n.Channel] {
		if q != pk.p {
			limits = append(limits, ps.windowsAt(c, n, q)...)
		}
	}
	if len(limits) == 0 {
		return
	}
	if _, err := ps.limiter.Forget(ctx, n.Tenant, n.ID, attempt, limits...); err != nil {
		log.Debug("could not take a booking at another provider back; it counts until its window passes", "err", err)
	}
}

// windowsAt are c's provider and sender windows as a send through q would
// count in them (q.subject).
func (ps *providerSet) windowsAt(c check, n tasks.Notification, q *provider) []throttle.Limit {
	var out []throttle.Limit
	o := q.origin(n)
	for i, e := range c.Match.Rates {
		if sub, ok := q.subject(e.Scope, o); ok {
			lim := c.Limits[i]
			lim.Subject = sub
			out = append(out, lim)
		}
	}
	return out
}

// senderHoldKey is the hold key of origin o at p: the origin (a From
// number, a sender id) belongs to the provider's account.
func (ps *providerSet) senderHoldKey(p *provider, o string) string {
	scope := string(p.channel) + ":sender"
	if p.named() {
		scope += ":" + p.name
	}
	return ps.limiter.HoldKey(scope, o)
}

// origin is who sender rules count as sending n through p, and whose
// sender hold it honours: n's own origin, else p's default (Base.Origin).
func (p *provider) origin(n tasks.Notification) string { return p.base.Origin(n) }

// newProviders builds each channel's providers from the named senders.
func (ps *providerSet) newProviders(list map[tasks.Channel][]sender.Named) map[tasks.Channel][]*provider {
	out := map[tasks.Channel][]*provider{}
	for ch, named := range list {
		bases := map[string]config.Base{}
		specs, _ := ps.cfg.Providers(ch)
		for _, s := range specs {
			bases[s.Name] = s.Base
		}
		for _, s := range named {
			base, ok := bases[s.Name]
			if !ok {
				base = ps.cfg.Base
			}
			p := &provider{name: s.Name, channel: ch, send: s.Sender, base: base,
				slots:         newReqSlots(ps.cfg.Concurrency),
				prioritySlots: newReqSlots(ps.cfg.PriorityConcurrency)}
			if len(named) > 1 {
				p.breaker = ps.limiter.BreakerKey(string(ch), s.Name)
			}
			subject := ""
			if p.named() {
				subject = s.Name
			}
			p.hold = ps.limiter.HoldKey(string(ch)+":provider", subject)
			out[ch] = append(out[ch], p)
			ps.metrics.ProviderUp.WithLabelValues(string(ch), s.Name).Set(1)
			ps.metrics.ProviderSends.WithLabelValues(string(ch), s.Name) // served from the start, at 0
			ps.metrics.Failovers.WithLabelValues(string(ch), s.Name)
		}
	}
	return out
}

// providerWait turns a wait for a provider that the worker does not wait
// out in process (waitForProvider: too far ahead, no waiter token free)
// into what Asynq is to do: the send goes back for then (not a failure),
// woken early enough (wakeFor) to wait the rest in process and plan again
// at the instant, not at Asynq's next whole second.
func (ps *providerSet) providerWait(n tasks.Notification, err error, log *slog.Logger) error {
	var pw *errProviderWait
	if !errors.As(err, &pw) {
		return err
	}
	retryAt := pw.until
	if soon := time.Now().Add(10 * time.Millisecond); retryAt.Before(soon) {
		retryAt = soon
	}
	wake := ps.cfg.wakeFor(retryAt)
	log.Info("its provider is down or held; waiting", "provider", pw.p, "until", retryAt.UTC(), "wake_at", wake.UTC())
	return &ThrottledError{RetryAt: retryAt, WakeAt: wake, Rule: "provider " + string(n.Channel) + ":" + pw.p + " down"}
}

// several reports whether ch has more than one provider (one to fail over to).
func (ps *providerSet) several(ch tasks.Channel) bool { return len(ps.providers[ch]) > 1 }

// close closes the senders that hold pools (SMTP connections).
func (ps *providerSet) close() {
	for _, list := range ps.providers {
		for _, p := range list {
			if c, ok := p.send.(io.Closer); ok {
				_ = c.Close()
			}
		}
	}
}
