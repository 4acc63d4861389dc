package throttle

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
)

// DefaultPrefix starts every key the limiter writes. The "1" is the key
// layout's version: a new layout gets a new prefix and the old keys expire
// with their windows.
const DefaultPrefix = keyspace.DefaultPrefix

// defaultWaitTimeout is Options.WaitTimeout's default.
const defaultWaitTimeout = 500 * time.Millisecond

var (
	// ErrNoSecret reports a limiter built without an HMAC secret for subjects.
	ErrNoSecret = errors.New("throttle: a subject secret of at least 16 bytes is required")
	// ErrClosed reports a call on a closed Limiter.
	ErrClosed = errors.New("throttle: limiter closed")
	// ErrOutOfMemory reports a check Redis refused because it is at its
	// maxmemory under the noeviction policy: nothing was written. Retrying
	// once memory is freed is safe.
	ErrOutOfMemory = errors.New("throttle: redis is out of memory (maxmemory reached, noeviction): nothing was written")
	// ErrNotReplicated reports an admission that fewer than
	// Options.WaitReplicas replicas acknowledged within Options.WaitTimeout.
	// The admission may be lost if its master fails now: the caller must
	// not send. Retrying with the same ReserveOptions.Nonce is safe: the run
	// gets its own admission back and waits for the replicas again.
	ErrNotReplicated = errors.New("throttle: admission not acknowledged by enough Redis replicas")
)

// Limit applies a Rule to one subject of a group: "at most 1 SMS per minute
// to this recipient of tenant acme".
type Limit struct {
	// Scope names what is limited, e.g. "sms:recipient" or "email:tenant":
	// 1–64 characters of a–z, 0–9, '.', '_', '-', ':'.
	Scope string
	// Subject is who is limited within the group, e.g. a normalised phone
	// number. It is stored only as an HMAC, never in clear. Empty means the
	// group itself (a tenant-wide rule).
	Subject string
	// Rule is the quota.
	Rule Rule
	// Group, when set, keys this limit in another group than the check's
	// (e.g. a sender number shared by every tenant). On Redis Cluster a
	// check whose limits span groups takes them one group at a time.
	Group string
	// Drop makes a full window drop the send (StatusDropped) instead of
	// deferring it (Reserve only).
	Drop bool
	// Distinct is the subject a distinct-count rule (Rule.Distinct) counts,
	// e.g. the normalised recipient: stored only as an HMAC. Reserve needs it
	// for such a rule; Usage may leave it empty.
	Distinct string
}

// String prints the limit without its subject, e.g. "sms:recipient 1/1m".
func (l Limit) String() string { return l.Scope + " " + l.Rule.String() }

// Options configure a Limiter. The zero value of each field is its default.
type Options struct {
	// Secret keys the HMAC that subjects are stored as. Required, ≥ 16 bytes.
	// Changing it starts every subject's window afresh (old keys expire).
	Secret []byte
	// Prefix starts every key. Default DefaultPrefix.
	Prefix string
	// Now, for tests and tools only, replaces the Redis server clock. Left
	// nil (the default), every decision uses Redis TIME, so worker clocks
	// never decide a window.
	Now func() time.Time
	// Clock is the host clock used only to turn RetryAfter into RetryAt.
	// Default time.Now. It never affects admission.
	Clock func() time.Time
	// CompactMembers stores each member as the first 6 bytes of its
	// SHA-256 instead of in full: about 20 bytes per entry instead of ~54
	// for a UUID member (docs/redis.md, "Memory and capacity"). Admission stays idempotent (the
	// same member maps to the same 6 bytes); two members of one window
	// collide with probability about n²/2⁴⁹ (n = entries in the window:
	// 2·10⁻¹¹ at n = 100, 2·10⁻⁹ at n = 1,000), which would undercount by
	// one. Changing it on a live deployment makes members admitted before
	// the change look new for one window.
	CompactMembers bool
	// Direct sends every call in its own round trip. By default concurrent
	// calls of one Limiter are coalesced: whatever is waiting when a
	// connection frees travels as one script call (no added latency when
	// idle).
	Direct bool
	// Pipelines is how many coalesced batches may be in flight at once.
	// Default 2.
	Pipelines int
	// MaxBatch bounds the calls of one batch. Default 32.
	MaxBatch int
	// WaitReplicas, when above 0, makes every check that admits wait until
	// this many replicas of its Redis master have acknowledged the
	// admission: the script and a WAIT travel as one pipeline on one
	// connection (WAIT is not allowed inside a script), on a Cluster to
	// the master of the check's slot. An admission acknowledged by fewer
	// within WaitTimeout is an error wrapping ErrNotReplicated, and is
	// given back (as Release would), so a failover cannot lose an
	// admission its caller acted on (Redis replicates asynchronously). Checks that admit nothing, MarkDone and
	// Release do not wait. Default 0: no wait. Needs a single-node or a
	// Cluster client.
	WaitReplicas int
	// WaitTimeout bounds the wait for replicas; it must be shorter than
	// the client's ReadTimeout (5 s by default). Default 500ms.
	WaitTimeout time.Duration
	// DoneLinger lets MarkDone wait up to this long for another call of
	// the Limiter (the next check) to carry its record in the same script
	// call — one round trip for both — before it goes alone. MarkDone still
	// returns only once the record is written. Ignored with Direct.
	// Default 0: the record goes at once.
	DoneLinger time.Duration
}

// Limiter is an exact sliding-window-log limiter in Redis: one sorted set per
// limited subject and rule, one Lua script per check. It is safe for
// concurrent use. Close it to stop its batching goroutines.
type Limiter struct {
	client  redis.UniversalClient
	linger  time.Duration
	space   keyspace.Space
	secret  []byte
	now     func() time.Time
	clock   func() time.Time
	compact bool
	macs    *sync.Pool // of HMAC-SHA256 keyed with secret: hmac.New per key is a hot-path cost
	batch   *batcher
	holds   atomic.Pointer[holdCache] // set while WatchHolds runs (a Cluster's)
}

// New returns a Limiter over any go-redis client (single node, Sentinel, Cluster).
func New(client redis.UniversalClient, opts Options) (*Limiter, error) {
	if client == nil {
		return nil, errors.New("throttle: nil redis client")
	}
	if len(opts.Secret) < 16 {
		return nil, ErrNoSecret
	}
	if opts.WaitReplicas < 0 || opts.WaitTimeout < 0 {
		return nil, fmt.Errorf("throttle: WaitReplicas %d and WaitTimeout %v must not be negative", opts.WaitReplicas, opts.WaitTimeout)
	}
	if opts.WaitReplicas > 0 {
		var read time.Duration
		switch c := client.(type) {
		case *redis.Client:
			read = c.Options().ReadTimeout
		case *redis.ClusterClient:
			read = c.Options().ReadTimeout
		default:
			return nil, fmt.Errorf("throttle: WaitReplicas needs a single-node or Cluster client, not %T", client)
		}
		if wt := cmp.Or(opts.WaitTimeout, defaultWaitTimeout); read > 0 && wt >= read {
			return nil, fmt.Errorf("throttle: WaitTimeout %v must be shorter than the client's ReadTimeout %v", wt, read)
		}
	}
	if opts.DoneLinger < 0 || opts.DoneLinger > time.Minute {
		return nil, fmt.Errorf("throttle: DoneLinger %v must be 0–1m", opts.DoneLinger)
	}
	l := &Limiter{client: client, linger: opts.DoneLinger, space: keyspace.Space{Prefix: cmp.Or(opts.Prefix, DefaultPrefix)}, secret: append([]byte(nil), opts.Secret...), now: opts.Now, clock: opts.Clock, compact: opts.CompactMembers}
	if l.clock == nil {
		l.clock = time.Now
	}
	l.macs = &sync.Pool{New: func() any { return hmac.New(sha256.New, l.secret) }}
	l.batch = newBatcher(client, opts)
	return l, nil
}

// Close stops coalescing; calls after Close fail with ErrClosed. It does not
// close the Redis client.
func (l *Limiter) Close() error {
	l.batch.close()
	return nil
}

// Allow checks every limit of the group at once and, only if all have room,
// admits member into all of them (all-or-nothing, one script, one round
// trip). member must be stable for the thing being sent (its notification
// id): asking again for a member already admitted returns Allowed and
// Duplicate without counting twice. A denial adds nothing and says when the
// entry that has to leave the window will have left it.
func (l *Limiter) Allow(ctx context.Context, group, member string, limits ...Limit) (Decision, error) {
	if err := checkMember(member); err != nil {
		return Decision{}, err
	}
	if l.batch.cluster && spansGroups(group, limits) {
		return Decision{}, fmt.Errorf("%w: on Redis Cluster, Allow's limits must live in the check's group (Reserve takes limits of several groups)", ErrInvalidKey)
	}
	for _, lim := range limits {
		if lim.Rule.Counter() || lim.Rule.Distinct {
			return Decision{}, fmt.Errorf("%w: %s is a calendar, bucketed or distinct-count rule: it keeps counts or subjects, not members, so only Reserve (with its record per id) can check it", ErrInvalidRule, lim)
		}
	}
	d, err := l.reserve(ctx, group, member, "", ReserveOptions{}, limits)
	if err != nil {
		return Decision{}, err
	}
	return d, nil
}

// Reserve is the check of a sender that keeps a record per id: it admits
// the id now, admits it for an instant up to opts.Horizon ahead, books a
// later slot (opts.Book), or denies it. The slot is the earliest instant at
// which every limit keeps its window — bookings of others included — so a
// limit far from full never delays a send, and a send that fits every
// window now goes now.
//
// The id's state (booked, admitted, done) lives in one key of the group:
// asking again with a booked id takes its booking back and places it again
// (from about its slot on, that admits it); an admitted id that was neither
// marked done (MarkDone) nor released (Release) is handled by opts.Policy.
func (l *Limiter) Reserve(ctx context.Context, group, id string, opts ReserveOptions, limits ...Limit) (Decision, error) {
	if err := checkMember(id); err != nil {
		return Decision{}, err
	}
	switch opts.Policy {
	case "":
		opts.Policy = AtLeastOnce
	case AtLeastOnce, AtMostOnce, Idempotent:
	default:
		return Decision{}, fmt.Errorf("%w: unknown re-run policy %q", ErrInvalidRule, opts.Policy)
	}
	if l.batch.cluster && len(opts.Holds) > 0 {
		// Hold keys live in their own slot: read them first, as closed spans.
		closed, err := l.holdSpans(ctx, opts.Holds)
		if err != nil {
			return Decision{}, err
		}
		opts.Closed = append(closed, opts.Closed...)
		opts.Holds = nil
	}
	if l.batch.cluster && spansGroups(group, limits) {
		for _, lim := range limits {
			if (lim.Rule.Counter() || lim.Rule.Distinct) && lim.Group != "" && lim.Group != group {
				return Decision{}, fmt.Errorf("%w: on Redis Cluster a calendar, bucketed or distinct-count rule must live in the check's group (%s lives in %q)", ErrInvalidRule, lim, lim.Group)
			}
		}
		return l.reserveAcross(ctx, group, id, opts.Policy, opts, limits)
	}
	d, err := l.reserve(ctx, group, id, opts.Policy, opts, limits)
	if err != nil {
		if errors.Is(err, ErrNotReplicated) && d.Status == StatusAdmitted && d.Attempt > 0 {
			// Admitted but not acknowledged: nothing will be sent on it.
			// Give it back at once, as reserveAcross does: held while the
			// replicas catch up (a failover takes seconds) it would have
			// every other check booked behind it, and by the time it was
			// acknowledged its slot would be too old to send on.
			_, _ = l.Release(context.WithoutCancel(ctx), group, id, d.Attempt, limits...)
		}
		return Decision{}, err
	}
	return d, nil
}

func (l *Limiter) reserve(ctx context.Context, group, id string, policy RerunPolicy, opts ReserveOptions, limits []Limit) (Decision, error) {
	o, err := l.reserveOp(group, id, policy, opts, limits)
	if err != nil {
		return Decision{}, err
	}
	now, reply, err := l.batch.doSeated(ctx, opts.Seat, l.nowArg(), group, o.build())
	if err != nil && (!errors.Is(err, ErrNotReplicated) || reply == nil) {
		return Decision{}, fmt.Errorf("throttle: check: %w", err)
	}
	if len(reply) != 6 && !(len(reply) == 9 && reply[0] == int64(StatusBlocked)) {
		return Decision{}, fmt.Errorf("throttle: check: unexpected reply of %d values", len(reply))
	}
	d := Decision{Now: time.UnixMilli(now)}
	if err := d.fill(reply, len(limits), l.clock); err != nil {
		return Decision{}, fmt.Errorf("throttle: check: %w", err)
	}
	if err != nil {
		// Not acknowledged: the decision is returned beside the error only
		// for reserveAcross, which gives the admission back; the public
		// methods return none.
		return d, fmt.Errorf("throttle: check: %w", err)
	}
	return d, nil
}

// reserveOp checks a check's options and names its keys: the encoder of its
// "R" operation.
func (l *Limiter) reserveOp(group, id string, policy RerunPolicy, opts ReserveOptions, limits []Limit) (*reserveOp, error) {
	if err := checkGroup(group); err != nil {
		return nil, err
	}
	if opts.Slack < 0 || opts.Slack > MaxWindow || opts.Horizon < 0 || opts.Horizon > time.Hour {
		return nil, fmt.Errorf("%w: slack %v must be 0–%v and horizon %v 0–1h", ErrInvalidRule, opts.Slack, MaxWindow, opts.Horizon)
	}
	if len(opts.Closed) > 64 {
		return nil, fmt.Errorf("%w: %d closed intervals, at most 64", ErrInvalidRule, len(opts.Closed))
	}
	var keys []string
	if len(limits) > 0 || policy == "" {
		var err error
		if keys, err = l.keys(group, limits); err != nil {
			return nil, err
		}
	}
	var longest time.Duration
	for _, lim := range limits {
		longest = max(longest, lim.Rule.Window)
		if lim.Rule.Distinct && lim.Distinct == "" {
			return nil, fmt.Errorf("%w: %s counts distinct subjects: the limit must name its subject (Limit.Distinct)", ErrInvalidKey, lim)
		}
	}
	sttl := max(opts.StateTTL, longest+opts.Slack, time.Second) // a check with no limits still keeps its record a while
	if len(opts.Nonce) > 32 || strings.ContainsAny(opts.Nonce, ":# ") {
		return nil, fmt.Errorf("%w: nonce must be up to 32 bytes without ':', '#' or spaces", ErrInvalidKey)
	}
	for _, iv := range opts.Closed {
		if !iv.End.After(iv.Start) {
			return nil, fmt.Errorf("%w: closed interval %v–%v is empty", ErrInvalidRule, iv.Start, iv.End)
		}
	}
	if cc := opts.Consent; cc != nil && (cc.Key == "" || cc.Category == "" || (cc.LastKey != "") != (cc.LastTTL > 0)) {
		return nil, fmt.Errorf("%w: a consent check needs its key and category, and a last-category key with its TTL or neither", ErrInvalidRule)
	}
	if note := opts.Note; note != nil && (note.Key == "" || note.TTL < time.Millisecond) {
		return nil, fmt.Errorf("%w: a note needs its key and a TTL of at least 1 ms", ErrInvalidRule)
	}
	o := &reserveOp{rules: keys, member: l.stored(id), policy: policy, limits: limits, opts: opts, stateTTL: sttl, table: l.tableFrom, subject: l.Subject}
	if policy != "" {
		o.state = l.StateKey(group, id)
	} else if opts.Block != "" || opts.Consent != nil || opts.Note != nil || len(opts.Holds) > 0 {
		return nil, fmt.Errorf("%w: a block key, hold, note or consent check needs a state policy (Reserve)", ErrInvalidRule)
	}
	return o, nil
}

// MarkDone records that attempt of id in group finished (its send
// completed), for ttl: until then Reserve answers Done for the id and counts
// nothing, so a task re-run after its send does not send again.
func (l *Limiter) MarkDone(ctx context.Context, group, id string, attempt int, ttl time.Duration) error {
	if err := checkMember(id); err != nil {
		return err
	}
	if err := checkGroup(group); err != nil {
		return err
	}
	if ttl < time.Millisecond || attempt < 1 {
		return fmt.Errorf("%w: done ttl %v must be at least 1ms and attempt %d at least 1", ErrInvalidRule, ttl, attempt)
	}
	o := doneOp{state: l.StateKey(group, id), attempt: attempt, ttl: ttl}
	_, _, err := l.batch.doCarried(ctx, l.nowArg(), group, o.build(), l.linger)
	if err != nil {
		return fmt.Errorf("throttle: mark done: %w", err)
	}
	return nil
}

// Release gives back the slot (admission or booking) that attempt of id took
// in the given limits: for a send that definitely did not happen. It reports
// how many windows held it. An id admitted by Allow is attempt 1.
func (l *Limiter) Release(ctx context.Context, group, id string, attempt int, limits ...Limit) (int, error) {
	return l.releaseIn(ctx, group, id, attempt, false, limits)
}

// releaseIn is Release, or Forget when keep: then the record named is one
// never written (StateKey + "#": '#' is in no member), so it stays as it is.
func (l *Limiter) releaseIn(ctx context.Context, group, id string, attempt int, keep bool, limits []Limit) (int, error) {
	if err := checkMember(id); err != nil {
		return 0, err
	}
	if attempt < 1 {
		return 0, fmt.Errorf("%w: attempt %d must be at least 1", ErrInvalidRule, attempt)
	}
	if err := checkGroup(group); err != nil {
		return 0, err
	}
	if len(limits) > MaxRules {
		return 0, fmt.Errorf("%w: a check takes at most %d limits, got %d", ErrTooManyRules, MaxRules, len(limits))
	}
	removed := 0
	for _, part := range l.byGroup(group, limits) {
		keys := make([]string, 0, len(part.limits))
		for i, lim := range part.limits {
			k, err := l.Key(group, lim)
			if err != nil {
				return 0, fmt.Errorf("limit %d (%s): %w", i, lim.Scope, err)
			}
			keys = append(keys, k)
		}
		// The id's record lives in its own group; elsewhere the key named is never written.
		state := l.StateKey(part.group, id)
		if keep {
			state += "#"
		}
		o := releaseOp{rules: keys, state: state, member: l.stored(id), attempt: attempt, limits: part.limits, table: l.tableFrom, subject: l.Subject}
		_, reply, err := l.batch.do(ctx, l.nowArg(), part.group, o.build())
		if err != nil {
			return removed, fmt.Errorf("throttle: release: %w", err)
		}
		if len(reply) != 1 {
			return removed, fmt.Errorf("throttle: release: unexpected reply %v", reply)
		}
		removed += int(reply[0])
	}
	return removed, nil
}

// Forget takes attempt's entries of id out of the sliding logs of limits,
// leaving id's record as it is: for a booking the send no longer uses
// because it is being sent through another provider (its record now holds
// that send's admission or booking, which must stay). The caller must know
// the attempt was never admitted under these limits — an attempt that was
// is asked again as an unknown outcome and never comes back admitted under
// the same number — so Forget only ever removes bookings, and no window
// goes over. A bucketed or distinct rule is left as it is: its count cannot
// be taken back without the booking's slot, so it keeps the booking until
// its window passes (under-use, never over). It reports how many entries
// it removed.
func (l *Limiter) Forget(ctx context.Context, group, id string, attempt int, limits ...Limit) (int, error) {
	logs := make([]Limit, 0, len(limits))
	for _, lim := range limits {
		if !lim.Rule.Counter() && !lim.Rule.Distinct {
			logs = append(logs, lim)
		}
	}
	if len(logs) == 0 {
		return 0, nil
	}
	return l.releaseIn(ctx, group, id, attempt, true, logs)
}

// part is the limits of a check that live in one group.
type part struct {
	group  string
	limits []Limit
	index  []int // each limit's index in the check
}

// byGroup splits limits by the group their keys live in: one part on a
// single node (a script may touch any key there), one per group on a
// Cluster, the check's own group first.
func (l *Limiter) byGroup(group string, limits []Limit) []part {
	if !l.batch.cluster || !spansGroups(group, limits) {
		idx := make([]int, len(limits))
		for i := range idx {
			idx[i] = i
		}
		return []part{{group: group, limits: limits, index: idx}}
	}
	parts := []part{{group: group}}
	at := map[string]int{group: 0}
	for i, lim := range limits {
		g := group
		if lim.Group != "" {
			g = lim.Group
		}
		j, ok := at[g]
		if !ok {
			j = len(parts)
			at[g] = j
			parts = append(parts, part{group: g})
		}
		parts[j].limits = append(parts[j].limits, lim)
		parts[j].index = append(parts[j].index, i)
	}
	slices.SortFunc(parts[1:], func(a, b part) int { return strings.Compare(a.group, b.group) })
	return parts
}

// spansGroups reports whether a limit lives outside the check's group.
func spansGroups(group string, limits []Limit) bool {
	for _, lim := range limits {
		if lim.Group != "" && lim.Group != group {
			return true
		}
	}
	return false
}

// Usage is one limit's state, read without changing it.
type Usage struct {
	Limit Limit
	// Used is the number of admissions inside the window now.
	Used int
	// Remaining is how many more the window takes now.
	Remaining int
	// Oldest is the oldest admission inside the window; zero when none.
	Oldest time.Time
	// NextFree is the earliest slot one more send would get from this limit
	// alone (bookings included): Now when there is room already.
	NextFree time.Time
	// Booked is the number of slots booked after Now.
	Booked int
	// ResetAt is when the window is empty again, bookings included: Now when it is empty.
	ResetAt time.Time
	// Now is the time the state was read at.
	Now time.Time
}

// Load puts the limiter's function library on the server (on every
// master of a Cluster) ahead of the first check, so that check does not
// pay for it: a process that starts loads it once. A server without
// functions is remembered (checks run the script); any other error is
// returned, and the first check loads the library as it always does.
func (l *Limiter) Load(ctx context.Context) error {
	b := l.batch
	if b.mode.Load() != modeFunction {
		return nil
	}
	err := b.load(ctx, b.client)
	if noFunctions(err) {
		b.mode.Store(modeScript)
		return nil
	}
	return err
}

// Usage reads the state of each limit of the group, with the slack Reserve
// uses (0 for Allow). It writes nothing.
func (l *Limiter) Usage(ctx context.Context, group string, slack time.Duration, limits ...Limit) ([]Usage, error) {
	if _, err := l.keys(group, limits); err != nil {
		return nil, err
	}
	out := make([]Usage, len(limits))
	for _, p := range l.byGroup(group, limits) {
		if len(p.limits) == 0 {
			continue
		}
		us, err := l.usage(ctx, p.group, slack, p.limits)
		if err != nil {
			return nil, err
		}
		for i, u := range us {
			u.Limit = limits[p.index[i]]
			out[p.index[i]] = u
		}
	}
	return out, nil
}

func (l *Limiter) usage(ctx context.Context, group string, slack time.Duration, limits []Limit) ([]Usage, error) {
	keys, err := l.keys(group, limits)
	if err != nil {
		return nil, err
	}
	o := usageOp{rules: keys, slack: slack, limits: limits, table: l.tableFrom, subject: l.Subject}
	nowMS, reply, err := l.batch.do(ctx, l.nowArg(), group, o.build())
	if err != nil {
		return nil, fmt.Errorf("throttle: usage: %w", err)
	}
	if len(reply) != 5*len(limits) {
		return nil, fmt.Errorf("throttle: usage: unexpected reply of %d values", len(reply))
	}
	now := time.UnixMilli(nowMS)
	out := make([]Usage, len(limits))
	for i, lim := range limits {
		r := reply[5*i : 5*i+5]
		used, booked, oldest, newest, next := r[0], r[1], r[2], r[3], r[4]
		u := Usage{Limit: lim, Used: int(used), Booked: int(booked), Remaining: max(0, lim.Rule.Limit-int(used)),
			NextFree: time.UnixMilli(next), ResetAt: now, Now: now}
		if oldest >= 0 {
			u.Oldest = time.UnixMilli(oldest)
		}
		switch {
		case newest >= 0 && lim.Rule.Counter():
			u.ResetAt = time.UnixMilli(newest) // the script's answer: when the key counts nothing
		case newest >= 0:
			u.ResetAt = time.UnixMilli(newest).Add(lim.Rule.Window + time.Millisecond)
		}
		out[i] = u
	}
	return out, nil
}

// Reset deletes the windows of the given limits: every admission in them is forgotten.
func (l *Limiter) Reset(ctx context.Context, group string, limits ...Limit) error {
	keys, err := l.keys(group, limits)
	if err != nil {
		return err
	}
	// One DEL per key: a pipeline keeps this correct through a Cluster client.
	_, err = l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Del(ctx, k)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("throttle: reset: %w", err)
	}
	return nil
}

// Key returns the Redis key that holds the window of lim for group:
// prefix:{group}:scope:<window ms>[:hmac(subject)] (a bucketed rule's window
// is "<ms>~<buckets>", a calendar rule's "<period>@<zone>"). The group (lim.Group when
// set) is the Redis Cluster hash tag, so every limit of one group lives in
// one slot.
func (l *Limiter) Key(group string, lim Limit) (string, error) {
	if lim.Group != "" {
		group = lim.Group
	}
	if err := checkGroup(group); err != nil {
		return "", err
	}
	if err := checkScope(lim.Scope); err != nil {
		return "", err
	}
	if err := lim.Rule.Validate(); err != nil {
		return "", err
	}
	var hashed string
	if lim.Subject != "" {
		if len(lim.Subject) > 1024 {
			return "", fmt.Errorf("%w: subject longer than 1024 bytes", ErrInvalidKey)
		}
		hashed = l.Subject(lim.Subject)
	}
	return l.space.Window(group, lim.Scope, lim.Rule.keyPart(), hashed), nil
}

// Space is the limiter's keyspace (its prefix): where callers build the
// keys of records beside the limiter's (keyspace.Space).
func (l *Limiter) Space() keyspace.Space { return l.space }

// Subject returns the keyed hash a subject is stored as: the first 16 bytes
// of its HMAC-SHA256, base64url (22 characters).
func (l *Limiter) Subject(subject string) string {
	m := l.macs.Get().(hash.Hash)
	m.Reset()
	m.Write([]byte(subject))
	var sum [sha256.Size]byte
	m.Sum(sum[:0])
	l.macs.Put(m)
	return base64.RawURLEncoding.EncodeToString(sum[:16])
}

// StateKey returns the key of id's record in group (booked, admitted, done):
// prefix:{group}:n:<id>, the id hashed when members are compact.
func (l *Limiter) StateKey(group, id string) string { return l.space.State(group, l.Member(id)) }

// Member is id as the limiter stores it: its SHA-256's first 12 bytes,
// base64url, when members are compact; else id itself.
func (l *Limiter) Member(id string) string {
	if !l.compact {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return base64.RawURLEncoding.EncodeToString(sum[:12])
}

// SubjectKey returns the key of another record about a subject of group,
// beside the limiter's: prefix:{group}:kind:hmac(subject), in the group's
// hash slot and keyed like the windows (no PII). kind names the record
// (e.g. "suppressed:sms"); the caller keeps it apart from rule scopes.
func (l *Limiter) SubjectKey(group, kind, subject string) string {
	return l.HashedSubjectKey(group, kind, l.Subject(subject))
}

// HashedSubjectKey is SubjectKey for a subject already hashed with
// Subject: for a reader that holds the hash and never the subject (a
// one-click unsubscribe link carries the hash of its address).
func (l *Limiter) HashedSubjectKey(group, kind, hashed string) string {
	return l.space.Subject(group, kind, hashed)
}

// stateKeys is how many keys a check names after its rules' (see reserve):
// the id's state, a block key, consent's one or two, the note's and the holds.
func stateKeys(policy RerunPolicy, opts ReserveOptions) int {
	if policy == "" {
		return 0
	}
	n := 1 + len(opts.Holds)
	if opts.Block != "" {
		n++
	}
	if cc := opts.Consent; cc != nil {
		n++
		if cc.LastKey != "" {
			n++
		}
	}
	if opts.Note != nil {
		n++
	}
	return n
}

// keys names the rules' keys.
func (l *Limiter) keys(group string, limits []Limit) ([]string, error) {
	if len(limits) == 0 || len(limits) > MaxRules {
		return nil, fmt.Errorf("%w: a check takes 1 to %d limits, got %d", ErrTooManyRules, MaxRules, len(limits))
	}
	if err := checkGroup(group); err != nil {
		return nil, err
	}
	keys := make([]string, len(limits))
	for i, lim := range limits {
		k, err := l.Key(group, lim)
		if err != nil {
			return nil, fmt.Errorf("limit %d (%s): %w", i, lim.Scope, err)
		}
		keys[i] = k
	}
	return keys, nil
}

// compactLen is the size of a compact member (Options.CompactMembers).
const compactLen = 6

// stored is the form a member takes in the sorted sets.
func (l *Limiter) stored(member string) string {
	if !l.compact {
		return member
	}
	sum := sha256.Sum256([]byte(member))
	return string(sum[:compactLen])
}

// tableFrom is where a calendar rule's table of boundaries starts: a little
// before the clock decisions are made on.
func (l *Limiter) tableFrom() time.Time {
	if l.now != nil {
		return l.now().Add(-calendarMargin)
	}
	return l.clock().Add(-calendarMargin)
}

func (l *Limiter) nowArg() string {
	if l.now == nil {
		return ""
	}
	return strconv.FormatInt(l.now().UnixMilli(), 10)
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func timeArg(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(t.UnixMilli(), 10)
}

func checkMember(m string) error {
	if m == "" || len(m) > maxMemberLen {
		return fmt.Errorf("%w: member must be 1 to %d bytes, got %d", ErrInvalidKey, maxMemberLen, len(m))
	}
	if strings.ContainsRune(m, '#') {
		return fmt.Errorf("%w: member must not contain '#' (it numbers attempts)", ErrInvalidKey)
	}
	return nil
}

func checkGroup(g string) error {
	if g == "" || len(g) > 256 || !utf8.ValidString(g) {
		return fmt.Errorf("%w: group must be 1 to 256 bytes of UTF-8", ErrInvalidKey)
	}
	return nil
}

func checkScope(s string) error {
	if s == "" || len(s) > 64 {
		return fmt.Errorf("%w: scope must be 1 to 64 characters, got %q", ErrInvalidKey, s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':') {
			return fmt.Errorf("%w: scope %q: only a-z 0-9 . _ - : are allowed", ErrInvalidKey, s)
		}
	}
	return nil
}
