package throttle

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
)

// Holds: a provider's back-pressure ("429, retry after 5 s") shared by every
// worker. One key per held scope, in the group "hold", holds
// "<until_ms>:<level>:<code>:<since_ms>"; Reserve reads the keys it is given
// (ReserveOptions.Holds) and places no slot before a live hold's end, so
// every queued send is booked after it and nothing is sent meanwhile. The
// key outlives its hold by holdLinger, so a throttling answer soon after a
// hold lifted doubles the next hold (exponential back-off without a
// Retry-After); one during a hold only extends it.

// holdGroup is the group hold keys live in (their Cluster hash tag).
const holdGroup = keyspace.HoldGroup

// holdLinger is how long a hold key outlives its hold: the memory of the
// last hold's level.
const holdLinger = time.Minute

// MaxHold bounds one hold.
const MaxHold = time.Hour

// HoldKey returns the key of a hold on scope (e.g. "sms:provider") and, when
// subject is set, on that subject of it (e.g. a From number, stored as its
// HMAC like every subject).
func (l *Limiter) HoldKey(scope, subject string) string {
	var hashed string
	if subject != "" {
		hashed = l.Subject(subject)
	}
	return l.space.Hold(scope, hashed)
}

// HoldState is a hold as Hold set it.
type HoldState struct {
	// Until is when the hold lifts (Redis time).
	Until time.Time
	// Level counts the holds in a row without a Retry-After: the hold lasted
	// base·2^Level. 0 for a hold the provider's Retry-After set.
	Level int
	// Extended: a live hold was there already and this answer, to a
	// request sent after it began, extended it (Until is the later of the
	// two ends).
	Extended bool
	// InFlight: a live hold was there already and the answered request
	// was on its way when it began: the same news, the hold unchanged.
	InFlight bool
}

// Hold holds key's scope: for retryAfter when the provider said so, else
// for base·2^level (at most max), the level growing with each hold that
// follows another within a minute of its end. A live hold is never
// shortened, and only an answer to a request sent after it began extends
// it: sentAgo is how long before this call the answered request was sent
// (0: just now), and one sent before the hold began was in flight when it
// began — its 429 is the same news, and leaves the hold as it is
// (InFlight, Until unchanged). code is the provider's answer (429, 20429,
// 421, ...), kept for readers.
func (l *Limiter) Hold(ctx context.Context, key string, sentAgo, retryAfter, base, max time.Duration, code int) (HoldState, error) {
	if retryAfter < 0 || base <= 0 || max < base || max > MaxHold || retryAfter > MaxHold || sentAgo < 0 || sentAgo > MaxHold {
		return HoldState{}, fmt.Errorf("%w: hold of %v (base %v, max %v, sent %v ago): want 0–%v, 0 < base ≤ max", ErrInvalidRule, retryAfter, base, max, sentAgo, MaxHold)
	}
	if !strings.HasPrefix(key, l.space.Holds()) {
		return HoldState{}, fmt.Errorf("%w: %q is not a hold key (HoldKey)", ErrInvalidKey, key)
	}
	o := holdOp{hold: key, retry: retryAfter, base: base, max: max, linger: holdLinger, answer: code, sentAgo: sentAgo, events: l.ProviderEvents()}
	_, reply, err := l.batch.do(ctx, l.nowArg(), holdGroup, o.build())
	l.forgetHolds() // its own checks read the hold at once
	if err != nil {
		return HoldState{}, fmt.Errorf("throttle: hold: %w", err)
	}
	if len(reply) != 3 {
		return HoldState{}, fmt.Errorf("throttle: hold: unexpected reply %v", reply)
	}
	return HoldState{Until: time.UnixMilli(reply[0]), Level: int(reply[1]), Extended: reply[2] == 1, InFlight: reply[2] == 2}, nil
}

// HeldUntil reads hold keys (HoldKey) and returns when the last live hold
// among them lifts; zero when none is live. A send admitted before a hold
// began and held back since (a wait for its slot, for an in-flight cap)
// asks it before it goes: the check that admitted it saw no hold. A
// Limiter watching holds answers from memory (WatchHolds).
func (l *Limiter) HeldUntil(ctx context.Context, keys ...string) (time.Time, error) {
	if len(keys) == 0 {
		return time.Time{}, nil
	}
	ends, err := l.readHolds(ctx, keys)
	if err != nil {
		return time.Time{}, err
	}
	return l.lastLive(ends), nil
}

// QueueHolds adds HeldUntil's reads of hold keys to p, for a caller that
// reads them in the same round trip as something else; the function it
// returns, called once p has run, answers what HeldUntil would. A Limiter
// watching holds that has them all in memory adds nothing to p.
func (l *Limiter) QueueHolds(ctx context.Context, p redis.Pipeliner, keys ...string) func() (time.Time, error) {
	vals, keep := l.lookup(keys)
	if keep == nil {
		return func() (time.Time, error) { return l.lastLiveOf(vals) }
	}
	cmds := queueHoldReads(ctx, p, keys)
	return func() (time.Time, error) {
		vals, err := keep(cmds)
		if err != nil {
			return time.Time{}, fmt.Errorf("throttle: read holds: %w", err)
		}
		return l.lastLiveOf(vals)
	}
}

// lastLiveOf is lastLive of hold keys' values.
func (l *Limiter) lastLiveOf(vals []*string) (time.Time, error) {
	ends, err := holdEnds(vals)
	if err != nil {
		return time.Time{}, err
	}
	return l.lastLive(ends), nil
}

// queueHoldReads adds a GET of each key to p ("" keys: none, a nil command).
func queueHoldReads(ctx context.Context, p redis.Pipeliner, keys []string) []*redis.StringCmd {
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		if k != "" {
			cmds[i] = p.Get(ctx, k)
		}
	}
	return cmds
}

// holdNow is the instant holds are judged live at.
func (l *Limiter) holdNow() time.Time {
	if l.now != nil {
		return l.now()
	}
	return time.Now()
}

// lastLive is the latest of ends still ahead; zero when none is.
func (l *Limiter) lastLive(ends []time.Time) time.Time {
	now := l.holdNow()
	var until time.Time
	for _, e := range ends {
		if e.After(now) && e.After(until) {
			until = e
		}
	}
	return until
}

// holdSpans reads hold keys (a Cluster's check reads them before its own
// script call, or has them from memory: WatchHolds) as closed spans ending
// when each live hold lifts.
func (l *Limiter) holdSpans(ctx context.Context, keys []string) ([]Interval, error) {
	ends, err := l.readHolds(ctx, keys)
	if err != nil {
		return nil, err
	}
	now := l.holdNow()
	var out []Interval
	for _, end := range ends {
		if end.After(now) {
			out = append(out, Interval{Start: time.UnixMilli(1), End: end})
		}
	}
	return out, nil
}
