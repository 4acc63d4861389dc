// Package digest folds notifications that their rules would defer into
// one message per slot (the plans' digest rule,
// CHANNEL.CATEGORY:digest=max:N).
//
// The first notification of a digested category to a recipient goes as
// soon as its rules allow. One that would wait for a later slot opens a
// digest: it becomes the digest's carrier, booked for that slot like any
// deferred send. Until the carrier is sent, every further notification of
// the same tenant, recipient, category and group (Digest.Key) joins it —
// up to Digest.Max items, the carrier's own included — and its own task is
// done: the digest carries it. At its slot the carrier closes the digest
// (the next item opens another), reads its items back and sends one
// message in place of all of them: one send against every rule.
//
// Every item is written to Redis (scripts/digest.lua) before its own task
// completes, in the tenant's hash slot, and stays until its TTL after the
// digest is sent: a carrier that crashes mid-send reads the same items
// again on its re-run. A carrier that ends without a send (expired,
// dropped, blocked) hands its other items back to the queue (Spill).
//
// A task run again after a crash keeps what its earlier run did: an item
// that joined a digest is Joined to it again (its note), a carrier reads
// its own items, and a notification checked for a send of its own before
// (JoinFirst: the limiter has its record) neither joins nor opens one —
// its re-run repeats that send or is settled from the provider's report.
package digest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/scripts"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// Join outcomes.
const (
	Open    = 0 // no digest with room is open
	Joined  = 1 // the item joined an open digest: its task is done
	Started = 2 // the item opened a digest and carries it
	Carrier = 3 // the item carries a digest already
	// Rerun (JoinFirst only): the item was checked for a send of its own
	// before — the limiter has a record of it (booked, admitted, done) — so
	// this run repeats that send: it neither joins nor opens a digest.
	Rerun = 4
)

// ErrBadRecord: an item's record in Redis does not read.
var ErrBadRecord = errors.New("digest: bad item record")

// Store keeps digests in the limiter's Redis, keyed like its records.
type Store struct {
	rdb redis.UniversalClient
	lim *throttle.Limiter
}

// New returns a store on rdb, with the limiter's keys.
func New(rdb redis.UniversalClient, lim *throttle.Limiter) *Store { return &Store{rdb: rdb, lim: lim} }

// Item is one notification a digest carries: its task as queued.
type Item struct {
	TaskID, Type string
	Payload      []byte
}

func (it Item) record() string { return it.TaskID + "\n" + it.Type + "\n" + string(it.Payload) }

func parseItem(s string) (Item, error) {
	id, rest, ok := strings.Cut(s, "\n")
	typ, payload, ok2 := strings.Cut(rest, "\n")
	if !ok || !ok2 || id == "" || typ == "" {
		return Item{}, ErrBadRecord
	}
	return Item{TaskID: id, Type: typ, Payload: []byte(payload)}, nil
}

// openKey is the key of the digest open for n under d: one per tenant,
// channel and category, recipient (keyed hash) and group.
func (s *Store) openKey(n tasks.Notification, d plans.Digest) string {
	nn := n.Normalized()
	return s.lim.Space().Digest(n.Tenant, string(n.Channel), n.CategoryOrDefault(), s.lim.Subject(nn.To+"\x00"+d.GroupOf(n)))
}

func (s *Store) itemsKey(tenant, id string) string {
	return s.lim.RecordKey(tenant, id, keyspace.RecordDigestItems)
}

func (s *Store) openedKey(tenant, id string) string {
	return s.lim.RecordKey(tenant, id, keyspace.RecordDigestOpened)
}

func (s *Store) noteKey(tenant, id string) string {
	return s.lim.RecordKey(tenant, id, keyspace.RecordDigestCarrier)
}

// Outcome is what Join did.
type Outcome struct {
	Kind    int    // Open, Joined, Started, Carrier or Rerun
	Carrier string // Joined: the id of the carrier of the digest joined
	Again   bool   // Joined: the item had joined it before (its task's re-run)
	// Opened (Started, Carrier) is when the carrier opened its digest, by
	// Redis's clock to the microsecond (zero if not known): a window
	// (window:D) counts from it, on every run of the carrier.
	Opened time.Time
}

// Join puts the item it, notification n, into the open digest of its
// recipient, category and group if one has room; else, with start, opens
// one that n carries.
// An item that joined a digest before (its task re-run: a crash came
// before its completion) is Joined to that one again, never to another.
func (s *Store) Join(ctx context.Context, n tasks.Notification, d plans.Digest, it Item, ttl time.Duration, start bool) (Outcome, error) {
	return s.join(ctx, n, d, it, ttl, start, false)
}

// JoinFirst is Join on a run's first look, before its check: n the
// limiter has a record of was checked for a send of its own before (a
// carrier booked, a send admitted or done) and this run repeats that send:
// Rerun, and nothing joined or opened. A carrier is still Carrier.
func (s *Store) JoinFirst(ctx context.Context, n tasks.Notification, d plans.Digest, it Item, ttl time.Duration, start bool) (Outcome, error) {
	return s.join(ctx, n, d, it, ttl, start, true)
}

func (s *Store) join(ctx context.Context, n tasks.Notification, d plans.Digest, it Item, ttl time.Duration, start, first bool) (Outcome, error) {
	keys := []string{s.openKey(n, d), s.itemsKey(n.Tenant, n.ID), s.noteKey(n.Tenant, n.ID), s.lim.StateKey(n.Tenant, n.ID), s.openedKey(n.Tenant, n.ID)}
	vals, err := scripts.Digest.Run(ctx, s.rdb, keys, "join", n.ID, it.record(), d.Max, max(ttl, time.Second).Milliseconds(), flag(start), flag(first)).Slice()
	if err != nil {
		return Outcome{}, fmt.Errorf("digest: join: %w", err)
	}
	kind, _ := vals[0].(int64)
	o := Outcome{Kind: int(kind)}
	if len(vals) > 1 {
		v, _ := vals[1].(string)
		switch o.Kind {
		case Joined:
			o.Carrier = v
			if len(vals) > 2 {
				items, _ := vals[2].(int64)
				o.Again = items == 0
			}
		case Started, Carrier:
			o.Opened, _ = parseTime(v)
		}
	}
	return o, nil
}

// parseTime reads Redis TIME as digest.lua writes it: "<s>.<us>".
func parseTime(v string) (time.Time, error) {
	sec, us, ok := strings.Cut(v, ".")
	s, err := strconv.ParseInt(sec, 10, 64)
	u, err2 := strconv.ParseInt(us, 10, 64)
	if !ok || err != nil || err2 != nil || len(us) != 6 {
		return time.Time{}, ErrBadRecord
	}
	return time.Unix(s, u*1000), nil
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// Close closes the digest n carries, if any, to new items and returns its
// items, n's own first (none: n carries no digest). A closed digest's items
// stay readable until their TTL: a re-run reads the same ones.
func (s *Store) Close(ctx context.Context, n tasks.Notification, d plans.Digest) ([]Item, error) {
	keys := []string{s.openKey(n, d), s.itemsKey(n.Tenant, n.ID), s.noteKey(n.Tenant, n.ID)}
	recs, err := scripts.Digest.Run(ctx, s.rdb, keys, "close", n.ID).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("digest: close: %w", err)
	}
	items := make([]Item, 0, len(recs))
	for _, r := range recs {
		it, err := parseItem(r)
		if err != nil {
			return nil, err
		}
		items = append(items, it)
	}
	return items, nil
}

// Release drops the notes of ids, items of the digest n carried, before
// they are handed back to the queue (Spill): each then joins or opens a
// digest again like a new notification (Join answers an item with a note
// Joined to its old digest). Their records stay in n's digest until Forget:
// a carrier that crashes meanwhile hands them back again on its re-run.
func (s *Store) Release(ctx context.Context, n tasks.Notification, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	keys := make([]string, 0, len(ids))
	for _, id := range ids {
		keys = append(keys, s.noteKey(n.Tenant, id))
	}
	if err := s.rdb.Del(ctx, keys...).Err(); err != nil {
		return fmt.Errorf("digest: release: %w", err)
	}
	return nil
}

// Forget drops the items of the digest n carried once they are back in
// the queue (Spill) and will be placed again.
func (s *Store) Forget(ctx context.Context, n tasks.Notification) error {
	if err := s.rdb.Del(ctx, s.itemsKey(n.Tenant, n.ID), s.openedKey(n.Tenant, n.ID)).Err(); err != nil {
		return fmt.Errorf("digest: forget: %w", err)
	}
	return nil
}

// CarriedBy returns the id of the digest (its carrier) that carries tenant's
// notification id, or "" when none does.
func (s *Store) CarriedBy(ctx context.Context, tenant, id string) (string, error) {
	v, err := s.rdb.Get(ctx, s.noteKey(tenant, id)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("digest: %w", err)
	}
	return v, nil
}

// OpenDigest is a digest open to new items.
type OpenDigest struct {
	Carrier string `json:"carrier"` // the id of the notification that carries it
	Items   int64  `json:"items"`   // items so far, the carrier's own included
}

// OpenFor returns the digest open for n's recipient, category and group
// under d, nil when none is.
func (s *Store) OpenFor(ctx context.Context, n tasks.Notification, d plans.Digest) (*OpenDigest, error) {
	v, err := s.rdb.Get(ctx, s.openKey(n, d)).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("digest: %w", err)
	}
	carrier, items, ok := strings.Cut(v, "\n")
	if !ok {
		return nil, ErrBadRecord
	}
	c, err := s.rdb.LLen(ctx, items).Result()
	if err != nil {
		return nil, fmt.Errorf("digest: %w", err)
	}
	if c == 0 {
		return nil, nil // its items are gone: the next item opens another
	}
	return &OpenDigest{Carrier: carrier, Items: c}, nil
}
