package throttle

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// In-flight caps: at most Max sends of a scope at once, across every worker.
// One sorted set per capped subject holds leases: member = the holder (a
// send's id and attempt), score = when the lease lapses. Acquiring trims
// lapsed leases first, so a killed worker's slots come back once its leases
// lapse (the worker renews a lease while its send runs and frees it after).

// Cap is an in-flight cap: at most Max sends at once for Subject of Scope.
type Cap struct {
	Scope   string // e.g. "sms:provider"
	Subject string // "" for the scope itself; stored as its HMAC
	Group   string // the group its key lives in (e.g. plans.SharedGroup)
	Max     int    // 1..MaxLimit
}

// String prints the cap, e.g. "sms:provider concurrency 100".
func (c Cap) String() string { return c.Scope + " concurrency " + strconv.Itoa(c.Max) }

// CapKey returns the key of c's leases: prefix:{group}:scope:inflight[:hmac(subject)].
func (l *Limiter) CapKey(group string, c Cap) (string, error) {
	if c.Group != "" {
		group = c.Group
	}
	if err := checkGroup(group); err != nil {
		return "", err
	}
	if err := checkScope(c.Scope); err != nil {
		return "", err
	}
	if c.Max < 1 || c.Max > MaxLimit {
		return "", fmt.Errorf("%w: concurrency %d must be between 1 and %d", ErrInvalidRule, c.Max, MaxLimit)
	}
	var hashed string
	if c.Subject != "" {
		hashed = l.Subject(c.Subject)
	}
	return l.space.Inflight(group, c.Scope, hashed), nil
}

// Lease is the answer of Acquire.
type Lease struct {
	// Granted: the holder holds a slot of every cap until Until.
	Granted bool
	// Full is the index of the cap that had no slot (Granted false).
	Full int
	// Lapse is, when a cap was full, when its next lease lapses (Redis
	// time): the latest a slot comes back if no holder frees one first.
	Lapse time.Time
	// Until is when the leases lapse unless renewed.
	Until time.Time
}

// Acquire takes (or renews: the same holder asking again) a slot of every
// cap for holder, for ttl — all or none. A holder whose lease lapsed asks as
// a new one.
func (l *Limiter) Acquire(ctx context.Context, group, holder string, ttl time.Duration, caps ...Cap) (Lease, error) {
	if err := checkMember(holder); err != nil {
		return Lease{}, err
	}
	if ttl < time.Millisecond || ttl > time.Hour {
		return Lease{}, fmt.Errorf("%w: lease ttl %v must be 1ms–1h", ErrInvalidRule, ttl)
	}
	parts, err := l.capParts(group, caps)
	if err != nil {
		return Lease{}, err
	}
	for pi, p := range parts {
		o := leaseOp{leases: p.keys, holder: holder, ttl: ttl, caps: p.caps}
		now, reply, err := l.batch.do(ctx, l.nowArg(), p.group, o.build())
		if err == nil && len(reply) != 3 {
			err = fmt.Errorf("unexpected reply %v", reply)
		}
		if err != nil {
			l.freeParts(ctx, holder, parts[:pi])
			return Lease{}, fmt.Errorf("throttle: acquire: %w", err)
		}
		if reply[0] != 1 {
			l.freeParts(ctx, holder, parts[:pi]) // all or none across groups
			return Lease{Full: p.index[reply[1]-1], Lapse: time.UnixMilli(reply[2])}, nil
		}
		if pi == len(parts)-1 {
			return Lease{Granted: true, Until: time.UnixMilli(now).Add(ttl)}, nil
		}
	}
	return Lease{Granted: true}, nil // no caps
}

// Free gives holder's slots of caps back.
func (l *Limiter) Free(ctx context.Context, group, holder string, caps ...Cap) error {
	parts, err := l.capParts(group, caps)
	if err != nil {
		return err
	}
	return l.freeParts(ctx, holder, parts)
}

type capPart struct {
	group string
	keys  []string
	caps  []Cap
	index []int
}

// capParts groups caps by the group their keys live in: one part on a
// single node, one per group on a Cluster.
func (l *Limiter) capParts(group string, caps []Cap) ([]capPart, error) {
	if len(caps) > MaxRules {
		return nil, fmt.Errorf("%w: at most %d caps, got %d", ErrTooManyRules, MaxRules, len(caps))
	}
	var parts []capPart
	at := map[string]int{}
	for i, c := range caps {
		k, err := l.CapKey(group, c)
		if err != nil {
			return nil, fmt.Errorf("cap %d (%s): %w", i, c.Scope, err)
		}
		g := group
		if l.batch.cluster && c.Group != "" {
			g = c.Group
		}
		j, ok := at[g]
		if !ok {
			j = len(parts)
			at[g] = j
			parts = append(parts, capPart{group: g})
		}
		parts[j].keys = append(parts[j].keys, k)
		parts[j].caps = append(parts[j].caps, c)
		parts[j].index = append(parts[j].index, i)
	}
	return parts, nil
}

func (l *Limiter) freeParts(ctx context.Context, holder string, parts []capPart) error {
	var first error
	for _, p := range parts {
		o := freeOp{leases: p.keys, holder: holder}
		if _, _, err := l.batch.do(ctx, l.nowArg(), p.group, o.build()); err != nil && first == nil {
			first = fmt.Errorf("throttle: free: %w", err)
		}
	}
	return first
}
