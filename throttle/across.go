package throttle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// agreeLead is how far ahead of now a check across groups aims its first
// placement, and how far in the past the later groups still take that
// instant (time moves on between the calls; a send that goes up to this
// late is within the send slack of a deployment that sets one).
const agreeLead = 20 * time.Millisecond

// maxAgreeLead bounds how far ahead a check across groups aims once its
// rounds kept missing each other only because time moved on between the
// calls (a starved client, a loaded node: calls further apart than the
// lead): each such round doubles the aim, up to this. Only the aim moves
// further ahead; a send still goes no later than agreeLead after the
// instant it is admitted for.
const maxAgreeLead = time.Second

// ErrNoAgreement reports a check across groups whose groups kept pushing
// the slot past each other; nothing is left admitted. Retrying is safe.
var ErrNoAgreement = errors.New("throttle: the groups of a check did not agree on a slot")

// reserveAcross is Reserve on Redis Cluster for limits in several groups
// (one script cannot touch keys of several slots). The other groups place
// the send first, in a fixed order, each at the earliest slot it takes from
// the latest slot so far (and at least agreeLead after its clock's now, so
// that the last group can still admit that very instant), until they
// agree; then the id's own group
// reserves from that slot, with its record. If it answers later still, its
// reservation is rolled back and the round repeats from there. A send is
// admitted only when every group holds it at the same instant, so no window
// is ever over its limit; placements of a round that failed are rolled back.
func (l *Limiter) reserveAcross(ctx context.Context, group, id string, policy RerunPolicy, opts ReserveOptions, limits []Limit) (Decision, error) {
	parts := l.byGroup(group, limits)
	own, others := parts[0], parts[1:]
	attempt, d, final, err := l.attemptOf(ctx, group, id, policy)
	if err != nil || final {
		return d, err
	}
	member := l.stored(id)
	if attempt > 1 {
		member += "#" + strconv.Itoa(attempt)
	}
	rollback := func() {
		for _, p := range others {
			_, _ = l.release(context.WithoutCancel(ctx), p, id, attempt)
		}
	}
	a := aim{t: opts.NotBefore, rule: -1, lead: agreeLead}
	for round := 0; round < 8; round++ {
		for moved := true; moved; {
			moved = false
			for _, p := range others {
				x, r, err := l.place(ctx, p, member, a.t, opts)
				if err != nil {
					rollback()
					return Decision{}, err
				}
				moved = a.take(x, r, p.index) || moved
			}
		}
		t := a.t
		o := opts
		o.NotBefore, o.late = t, agreeLead
		d, err := l.reserve(ctx, group, id, policy, o, own.limits)
		if err != nil {
			if errors.Is(err, ErrNotReplicated) && d.Attempt > 0 {
				// Admitted in the own group but not acknowledged: nothing
				// will be sent on it, so give it back like the others.
				_, _ = l.release(context.WithoutCancel(ctx), own, id, d.Attempt)
			}
			rollback()
			return Decision{}, err
		}
		if d.DeniedBy >= 0 {
			d.DeniedBy = own.index[d.DeniedBy]
		} else if d.Wait > 0 && d.At.Equal(t) {
			d.DeniedBy = a.rule
		}
		switch d.Status {
		case StatusAdmitted, StatusBooked, StatusDenied:
			if !d.At.After(t) || d.Status == StatusDenied {
				if d.Status == StatusDenied {
					rollback()
				}
				return d, nil
			}
			// The own group answered later than the others agreed: move them.
			if _, err := l.release(ctx, own, id, d.Attempt); err != nil {
				rollback()
				return Decision{}, err
			}
			a.ownLater(d)
		default:
			rollback()
			return d, nil
		}
	}
	rollback()
	return Decision{}, ErrNoAgreement
}

// aim is the slot a check across groups asks every group for, and why.
type aim struct {
	t      time.Time
	rule   int           // the limit that last moved it (in the check's order; -1: none)
	lead   time.Duration // how far ahead a move made by time alone aims (ahead)
	placed bool          // t is a slot a group gave (not the caller's NotBefore)
}

// take records a group's slot x, set by its limit r (-1: none; index maps
// the group's limits to the check's), and reports whether the aim moved.
func (a *aim) take(x time.Time, r int, index []int) bool {
	placed := a.placed
	a.placed = true
	switch {
	case !x.After(a.t):
		return false
	case r < 0 && placed:
		// No rule moved it: t was past when the group read it (time moved
		// on between the calls). Aim ahead, further each time, or a slow
		// client chases the clock for good.
		a.ahead(x)
	case r < 0:
		a.t = x
	default:
		a.t, a.rule = x, index[r]
	}
	return true
}

// ownLater moves the aim to the own group's answer d, later than a.t.
func (a *aim) ownLater(d Decision) {
	switch {
	case d.DeniedBy >= 0 && d.At.After(d.Now):
		// One of its rules set the slot: that instant, exactly (a move of
		// a few ms is a window's end, not the clock).
		a.t, a.rule = d.At, d.DeniedBy
	case d.At.Sub(a.t) < agreeLead || !d.At.After(d.Now):
		// Only the clock moved on between the calls (or the nodes' clocks
		// differ a little; or t was past when the own group read it, which
		// then admits its now): aim every group at one instant ahead,
		// which the own group admits for that instant.
		a.ahead(d.At)
	default:
		a.t = d.At
	}
}

// ahead aims lead past x and doubles the lead (up to maxAgreeLead).
func (a *aim) ahead(x time.Time) {
	a.t = x.Add(a.lead)
	a.lead = min(2*a.lead, maxAgreeLead)
}

// attemptOf reads which attempt a reservation of id would be, and answers
// for the ids that need no slot (done; an unknown outcome under
// AtMostOnce or Idempotent), stamped with the Redis clock of id's group.
func (l *Limiter) attemptOf(ctx context.Context, group, id string, policy RerunPolicy) (int, Decision, bool, error) {
	o := stateOp{state: l.StateKey(group, id)}
	nowMS, reply, err := l.batch.do(ctx, l.nowArg(), group, o.build())
	if err != nil {
		return 0, Decision{}, false, fmt.Errorf("throttle: check: %w", err)
	}
	if len(reply) != 3 {
		return 0, Decision{}, false, fmt.Errorf("throttle: check: unexpected state reply %v", reply)
	}
	kind, k, at := RecordKind(reply[0]), int(reply[1]), time.UnixMilli(reply[2])
	if kind == 0 {
		return 1, Decision{}, false, nil
	}
	if k < 1 {
		return 0, Decision{}, false, fmt.Errorf("throttle: check: %w: attempt %d", ErrBadRecord, k)
	}
	now := time.UnixMilli(nowMS)
	switch {
	case kind == RecordDone:
		return k, Decision{Status: StatusDone, Done: true, Attempt: k, DeniedBy: -1, RetryAfter: -1, Now: now, At: at}, true, nil
	case kind == RecordAdmitted && policy == AtMostOnce:
		return k, Decision{Status: StatusUnknown, Attempt: k, DeniedBy: -1, RetryAfter: -1, Now: now, At: at}, true, nil
	case kind == RecordAdmitted && policy == Idempotent:
		return k, Decision{Status: StatusDuplicate, Allowed: true, Duplicate: true, Attempt: k, DeniedBy: -1, RetryAfter: -1, Now: now, At: at}, true, nil
	case kind == RecordAdmitted:
		return k + 1, Decision{}, false, nil
	}
	return k, Decision{}, false, nil
}

// place puts member in one group's limits at the earliest slot from t on
// and returns it, with the index of the limit that set it (-1: none, the
// slot is t, or the group's now when t was past).
func (l *Limiter) place(ctx context.Context, p part, member string, t time.Time, opts ReserveOptions) (time.Time, int, error) {
	keys := make([]string, len(p.limits))
	for i, lim := range p.limits {
		k, err := l.Key(p.group, lim)
		if err != nil {
			return time.Time{}, 0, err
		}
		keys[i] = k
	}
	o := placeOp{rules: keys, member: member, slack: opts.Slack, tmin: t, lead: agreeLead, limits: p.limits, closed: opts.Closed}
	_, reply, err := l.batch.do(ctx, l.nowArg(), p.group, o.build())
	if err != nil {
		return time.Time{}, 0, fmt.Errorf("throttle: check: %w", err)
	}
	if len(reply) != 2 || reply[1] < 0 || int(reply[1]) > len(p.limits) {
		return time.Time{}, 0, fmt.Errorf("throttle: check: unexpected place reply %v", reply)
	}
	return time.UnixMilli(reply[0]), int(reply[1]) - 1, nil
}

// release removes one attempt's entries from one group's limits (and, in
// the id's own group, rolls its record back).
func (l *Limiter) release(ctx context.Context, p part, id string, attempt int) (int, error) {
	return l.Release(ctx, p.group, id, attempt, groupLimits(p)...)
}

// groupLimits returns a part's limits pinned to its group, so Release
// routes them there.
func groupLimits(p part) []Limit {
	out := make([]Limit, len(p.limits))
	for i, lim := range p.limits {
		lim.Group = p.group
		out[i] = lim
	}
	return out
}
