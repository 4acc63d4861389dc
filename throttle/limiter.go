package throttle

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/scripts"
)

// DefaultPrefix starts every key the limiter writes.
const DefaultPrefix = "sluice:rl"

// ErrNoSecret reports a limiter built without an HMAC secret for subjects.
var ErrNoSecret = errors.New("throttle: a subject secret of at least 16 bytes is required")

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
}

// String prints the limit without its subject, e.g. "sms:recipient 1/1m".
func (l Limit) String() string { return l.Scope + " " + l.Rule.String() }

// Decision is the limiter's answer. A denial is data, not an error.
type Decision struct {
	// Allowed reports whether the send may go ahead. True also for a
	// Duplicate.
	Allowed bool
	// Duplicate reports that the member was already admitted inside a
	// window of one of the rules: nothing was added, nothing counted twice.
	Duplicate bool
	// Done reports that MarkDone was called for the member: its work is
	// finished, Allowed is false and nothing was counted.
	Done bool
	// Booked reports (Book only) that the member holds a slot at Now +
	// RetryAfter: asking again from then on admits it.
	Booked bool
	// Remaining is the smallest number of further admissions any rule allows
	// right after this decision.
	Remaining int
	// RetryAfter is -1 unless the check was denied; then it is the exact time
	// until the entry that has to leave the longest-blocked window has left it
	// (for Book: until the booked slot).
	RetryAfter time.Duration
	// RetryAt is zero unless the check was denied; then it is the host clock's
	// now (Options.Clock) plus RetryAfter — the moment to try again, in the
	// clock of the process that asked.
	RetryAt time.Time
	// DeniedBy is -1 unless the check was denied; then it is the index, in the
	// limits given to Allow, of the rule with the longest wait (-1 also when a
	// member woke before its booked slot).
	DeniedBy int
	// Now is the time the decision was taken at (Redis TIME unless Options.Now).
	Now time.Time
}

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
	// for a UUID member (see the README). Admission stays idempotent (the
	// same member maps to the same 6 bytes); two members of one window
	// collide with probability about n²/2⁴⁹ (n = entries in the window:
	// 2·10⁻¹¹ at n = 100, 2·10⁻⁹ at n = 1,000), which would undercount by
	// one. Changing it on a live deployment makes members admitted before
	// the change look new for one window.
	CompactMembers bool
}

// Limiter is an exact sliding-window-log limiter in Redis: one sorted set per
// limited subject and rule, one Lua script per check. It is safe for
// concurrent use.
type Limiter struct {
	client  redis.UniversalClient
	prefix  string
	secret  []byte
	now     func() time.Time
	clock   func() time.Time
	compact bool
	macs    *sync.Pool // of HMAC-SHA256 keyed with secret: hmac.New per key is a hot-path cost
}

// New returns a Limiter over any go-redis client (single node, Sentinel, Cluster).
func New(client redis.UniversalClient, opts Options) (*Limiter, error) {
	if client == nil {
		return nil, errors.New("throttle: nil redis client")
	}
	if len(opts.Secret) < 16 {
		return nil, ErrNoSecret
	}
	l := &Limiter{client: client, prefix: opts.Prefix, secret: append([]byte(nil), opts.Secret...), now: opts.Now, clock: opts.Clock, compact: opts.CompactMembers}
	if l.prefix == "" {
		l.prefix = DefaultPrefix
	}
	if l.clock == nil {
		l.clock = time.Now
	}
	l.macs = &sync.Pool{New: func() any { return hmac.New(sha256.New, l.secret) }}
	return l, nil
}

// Allow checks every limit of the group at once and, only if all have room,
// admits member into all of them (all-or-nothing, one script, one round
// trip). member must be stable for the thing being sent (its notification
// id): asking again for a member already admitted returns Allowed and
// Duplicate without counting twice.
func (l *Limiter) Allow(ctx context.Context, group, member string, limits ...Limit) (Decision, error) {
	return l.check(ctx, group, member, "", "", limits)
}

// BookOptions shape the slots Book hands out.
type BookOptions struct {
	// Slack is how late after its slot a booked member may come back and
	// still be admitted without disturbing later bookings: slots are spaced
	// by window + Slack. Set it to the caller's bound on wake-up lateness.
	Slack time.Duration
	// Granularity rounds slots up to a multiple of it (e.g. a second, for a
	// scheduler that keeps whole seconds). Default 1 ms: no rounding.
	Granularity time.Duration
}

// Book is Allow for a queue of sends: a member that is denied books the
// earliest slot that keeps every window within its limit even if the member
// is admitted up to slack after it, and the decision says Booked with the
// wait. Asking again from the slot on admits the member at its actual time,
// if every window still allows that (else it books anew at the end). New
// members queue behind existing bookings. So a backlog costs about two
// checks per send instead of one per wake-up.
//
// Unlike Allow, a denial adds an entry (the booking, member "book:"+member),
// so a set holds up to limit + the number of members waiting. Bookings
// never used leave with their window. Use Book or Allow on a given key, not
// both: Allow then only promises a retry-after that is never early.
func (l *Limiter) Book(ctx context.Context, group, member string, opts BookOptions, limits ...Limit) (Decision, error) {
	if opts.Slack < 0 || opts.Slack > MaxWindow {
		return Decision{}, fmt.Errorf("%w: slack %v must be between 0 and %v", ErrInvalidRule, opts.Slack, MaxWindow)
	}
	if opts.Granularity < 0 || opts.Granularity > time.Hour {
		return Decision{}, fmt.Errorf("%w: granularity %v must be between 0 and 1h", ErrInvalidRule, opts.Granularity)
	}
	grain := max(1, opts.Granularity.Milliseconds())
	return l.check(ctx, group, member, strconv.FormatInt(opts.Slack.Milliseconds(), 10), strconv.FormatInt(grain, 10), limits)
}

func (l *Limiter) check(ctx context.Context, group, member, slack, grain string, limits []Limit) (Decision, error) {
	if err := checkMember(member); err != nil {
		return Decision{}, err
	}
	keys, err := l.keys(group, limits)
	if err != nil {
		return Decision{}, err
	}
	keys = append(keys, l.doneKey(group, member))
	args := make([]any, 4, 4+2*len(limits))
	args[0], args[1], args[2], args[3] = l.stored(member), l.nowArg(), slack, grain
	for _, lim := range limits {
		args = append(args, lim.Rule.Limit, lim.Rule.Window.Milliseconds())
	}
	reply, err := scripts.Allow.Run(ctx, l.client, keys, args...).Int64Slice()
	if err != nil {
		return Decision{}, fmt.Errorf("throttle: allow: %w", err)
	}
	if len(reply) != 5 {
		return Decision{}, fmt.Errorf("throttle: allow: unexpected reply of %d values", len(reply))
	}
	d := Decision{
		Remaining:  int(reply[3]),
		RetryAfter: -1,
		DeniedBy:   -1,
		Now:        time.UnixMilli(reply[4]),
	}
	switch reply[0] {
	case 1:
		d.Allowed = true
	case 2:
		d.Allowed, d.Duplicate = true, true
	case 3:
		d.Done = true
	case 0, 4:
		idx := int(reply[1]) - 1
		if idx < -1 || idx >= len(limits) || reply[2] < 1 || (reply[0] == 0 && idx < 0) {
			return Decision{}, fmt.Errorf("throttle: allow: unexpected denial reply %v", reply)
		}
		d.Booked = reply[0] == 4
		d.DeniedBy = idx
		d.RetryAfter = time.Duration(reply[2]) * time.Millisecond
		d.RetryAt = l.clock().Add(d.RetryAfter)
	default:
		return Decision{}, fmt.Errorf("throttle: allow: unexpected status %d", reply[0])
	}
	return d, nil
}

// MarkDone records that member's work in group is finished (its send
// completed), for ttl: until then Allow answers Done for it and counts
// nothing, so a task re-run after its send does not send again.
func (l *Limiter) MarkDone(ctx context.Context, group, member string, ttl time.Duration) error {
	if err := checkMember(member); err != nil {
		return err
	}
	if err := checkGroup(group); err != nil {
		return err
	}
	if ttl < time.Millisecond {
		return fmt.Errorf("%w: done ttl %v must be at least 1ms", ErrInvalidRule, ttl)
	}
	if err := l.client.Set(ctx, l.doneKey(group, member), 1, ttl).Err(); err != nil {
		return fmt.Errorf("throttle: mark done: %w", err)
	}
	return nil
}

// doneKey is prefix:{group}:done:member — in the group's slot.
func (l *Limiter) doneKey(group, member string) string {
	var b strings.Builder
	b.WriteString(l.prefix)
	b.WriteString(":{")
	escapeGroup(&b, group)
	b.WriteString("}:done:")
	b.WriteString(member)
	return b.String()
}

// Release gives back the slots member took in the given limits: for a send
// that definitely did not happen. It reports how many windows held member.
func (l *Limiter) Release(ctx context.Context, group, member string, limits ...Limit) (int, error) {
	if err := checkMember(member); err != nil {
		return 0, err
	}
	keys, err := l.keys(group, limits)
	if err != nil {
		return 0, err
	}
	n, err := scripts.Release.Run(ctx, l.client, keys, l.stored(member)).Int()
	if err != nil {
		return 0, fmt.Errorf("throttle: release: %w", err)
	}
	return n, nil
}

// Usage is one limit's state, read without changing it.
type Usage struct {
	Limit Limit
	// Used is the number of admissions inside the window now.
	Used int
	// Remaining is how many more would be admitted now.
	Remaining int
	// Oldest is the oldest admission inside the window; zero when none.
	Oldest time.Time
	// NextFree is when the next slot frees: Now when there is room already.
	NextFree time.Time
	// Booked is the number of slots booked after Now (see Book).
	Booked int
	// ResetAt is when the window is empty again: Now when it is empty.
	ResetAt time.Time
	// Now is the time the state was read at.
	Now time.Time
}

// Usage reads the state of each limit of the group. It writes nothing.
func (l *Limiter) Usage(ctx context.Context, group string, limits ...Limit) ([]Usage, error) {
	keys, err := l.keys(group, limits)
	if err != nil {
		return nil, err
	}
	args := make([]any, 1, 1+2*len(limits))
	args[0] = l.nowArg()
	for _, lim := range limits {
		args = append(args, lim.Rule.Limit, lim.Rule.Window.Milliseconds())
	}
	reply, err := scripts.Usage.Run(ctx, l.client, keys, args...).Int64Slice()
	if err != nil {
		return nil, fmt.Errorf("throttle: usage: %w", err)
	}
	if len(reply) != 1+5*len(limits) {
		return nil, fmt.Errorf("throttle: usage: unexpected reply of %d values", len(reply))
	}
	now := time.UnixMilli(reply[0])
	out := make([]Usage, len(limits))
	for i, lim := range limits {
		r := reply[1+5*i : 6+5*i]
		count, oldest, newest, next := r[0], r[1], r[2], r[3]
		u := Usage{Limit: lim, Used: int(count), Remaining: max(0, lim.Rule.Limit-int(count)), NextFree: now, ResetAt: now, Now: now, Booked: int(r[4])}
		if oldest >= 0 {
			u.Oldest = time.UnixMilli(oldest)
		}
		if newest >= 0 {
			u.ResetAt = time.UnixMilli(newest).Add(lim.Rule.Window + time.Millisecond)
		}
		if next >= 0 {
			u.NextFree = time.UnixMilli(next).Add(lim.Rule.Window + time.Millisecond)
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
	// One DEL per key: the keys share a slot, but a pipeline keeps this
	// correct even through a Cluster client.
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
// prefix:{group}:scope:w<window ms>[:hmac(subject)]. The group is the Redis
// Cluster hash tag, so every limit of one group lives in one slot.
func (l *Limiter) Key(group string, lim Limit) (string, error) {
	if err := checkGroup(group); err != nil {
		return "", err
	}
	if err := checkScope(lim.Scope); err != nil {
		return "", err
	}
	if err := lim.Rule.Validate(); err != nil {
		return "", err
	}
	var b strings.Builder
	b.Grow(len(l.prefix) + len(group) + len(lim.Scope) + 64)
	b.WriteString(l.prefix)
	b.WriteString(":{")
	escapeGroup(&b, group)
	b.WriteString("}:")
	b.WriteString(lim.Scope)
	b.WriteString(":w")
	b.WriteString(strconv.FormatInt(lim.Rule.Window.Milliseconds(), 10))
	if lim.Subject != "" {
		if len(lim.Subject) > 1024 {
			return "", fmt.Errorf("%w: subject longer than 1024 bytes", ErrInvalidKey)
		}
		m := l.macs.Get().(hash.Hash)
		m.Reset()
		m.Write([]byte(lim.Subject))
		var sum [sha256.Size]byte
		m.Sum(sum[:0])
		l.macs.Put(m)
		var h [32]byte
		hex.Encode(h[:], sum[:16])
		b.WriteByte(':')
		b.Write(h[:])
	}
	return b.String(), nil
}

func (l *Limiter) keys(group string, limits []Limit) ([]string, error) {
	if len(limits) == 0 || len(limits) > MaxRules {
		return nil, fmt.Errorf("%w: a check takes 1 to %d limits, got %d", ErrTooManyRules, MaxRules, len(limits))
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

func (l *Limiter) nowArg() string {
	if l.now == nil {
		return ""
	}
	return strconv.FormatInt(l.now().UnixMilli(), 10)
}

func checkMember(m string) error {
	if m == "" || len(m) > maxMemberLen {
		return fmt.Errorf("%w: member must be 1 to %d bytes, got %d", ErrInvalidKey, maxMemberLen, len(m))
	}
	if strings.HasPrefix(m, bookingPrefix) {
		return fmt.Errorf("%w: member must not start with %q (reserved for bookings)", ErrInvalidKey, bookingPrefix)
	}
	return nil
}

// bookingPrefix starts the member of a booked slot (allow.lua, release.lua).
const bookingPrefix = "book:"

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

// escapeGroup writes g with every byte outside [A-Za-z0-9._-] as %XX, so
// that no group can close the hash tag ('}') or mimic another group's key:
// the escaping is one-to-one.
func escapeGroup(b *strings.Builder, g string) {
	const hexdig = "0123456789ABCDEF"
	for i := 0; i < len(g); i++ {
		c := g[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexdig[c>>4])
		b.WriteByte(hexdig[c&15])
	}
}
