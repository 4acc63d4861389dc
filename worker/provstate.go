package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// Provider states. Every worker shows each provider's state as Redis holds
// it (its breaker, its provider-scope hold) — in sluice_provider_up and
// /readyz — whether or not it sends through it: a watcher (watch) reads
// them all when a worker announces a change it made (a breaker opened or
// closed, a hold begun: Limiter.ProviderEvents, pub/sub), at the instant a
// known one is due (a hold's end, a cooldown's end, when a probe may go),
// and, in case a message was lost, every providerRecheck while a provider
// is shown down or held (sends may be waiting on it) or every
// providerIdleRecheck while all are shown up (an idle worker then costs
// Redis one pipelined read in 5 s, not one a second: issue 55's idle
// budget). A send's own pick always reads the states it decides on, so a
// lost announcement delays only what a worker shows. Each reading,
// the watcher's or a send's pick, is applied only if it was taken after
// the one shown (stateShown.readAt).
//
// A change of a channel's provider state wakes the sends of that channel
// waiting on one (changes): a standard send waiting out its provider's
// grace or cooldown, and one admitted at a later provider of its list and
// waiting for its slot there, plan again at once rather than at their
// next wake-up.

// providerRecheck bounds how long a worker may show a provider state that
// no longer holds when an announcement was lost, while one is shown down
// or held; providerIdleRecheck while every one is shown up.
const (
	providerRecheck     = time.Second
	providerIdleRecheck = 5 * time.Second
)

// provState is a provider's state as read from Redis.
type provState int

const (
	provUp       provState = iota
	provHeld               // a provider-scope hold is live
	provDown               // its breaker is open: nothing is sent to it
	provHalfOpen           // its cooldown is over: one send may probe it
)

// stateOf is the state of a provider whose breaker and hold read b and h at now.
func stateOf(b throttle.Breaker, h throttle.HoldSpan, now time.Time) provState {
	switch {
	case b.Open:
		return provDown
	case b.HalfOpen:
		return provHalfOpen
	case h.Until.After(now):
		return provHeld
	}
	return provUp
}

// stateShown is what a worker shows of its providers' states, and the
// signal of their changes.
type stateShown struct {
	mu sync.Mutex
	// changed is closed, and replaced, when a provider of the channel
	// changes state.
	changed map[tasks.Channel]chan struct{}
}

// changes is closed at the next change of a provider state of ch.
func (ps *providerSet) changes(ch tasks.Channel) <-chan struct{} {
	ps.shown.mu.Lock()
	defer ps.shown.mu.Unlock()
	c, ok := ps.shown.changed[ch]
	if !ok {
		if ps.shown.changed == nil {
			ps.shown.changed = map[tasks.Channel]chan struct{}{}
		}
		c = make(chan struct{})
		ps.shown.changed[ch] = c
	}
	return c
}

// observe applies a reading of p's state taken (asked of Redis) at at,
// unless one taken later is shown already: sluice_provider_up, /readyz's
// lines, and the change signal of p's channel.
func (ps *providerSet) observe(p *provider, st provState, at time.Time) {
	ps.shown.mu.Lock()
	defer ps.shown.mu.Unlock()
	if at.Before(p.readAt) {
		return
	}
	p.readAt = at
	if p.state == st {
		return
	}
	p.state = st
	p.down.Store(st != provUp)
	v := 0.0
	if st == provUp {
		v = 1
	}
	ps.metrics.ProviderUp.WithLabelValues(string(p.channel), p.name).Set(v)
	if c, ok := ps.shown.changed[p.channel]; ok {
		close(c)
		delete(ps.shown.changed, p.channel)
	}
}

// announce tells every worker (this one too) to read the providers'
// states now: this worker changed one.
func (ps *providerSet) announce(ctx context.Context, log *slog.Logger) {
	ctx, cancel := ps.afterSendContext(ctx)
	defer cancel()
	if err := ps.rdb.Publish(ctx, ps.limiter.ProviderEvents(), "").Err(); err != nil {
		log.Warn("could not announce a provider's change of state; other workers read it within their recheck", "err", err, "recheck", providerRecheck)
	}
}

// watch keeps every provider's state shown as Redis holds it, until ctx
// ends (above).
func (ps *providerSet) watch(ctx context.Context) {
	sub := ps.rdb.Subscribe(ctx, ps.limiter.ProviderEvents())
	defer sub.Close()
	msgs := sub.Channel()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-msgs:
			if m.Payload == throttle.BreakerWritten {
				// Every write of a breaker, for the hold caches; a
				// change of its state is announced by its worker.
				continue
			}
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(ps.readStates(ctx))
			// An announcement is news even when no state changed (a probe
			// given back: another send may probe now): the waiting sends
			// plan again.
			ps.nudge()
			continue
		case <-timer.C:
		}
		timer.Reset(ps.readStates(ctx))
	}
}

// nudge wakes every send waiting on a provider state, as a change does.
func (ps *providerSet) nudge() {
	ps.shown.mu.Lock()
	defer ps.shown.mu.Unlock()
	for ch, c := range ps.shown.changed {
		close(c)
		delete(ps.shown.changed, ch)
	}
}

// readStates reads every provider's state and shows it; it returns how
// long until the next reading: the next known change (a hold or a
// cooldown ending), at most providerRecheck (providerIdleRecheck when
// every provider is up).
func (ps *providerSet) readStates(ctx context.Context) time.Duration {
	var list []*provider
	var breakers, holds []string
	for _, ch := range Channels {
		for _, p := range ps.providers[ch] {
			list = append(list, p)
			breakers, holds = append(breakers, p.breaker), append(holds, p.hold)
		}
	}
	if len(list) == 0 {
		return providerRecheck
	}
	at := time.Now()
	rctx, cancel := context.WithTimeout(ctx, providerRecheck)
	defer cancel()
	bs, hs, err := ps.limiter.ProviderStates(rctx, breakers, holds)
	if err != nil {
		if ctx.Err() == nil {
			ps.log.Debug("could not read the providers' states; keeping those shown", "err", err)
		}
		return providerRecheck
	}
	now := time.Now()
	next := now.Add(providerIdleRecheck)
	for i, p := range list {
		st := stateOf(bs[i], hs[i], now)
		ps.observe(p, st, at)
		if soon := now.Add(providerRecheck); st != provUp && soon.Before(next) {
			next = soon
		}
		for _, t := range []time.Time{hs[i].Until, bs[i].Until} {
			if t.After(now) && t.Before(next) {
				next = t
			}
		}
	}
	return max(time.Until(next)+time.Millisecond, time.Millisecond) // just past a change: read after it
}
