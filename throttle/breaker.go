package throttle

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Breakers: a provider's circuit breaker, shared by every worker, so a
// channel with several providers passes over one that fails
// (scripts/op_breaker.lua). Transient failures (refused connections,
// timeouts, 5xx) within a window open it for a cooldown; then it is
// half-open: one worker wins the probe (TryProbe) and sends one request;
// a success closes it (ProviderRecovered), a failure opens it again for
// another cooldown, its since kept. Breaker keys live in the hold group,
// so one pipeline reads them with the provider holds (ProviderStates).

// breakerLinger is how long a breaker key outlives what it must remember.
const breakerLinger = time.Minute

// BreakerKey returns the key of provider's breaker on channel, e.g.
// BreakerKey("sms", "backup"). The name is a configured provider name,
// not PII: it is kept in clear.
func (l *Limiter) BreakerKey(channel, provider string) string {
	return l.space.Breaker(channel, provider)
}

// ProviderEvents is the pub/sub channel on which a worker announces a
// change of a provider's state it made (a breaker opened or closed, a hold
// begun): every worker reads the providers' states again at once, so all
// show the same state and sends waiting on it plan again.
func (l *Limiter) ProviderEvents() string { return l.space.ProviderEvents() }

// breakerIndex is the set of the breaker keys that opened and have not
// closed: OpenBreakers lists it.
func (l *Limiter) breakerIndex() string { return l.space.Breakers() }

// ProviderDown is a provider whose breaker opened and has not closed.
type ProviderDown struct {
	Channel, Provider string
	Breaker
}

// OpenBreakers lists the providers whose breakers opened and have not
// closed (open, or half-open waiting for a probe), by channel and name:
// what a dashboard shows. One round trip for the index, one for the keys.
func (l *Limiter) OpenBreakers(ctx context.Context) ([]ProviderDown, error) {
	keys, err := l.client.SMembers(ctx, l.breakerIndex()).Result()
	if err != nil {
		return nil, fmt.Errorf("throttle: open breakers: %w", err)
	}
	slices.Sort(keys)
	bs, _, err := l.ProviderStates(ctx, keys, nil)
	if err != nil {
		return nil, err
	}
	var out []ProviderDown
	for i, k := range keys {
		if bs[i].Since.IsZero() {
			continue // lapsed (its key expired): closed
		}
		ch, name, _ := l.space.BreakerOf(k)
		out = append(out, ProviderDown{Channel: ch, Provider: name, Breaker: bs[i]})
	}
	return out, nil
}

// BreakerPolicy says when a breaker opens and for how long.
type BreakerPolicy struct {
	// Failures within Window open the breaker, for Cooldown.
	Failures         int
	Window, Cooldown time.Duration
}

func (p BreakerPolicy) validate() error {
	if p.Failures < 1 || p.Window <= 0 || p.Cooldown <= 0 || p.Window > MaxHold || p.Cooldown > MaxHold {
		return fmt.Errorf("%w: breaker of %d failures in %v, cooldown %v: want at least 1 failure, 0 < window, cooldown ≤ %v",
			ErrInvalidRule, p.Failures, p.Window, p.Cooldown, MaxHold)
	}
	return nil
}

// Breaker is a provider's breaker as read or left by a call.
type Breaker struct {
	// Open: Until is ahead; nothing is sent to the provider.
	Open bool
	// HalfOpen: it was open and its cooldown is over: one probe may go (TryProbe).
	HalfOpen bool
	// Since is when it opened (zero while closed); Until when its cooldown ends.
	Since, Until time.Time
	// Fails counts the failures of the current window.
	Fails int
}

// HoldSpan is a provider hold as ProviderStates reads it.
type HoldSpan struct {
	// Since is when the hold began; Until when it lifts (zero: no live hold).
	Since, Until time.Time
}

// breakerOp is "B" (scripts/op_breaker.lua).
type breakerOp struct {
	breaker string
	index   string // breakerIndex
	mode    int    // 1 failed, 2 probe, 3 recovered, 4 probe given back
	policy  BreakerPolicy
	lease   time.Duration // the probe's (mode 2)
	linger  time.Duration
	events  string // the channel a write is announced on (ProviderEvents)
}

const (
	breakerFailed    = 1
	breakerProbe     = 2
	breakerRecovered = 3
	breakerGiveBack  = 4
)

func (o *breakerOp) code() string { return opBreaker }

func (o *breakerOp) build() *op {
	e := newEnc(opBreaker, 2, 6)
	o.encode(&e)
	return &e.op
}

func (o *breakerOp) encode(e *enc) {
	cool := o.policy.Cooldown
	if o.mode == breakerProbe {
		cool = o.lease
	}
	e.key("breaker", o.breaker)
	e.key("index", o.index)
	e.arg("mode", o.mode)
	e.arg("failures", o.policy.Failures)
	e.arg("window_ms", o.policy.Window.Milliseconds())
	e.arg("cooldown_ms", cool.Milliseconds())
	e.arg("linger_ms", o.linger.Milliseconds())
	e.arg("events", o.events)
}

// breaker runs one breaker operation.
func (l *Limiter) breaker(ctx context.Context, o breakerOp) ([]int64, error) {
	if !l.space.IsBreaker(o.breaker) {
		return nil, fmt.Errorf("%w: %q is not a breaker key (BreakerKey)", ErrInvalidKey, o.breaker)
	}
	o.linger, o.index, o.events = breakerLinger, l.breakerIndex(), l.ProviderEvents()
	_, reply, err := l.batch.do(ctx, l.nowArg(), holdGroup, o.build())
	l.forgetHolds() // its own next reading sees the write at once
	if err != nil {
		return nil, fmt.Errorf("throttle: breaker: %w", err)
	}
	if len(reply) != 5 {
		return nil, fmt.Errorf("throttle: breaker: unexpected reply %v", reply)
	}
	return reply, nil
}

func breakerFrom(r []int64) Breaker {
	b := Breaker{Open: r[0] == 1, Fails: int(r[3])}
	if r[1] > 0 {
		b.Since, b.Until = time.UnixMilli(r[1]), time.UnixMilli(r[2])
	}
	return b
}

// ProviderFailed counts a transient failure at the provider of key: the
// breaker opens when p.Failures fall within p.Window; a failure while it is
// half-open opens it again for p.Cooldown (Since kept). It returns the
// breaker as the failure left it.
func (l *Limiter) ProviderFailed(ctx context.Context, key string, p BreakerPolicy) (Breaker, error) {
	if err := p.validate(); err != nil {
		return Breaker{}, err
	}
	r, err := l.breaker(ctx, breakerOp{breaker: key, mode: breakerFailed, policy: p})
	if err != nil {
		return Breaker{}, err
	}
	return breakerFrom(r), nil
}

// TryProbe claims the one probe of a half-open breaker, for ttl: true
// when this caller won it (it sends one request to the provider); false
// while the breaker is closed, open, or another probe is live.
func (l *Limiter) TryProbe(ctx context.Context, key string, ttl time.Duration) (bool, error) {
	if ttl <= 0 || ttl > MaxHold {
		return false, fmt.Errorf("%w: probe lease %v: want 0 < lease ≤ %v", ErrInvalidRule, ttl, MaxHold)
	}
	r, err := l.breaker(ctx, breakerOp{breaker: key, mode: breakerProbe, policy: BreakerPolicy{Failures: 1, Window: time.Millisecond, Cooldown: ttl}, lease: ttl})
	if err != nil {
		return false, err
	}
	return r[4] == 1, nil
}

// GiveBackProbe ends the probe TryProbe won on key before its lease does:
// the send that won it will not go soon (the limiter booked it for later),
// so another send may probe now. A probe no longer live, or a breaker
// closed meanwhile, is left as it is. (A probe given back after its lease
// lapsed and another caller won it ends that one: two probes then go.)
func (l *Limiter) GiveBackProbe(ctx context.Context, key string) error {
	_, err := l.breaker(ctx, breakerOp{breaker: key, mode: breakerGiveBack, policy: BreakerPolicy{Failures: 1, Window: time.Millisecond, Cooldown: time.Millisecond}})
	return err
}

// ProviderRecovered closes the breaker of key: a send through the provider
// succeeded while it was read as open or half-open.
func (l *Limiter) ProviderRecovered(ctx context.Context, key string) error {
	_, err := l.breaker(ctx, breakerOp{breaker: key, mode: breakerRecovered, policy: BreakerPolicy{Failures: 1, Window: time.Millisecond, Cooldown: time.Millisecond}})
	return err
}

// ProviderStates reads breaker keys (BreakerKey; "" reads as closed) and
// hold keys (HoldKey) in one pipelined round trip, or from memory on a
// Cluster whose holds are watched (WatchHolds): each breaker's state, and
// each hold's span, judged against the limiter's clock.
func (l *Limiter) ProviderStates(ctx context.Context, breakers, holds []string) ([]Breaker, []HoldSpan, error) {
	keys := make([]string, 0, len(breakers)+len(holds))
	for _, k := range breakers {
		if k != "" && !l.space.IsBreaker(k) {
			return nil, nil, fmt.Errorf("%w: %q is not a breaker key (BreakerKey)", ErrInvalidKey, k)
		}
		keys = append(keys, k)
	}
	for _, k := range holds {
		if !strings.HasPrefix(k, l.space.Holds()) {
			return nil, nil, fmt.Errorf("%w: %q is not a hold key (HoldKey)", ErrInvalidKey, k)
		}
		keys = append(keys, k)
	}
	raw, err := l.readRaw(ctx, keys)
	if err != nil {
		return nil, nil, fmt.Errorf("throttle: provider states: %w", err)
	}
	now := l.holdNow()
	vals := make([][]int64, len(keys))
	for i, v := range raw {
		if v == nil {
			continue
		}
		// A breaker's five fields; a hold's until, level, code and since
		// (since absent in keys written before it was kept).
		for _, f := range strings.Split(*v, ":") {
			n, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return nil, nil, fmt.Errorf("throttle: provider states: %w: %q", ErrBadRecord, *v)
			}
			vals[i] = append(vals[i], n)
		}
	}
	bs := make([]Breaker, len(breakers))
	for i := range breakers {
		v := vals[i]
		if len(v) != 5 || v[1] == 0 {
			continue
		}
		until := time.UnixMilli(v[0])
		bs[i] = Breaker{Open: until.After(now), HalfOpen: !until.After(now), Since: time.UnixMilli(v[1]), Until: until, Fails: int(v[2])}
	}
	hs := make([]HoldSpan, len(holds))
	for i := range holds {
		v := vals[len(breakers)+i]
		if len(v) == 0 {
			continue
		}
		if until := time.UnixMilli(v[0]); until.After(now) {
			hs[i].Until = until
			if len(v) >= 4 && v[3] > 0 {
				hs[i].Since = time.UnixMilli(v[3])
			}
		}
	}
	return bs, hs, nil
}
