package consent

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/scripts"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

//go:embed record.lua
var recordSrc string

// CheckScript is the consent rule run on its own (scripts/consent_check.lua
// with scripts/consent.lua joined in; its contract is at its top): the
// same file the limiter's reserve joins, so Store.Check and the check
// inside a send's admission read a suppression hash alike.
var CheckScript = scripts.ConsentCheckSource

var recordScript = redis.NewScript(recordSrc)

// Defaults and bounds of Options.
const (
	// DefaultRetention keeps ledger events five years: longer than the
	// four-year federal limitations period for TCPA claims (28 U.S.C.
	// § 1658), which runs from each message.
	DefaultRetention = 5 * 365 * 24 * time.Hour
	MinRetention     = 24 * time.Hour
	MaxRetention     = 20 * 365 * 24 * time.Hour
	// DefaultMaxEvents bounds the events kept per recipient and channel;
	// the oldest beyond it are dropped (a recipient texting STOP and START
	// back and forth cannot grow a ledger without end).
	DefaultMaxEvents = 1000
	MaxMaxEvents     = 100000
)

// Options configure a Store. The zero value of each field is its default.
type Options struct {
	// Retention is how long the ledger keeps an event. Default
	// DefaultRetention; 24h to 20 years. Suppressions themselves never
	// expire with it: an opt-out holds until an opt-in.
	Retention time.Duration
	// MaxEvents bounds the events kept per recipient and channel. Default
	// DefaultMaxEvents; at most MaxMaxEvents.
	MaxEvents int
	// Now, for tests and tools only, replaces the Redis server clock. Left
	// nil (the default), every event's time and every check's "now" is
	// Redis TIME.
	Now func() time.Time
}

// Store keeps suppressions and the consent ledger in Redis, under the
// limiter's keyed hash of recipients: no recipient is stored in clear. It
// is safe for concurrent use.
type Store struct {
	rdb       redis.UniversalClient
	lim       *throttle.Limiter
	retention time.Duration
	maxEvents int
	now       func() time.Time
}

// NewStore returns a store over rdb, keyed like lim (its prefix and its
// HMAC of subjects under SLUICE_SUBJECT_SECRET).
func NewStore(rdb redis.UniversalClient, lim *throttle.Limiter, opts Options) (*Store, error) {
	if rdb == nil || lim == nil {
		return nil, errors.New("consent: nil redis client or limiter")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Store{rdb: rdb, lim: lim, retention: opts.Retention, maxEvents: opts.MaxEvents, now: opts.Now}
	if s.retention == 0 {
		s.retention = DefaultRetention
	}
	if s.maxEvents == 0 {
		s.maxEvents = DefaultMaxEvents
	}
	return s, nil
}

// Validate reports a retention or bound out of range (zero means the
// default). Errors wrap ErrInvalid.
func (o Options) Validate() error {
	if o.Retention != 0 && (o.Retention < MinRetention || o.Retention > MaxRetention) {
		return fmt.Errorf("%w: Retention %v must be between %v and %v", ErrInvalid, o.Retention, MinRetention, MaxRetention)
	}
	if o.MaxEvents != 0 && (o.MaxEvents < 1 || o.MaxEvents > MaxMaxEvents) {
		return fmt.Errorf("%w: MaxEvents %d must be between 1 and %d", ErrInvalid, o.MaxEvents, MaxMaxEvents)
	}
	return nil
}

// The keys beside the limiter's are built by keyspace (Space.Consent: the
// suppression hash; Ledger: the ledger list; Suppressed: delivery's list
// before this package; Last: the category last admitted to the
// recipient), from the limiter's hash of the recipient.

// space is the limiter's keyspace.
func (s *Store) space() keyspace.Space { return s.lim.Space() }

// LastCategoryTTL is how long the category last admitted to a recipient is
// remembered, for an opt-out by keyword under optout=category.
const LastCategoryTTL = 90 * 24 * time.Hour

// LastKey is the key that remembers the category last admitted to (tenant,
// ch, to) (throttle.ConsentCheck.LastKey); "" for a recipient that cannot
// be keyed.
func (s *Store) LastKey(tenant string, ch tasks.Channel, to string) string {
	norm, err := recipient(tenant, ch, to)
	if err != nil {
		return ""
	}
	return s.space().Last(tenant, string(ch), s.lim.Subject(norm))
}

// LastCategory is the category last admitted to (tenant, ch, to) within
// LastCategoryTTL, "" when none is known.
func (s *Store) LastCategory(ctx context.Context, tenant string, ch tasks.Channel, to string) (string, error) {
	key := s.LastKey(tenant, ch, to)
	if key == "" {
		return "", fmt.Errorf("%w: recipient", ErrInvalid)
	}
	v, err := s.rdb.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("consent: last category: %w", err)
	}
	return v, nil
}

// Subject is the hash a recipient's keys are made of (what a one-click
// unsubscribe link carries instead of the address).
func (s *Store) Subject(tenant string, ch tasks.Channel, to string) (string, error) {
	norm, err := recipient(tenant, ch, to)
	if err != nil {
		return "", err
	}
	return s.lim.Subject(norm), nil
}

// RecordHashed is Record for a recipient known only by its Subject hash.
func (s *Store) RecordHashed(ctx context.Context, tenant string, ch tasks.Channel, subject string, e Event) (Event, error) {
	hkey, lkey, err := s.hashedKeys(tenant, ch, subject)
	if err != nil {
		return Event{}, err
	}
	e, err = e.normalized()
	if err != nil {
		return Event{}, err
	}
	at, _, err := s.run(ctx, []string{hkey, lkey}, string(e.Action), e)
	if err != nil {
		return Event{}, err
	}
	e.At = at
	return e, nil
}

// StateHashed is State for a recipient known only by its Subject hash.
func (s *Store) StateHashed(ctx context.Context, tenant string, ch tasks.Channel, subject string) (State, error) {
	hkey, _, err := s.hashedKeys(tenant, ch, subject)
	if err != nil {
		return State{}, err
	}
	return s.state(ctx, hkey)
}

// LedgerHashed is Ledger for a recipient known only by its Subject hash.
func (s *Store) LedgerHashed(ctx context.Context, tenant string, ch tasks.Channel, subject string) ([]Event, error) {
	_, lkey, err := s.hashedKeys(tenant, ch, subject)
	if err != nil {
		return nil, err
	}
	return s.ledger(ctx, lkey)
}

// ValidSubject reports whether subject has the form of a Subject hash.
func ValidSubject(subject string) bool {
	return len(subject) == 22 && strings.Trim(subject, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") == ""
}

func (s *Store) hashedKeys(tenant string, ch tasks.Channel, subject string) (hash, ledger string, err error) {
	if err := tasks.CheckTenant(tenant); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if _, err := ch.TaskType(); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if !ValidSubject(subject) {
		return "", "", fmt.Errorf("%w: subject hash", ErrInvalid)
	}
	return s.space().Consent(tenant, string(ch), subject), s.space().Ledger(tenant, string(ch), subject), nil
}

// recipient checks and normalises a recipient's address the way the
// limiter's keys and delivery's list do.
func recipient(tenant string, ch tasks.Channel, to string) (string, error) {
	if err := tasks.CheckTenant(tenant); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if _, err := ch.TaskType(); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	to = tasks.Notification{Channel: ch, To: to}.Normalized().To
	if to == "" || len(to) > tasks.MaxEmailLen {
		return "", fmt.Errorf("%w: recipient: must be 1–%d bytes", ErrInvalid, tasks.MaxEmailLen)
	}
	return to, nil
}

// Key is the key of the suppression hash of (tenant, ch, to):
// <prefix>:{<tenant>}:consent:<channel>:<HMAC of the normalised recipient>,
// in the tenant's hash slot beside the limiter's windows. This is the key
// the limiter's script reads (scripts/consent.lua). It is "" for a recipient that
// cannot be keyed (empty, or a bad tenant or channel).
func (s *Store) Key(tenant string, ch tasks.Channel, to string) string {
	norm, err := recipient(tenant, ch, to)
	if err != nil {
		return ""
	}
	return s.space().Consent(tenant, string(ch), s.lim.Subject(norm))
}

// keys returns the hash's and the ledger's keys of (tenant, ch, to).
func (s *Store) keys(tenant string, ch tasks.Channel, to string) (hash, ledger string, err error) {
	norm, err := recipient(tenant, ch, to)
	if err != nil {
		return "", "", err
	}
	h := s.lim.Subject(norm)
	return s.space().Consent(tenant, string(ch), h), s.space().Ledger(tenant, string(ch), h), nil
}

func (s *Store) nowArg() string {
	if s.now == nil {
		return ""
	}
	return strconv.FormatInt(s.now().UnixMilli(), 10)
}

// Record applies e to the suppressions of (tenant, ch, to) and appends it
// to their ledger, atomically: the suppression hash is always what the
// ledger's events, in order, leave behind. It returns e as recorded (At
// set by the Redis clock, the scope of Undeliverable and Review filled in).
// Errors wrap ErrInvalid for an event, tenant, channel or recipient that
// cannot be recorded, and say so for Redis trouble; an event is recorded
// even at Redis's maxmemory (noeviction).
func (s *Store) Record(ctx context.Context, tenant string, ch tasks.Channel, to string, e Event) (Event, error) {
	e, err := e.normalized()
	if err != nil {
		return Event{}, err
	}
	hkey, lkey, err := s.keys(tenant, ch, to)
	if err != nil {
		return Event{}, err
	}
	at, _, err := s.run(ctx, []string{hkey, lkey}, string(e.Action), e)
	if err != nil {
		return Event{}, err
	}
	e.At = at
	return e, nil
}

// run calls record.lua.
func (s *Store) run(ctx context.Context, keys []string, action string, e Event) (time.Time, bool, error) {
	res, err := recordScript.Run(ctx, s.rdb, keys, s.nowArg(), action, string(e.Source), e.Scope.String(),
		e.Code, untilMS(e.Until), e.Ref, e.Keyword, s.retention.Milliseconds(), s.maxEvents).Int64Slice()
	if err != nil {
		return time.Time{}, false, fmt.Errorf("consent: record: %w", err)
	}
	if len(res) != 2 {
		return time.Time{}, false, fmt.Errorf("consent: record: unexpected reply %v", res)
	}
	return time.UnixMilli(res[0]).UTC(), res[1] == 1, nil
}

// State returns what the suppression hash of (tenant, ch, to) holds now;
// lapsed marks are left out. A mark this version cannot read is an error
// wrapping ErrUnreadable (the check script counts it as blocking).
func (s *Store) State(ctx context.Context, tenant string, ch tasks.Channel, to string) (State, error) {
	hkey, _, err := s.keys(tenant, ch, to)
	if err != nil {
		return State{}, err
	}
	return s.state(ctx, hkey)
}

func (s *Store) state(ctx context.Context, hkey string) (State, error) {
	p := s.rdb.Pipeline()
	h, t := p.HGetAll(ctx, hkey), p.Time(ctx)
	if _, err := p.Exec(ctx); err != nil {
		return State{}, fmt.Errorf("consent: read suppressions: %w", err)
	}
	now := t.Val()
	if s.now != nil {
		now = s.now()
	}
	return decodeState(h.Val(), now)
}

// decodeState reads a suppression hash's fields, leaving out marks lapsed
// at now.
func decodeState(fields map[string]string, now time.Time) (State, error) {
	var st State
	for f, v := range fields {
		m, err := parseMark(v)
		if err != nil {
			return State{}, fmt.Errorf("field %q: %w", f, err)
		}
		if !m.live(now) {
			continue
		}
		switch {
		case f == "!":
			st.Undeliverable = &m
		case f == "*":
			st.All = &m
		case strings.HasPrefix(f, "c:"):
			if st.OptedOut == nil {
				st.OptedOut = map[string]Mark{}
			}
			st.OptedOut[f[2:]] = m
		case strings.HasPrefix(f, "+:"):
			if st.OptedIn == nil {
				st.OptedIn = map[string]Mark{}
			}
			st.OptedIn[f[2:]] = m
		default:
			return State{}, fmt.Errorf("%w: field %q", ErrUnreadable, f)
		}
	}
	if st.All == nil {
		st.OptedIn = nil // re-consents count only under an opt-out of every category
	}
	return st, nil
}

// Check reports whether a send of category (tasks.DefaultCategory when
// empty) to (tenant, ch, to) is blocked, running CheckScript — the rule
// the limiter's script applies (scripts/consent.lua) — on the Redis clock.
// exempt tells whether the tenant declares the category one an opt-out of
// every category lets through (see the package documentation).
func (s *Store) Check(ctx context.Context, tenant string, ch tasks.Channel, to, category string, exempt bool) (Verdict, error) {
	keys, args, err := s.checkArgs(tenant, ch, to, category, exempt)
	if err != nil {
		return Verdict{}, err
	}
	return verdictOf(scripts.ConsentCheck.Run(ctx, s.rdb, keys, args...))
}

// QueueCheck adds Check's script call to p, for a caller that reads the
// consent in the same round trip as something else; the function it
// returns, called once p has run, answers what Check would. The call goes
// by the script's hash: where Redis does not have the script yet
// (NOSCRIPT), the function asks again through Check, which loads it.
func (s *Store) QueueCheck(ctx context.Context, p redis.Pipeliner, tenant string, ch tasks.Channel, to, category string, exempt bool) func() (Verdict, error) {
	keys, args, err := s.checkArgs(tenant, ch, to, category, exempt)
	if err != nil {
		return func() (Verdict, error) { return Verdict{}, err }
	}
	cmd := scripts.ConsentCheck.EvalSha(ctx, p, keys, args...)
	return func() (Verdict, error) {
		if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
			return s.Check(ctx, tenant, ch, to, category, exempt)
		}
		return verdictOf(cmd)
	}
}

// checkArgs are Check's script keys and arguments.
func (s *Store) checkArgs(tenant string, ch tasks.Channel, to, category string, exempt bool) (keys []string, args []any, err error) {
	hkey, _, err := s.keys(tenant, ch, to)
	if err != nil {
		return nil, nil, err
	}
	if category == "" {
		category = tasks.DefaultCategory
	}
	if err := tasks.CheckCategory(category); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	ex := "0"
	if exempt {
		ex = "1"
	}
	return []string{hkey}, []any{s.nowArg(), category, ex}, nil
}

// verdictOf reads CheckScript's reply.
func verdictOf(cmd *redis.Cmd) (Verdict, error) {
	res, err := cmd.Slice()
	if err != nil {
		return Verdict{}, fmt.Errorf("consent: check: %w", err)
	}
	if len(res) != 2 {
		return Verdict{}, fmt.Errorf("consent: check: unexpected reply %v", res)
	}
	r, _ := res[0].(int64)
	v := Verdict{Reason: Reason(r)}
	if raw, _ := res[1].(string); raw != "" {
		if m, err := parseMark(raw); err == nil {
			v.Mark = &m
		}
	}
	if v.Reason < NotBlocked || v.Reason > BlockedAll {
		return Verdict{}, fmt.Errorf("consent: check: unexpected reason %d", r)
	}
	return v, nil
}

// Ledger returns the events recorded for (tenant, ch, to), oldest first,
// within the retention: when and how the recipient opted out and in. An
// entry this version cannot read is an error wrapping ErrUnreadable,
// returned with the entries that could be read.
func (s *Store) Ledger(ctx context.Context, tenant string, ch tasks.Channel, to string) ([]Event, error) {
	_, lkey, err := s.keys(tenant, ch, to)
	if err != nil {
		return nil, err
	}
	return s.ledger(ctx, lkey)
}

func (s *Store) ledger(ctx context.Context, lkey string) ([]Event, error) {
	p := s.rdb.Pipeline()
	l, t := p.LRange(ctx, lkey, 0, -1), p.Time(ctx)
	if _, err := p.Exec(ctx); err != nil {
		return nil, fmt.Errorf("consent: read ledger: %w", err)
	}
	raw, now := l.Val(), t.Val()
	if s.now != nil {
		now = s.now()
	}
	cutoff := now.Add(-s.retention)
	events := make([]Event, 0, len(raw))
	var bad error
	for _, r := range raw {
		e, err := decodeEvent(r)
		if err != nil {
			bad = errors.Join(bad, err)
			continue
		}
		if !e.At.Before(cutoff) {
			events = append(events, e)
		}
	}
	return events, bad
}

// MigrateDelivery moves every entry of delivery's SMS and email
// suppression lists (<prefix>:{<tenant>}:suppressed:<channel>:<hmac>, a
// string holding the provider's error code, with the list's TTL) into the
// suppression hashes: each becomes an Undeliverable mark from source
// provider with the entry's code, lapsing when the entry would have, and a
// ledger event with ref "delivery-migration" (its time the migration's:
// the old list kept none). The old keys are deleted. It needs no
// recipient in clear: the old key and the new share the HMAC. It is safe
// to run again and while workers run (each key moves in one script call);
// it returns how many entries moved. On a Cluster it scans every master.
func (s *Store) MigrateDelivery(ctx context.Context) (int, error) {
	var moved atomic.Int64
	for _, ch := range []tasks.Channel{tasks.SMS, tasks.Email} {
		pattern := s.space().SuppressedPattern(string(ch)) // every tenant's old keys
		scan := func(ctx context.Context, node redis.UniversalClient) error {
			it := node.Scan(ctx, 0, pattern, 1000).Iterator()
			for it.Next(ctx) {
				ok, err := s.migrateKey(ctx, it.Val(), ch)
				if err != nil {
					return err
				}
				if ok {
					moved.Add(1)
				}
			}
			return it.Err()
		}
		var err error
		if c, ok := s.rdb.(*redis.ClusterClient); ok {
			err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return scan(ctx, m) })
		} else {
			err = scan(ctx, s.rdb)
		}
		if err != nil {
			return int(moved.Load()), fmt.Errorf("consent: migrate delivery's suppression list: %w", err)
		}
	}
	return int(moved.Load()), nil
}

// MigrationMarkerTTL is how long MigrateDeliveryOnce remembers a completed
// run. Every key Sluice writes expires unless it must not (a suppression
// that never lapses, tokens, plans, credentials); this marker need not
// live forever, because a run after it lapses is harmless: MigrateDelivery
// is idempotent and nothing writes the old lists, so it finds them empty
// and costs one SCAN of the keyspace a year.
const MigrationMarkerTTL = 365 * 24 * time.Hour

// MigrateDeliveryOnce runs MigrateDelivery unless a completed run is
// recorded in Redis (for MigrationMarkerTTL), and records a completed one:
// what workers call at start (nothing writes the old lists any more, so
// one pass empties them; `sluice suppression migrate` runs it again at
// will). ran is false when an earlier run had completed.
func (s *Store) MigrateDeliveryOnce(ctx context.Context) (moved int, ran bool, err error) {
	marker := s.space().Migrated(s.lim.Subject("delivery-suppressions"))
	n, err := s.rdb.Exists(ctx, marker).Result()
	if err != nil {
		return 0, false, fmt.Errorf("consent: migrate: %w", err)
	}
	if n == 1 {
		return 0, false, nil
	}
	moved, err = s.MigrateDelivery(ctx)
	if err != nil {
		return moved, true, err
	}
	if err := s.rdb.Set(ctx, marker, time.Now().UTC().Format(time.RFC3339), MigrationMarkerTTL).Err(); err != nil {
		return moved, true, fmt.Errorf("consent: migrate: record the run: %w", err)
	}
	return moved, true, nil
}

// migrateKey moves one old key (through the store's client, which routes
// by the key's slot); false when it was gone or is not one.
func (s *Store) migrateKey(ctx context.Context, old string, ch tasks.Channel) (bool, error) {
	hkey, lkey, ok := keyspace.FromSuppressed(old, string(ch))
	if !ok {
		return false, nil
	}
	_, ok, err := s.run(ctx, []string{hkey, lkey, old}, "migrate",
		Event{Source: SourceProvider, Scope: AllCategories(), Ref: "delivery-migration"})
	return ok, err
}

// Once reports whether this is the first call for (tenant, ch, to, what)
// within ttl, remembering it (SET NX): for at most one reply per keyword.
func (s *Store) Once(ctx context.Context, tenant string, ch tasks.Channel, to, what string, ttl time.Duration) (bool, error) {
	norm, err := recipient(tenant, ch, to)
	if err != nil {
		return false, err
	}
	if what == "" || strings.ContainsAny(what, ":{}") {
		return false, fmt.Errorf("%w: once %q", ErrInvalid, what)
	}
	ok, err := s.rdb.SetNX(ctx, s.space().Once(tenant, what, string(ch), s.lim.Subject(norm)), "1", ttl).Result()
	if err != nil {
		return false, fmt.Errorf("consent: once: %w", err)
	}
	return ok, nil
}
