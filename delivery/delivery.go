// Package delivery keeps what an SMS provider reports about a message
// after it took it — the delivery status and error code of its status
// callbacks — and the record of whom each SMS went to, which a callback is
// checked against before it marks a number undeliverable. Both live in
// Redis beside the limiter's record of the notification, in its tenant's
// hash slot, under keys that hold no personal data: they are keyed by the
// notification, and a recipient is stored as the limiter's keyed hash.
//
// A permanent failure does not stay here: the worker (on a provider's
// refusal) and the status-callback routes (on a final status whose code
// is in SLUICE_SMS_SUPPRESS_CODES) mark the recipient undeliverable in
// package consent, which every quota check reads.
//
// # The old suppression list
//
// Before package consent, permanent failures put the recipient on a
// per-tenant list kept here (SuppressKey: a string holding the error code,
// with a TTL). Nothing in Sluice writes it any more: workers move its
// entries into consent at start (consent.Store.MigrateDeliveryOnce) and,
// until every worker runs that version, still read it in the same script
// call as the check (throttle.ReserveOptions.Block, the key SuppressKey
// names). Suppress, Suppressed and Unsuppress are called only by tests,
// which write and read the old format to prove the migration and the
// check; nothing else should.
//
// # Forward only
//
// Callbacks may arrive late, twice or out of order. A status is recorded
// only when it is further along than the one recorded (accepted, queued,
// sending, sent, then a final one), so a late "sent" after "delivered"
// changes nothing, and the first final status reported stays.
package delivery

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/scripts"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// Status is a message's status as a Twilio-compatible provider reports it
// (MessageStatus).
type Status string

// The statuses of an outgoing message.
const (
	Accepted           Status = "accepted" // a Messaging Service took it, no number picked yet
	Scheduled          Status = "scheduled"
	Queued             Status = "queued"
	Sending            Status = "sending"
	Sent               Status = "sent" // handed to the carrier
	Delivered          Status = "delivered"
	Undelivered        Status = "undelivered" // the carrier could not deliver it
	Failed             Status = "failed"      // never sent to the carrier
	Canceled           Status = "canceled"
	PartiallyDelivered Status = "partially_delivered"
	Read               Status = "read" // channels with read receipts
)

// finalRank is the rank of the statuses after which nothing but "read" follows.
const finalRank = 5

var ranks = map[Status]int{
	Accepted: 1, Scheduled: 1, Queued: 2, Sending: 3, Sent: 4,
	Delivered: finalRank, Undelivered: finalRank, Failed: finalRank, Canceled: finalRank, PartiallyDelivered: finalRank,
	Read: finalRank + 1,
}

// ErrInvalid reports a status, error code or message SID that cannot be recorded.
var ErrInvalid = errors.New("delivery: invalid report")

// ParseStatus reads a provider's MessageStatus.
func ParseStatus(s string) (Status, error) {
	if _, ok := ranks[Status(s)]; !ok {
		return "", fmt.Errorf("%w: unknown message status %q", ErrInvalid, s)
	}
	return Status(s), nil
}

// Final reports whether s ends the message's delivery.
func (s Status) Final() bool { return ranks[s] >= finalRank }

// Outcome is how a final status is reported: delivered, undelivered or
// failed; "" for a status that is not final.
func (s Status) Outcome() string {
	switch s {
	case Delivered, Read:
		return "delivered"
	case Undelivered, PartiallyDelivered:
		return "undelivered"
	case Failed, Canceled:
		return "failed"
	}
	return ""
}

// Record is the latest status a provider reported for one notification.
type Record struct {
	Status Status
	// ErrorCode is the provider's error code (e.g. 30007, carrier
	// filtering); 0 when none.
	ErrorCode int
	// MessageSID is the provider's id of the message ("SM…").
	MessageSID string
	// At is when Sluice recorded the status (Redis server time).
	At time.Time
}

// MaxErrorCode bounds error codes (Twilio's have five digits).
const MaxErrorCode = 999999

// CheckMessageID reports whether id can be recorded as a provider's message
// id: up to 64 letters, digits and '-' (a Twilio SID, a Telnyx message
// UUID).
func CheckMessageID(id string) error {
	if err := CheckSID(strings.ReplaceAll(id, "-", "")); err != nil || len(id) > 64 {
		return fmt.Errorf("%w: message id must be up to 64 letters, digits and '-'", ErrInvalid)
	}
	return nil
}

// CheckSID reports whether sid can be recorded as a message SID: up to 64
// letters and digits (Twilio's are "SM" or "MM" and 32 hex digits).
func CheckSID(sid string) error {
	if len(sid) > 64 {
		return fmt.Errorf("%w: message SID longer than 64 characters", ErrInvalid)
	}
	for i := 0; i < len(sid); i++ {
		if c := sid[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return fmt.Errorf("%w: message SID must be letters and digits", ErrInvalid)
		}
	}
	return nil
}

func (r Record) check() error {
	if _, ok := ranks[r.Status]; !ok {
		return fmt.Errorf("%w: unknown message status %q", ErrInvalid, r.Status)
	}
	if r.ErrorCode < 0 || r.ErrorCode > MaxErrorCode {
		return fmt.Errorf("%w: error code %d out of range", ErrInvalid, r.ErrorCode)
	}
	return CheckMessageID(r.MessageSID)
}

var errBadRecord = errors.New("delivery: unreadable record")

// parseRecord reads "<rank>:<ms>:<status>:<error code>:<message sid>",
// exactly as Update writes it: numbers in canonical decimal.
func parseRecord(s string) (Record, error) {
	f := strings.Split(s, ":")
	if len(f) != 5 {
		return Record{}, errBadRecord
	}
	st := Status(f[2])
	rank, ok := decimal(f[0], 1)
	if !ok || int(rank) != ranks[st] {
		return Record{}, errBadRecord
	}
	ms, ok := decimal(f[1], 16)
	if !ok || ms > 1<<50 {
		return Record{}, errBadRecord
	}
	code, ok := decimal(f[3], 6)
	if !ok {
		return Record{}, errBadRecord
	}
	r := Record{Status: st, ErrorCode: int(code), MessageSID: f[4], At: time.UnixMilli(ms).UTC()}
	if r.check() != nil {
		return Record{}, errBadRecord
	}
	return r, nil
}

// decimal reads a non-negative integer of at most n digits written
// canonically (no sign, no leading zero).
func decimal(s string, n int) (int64, bool) {
	if s == "" || len(s) > n || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil && v >= 0 && strconv.FormatInt(v, 10) == s
}

// Store reads and writes delivery records, recipient notes and the old
// suppression list in Redis. The limiter gives the keys: its prefix, its
// hash of subjects and its state key.
type Store struct {
	rdb redis.UniversalClient
	lim *throttle.Limiter
}

// NewStore returns a store over rdb, keyed like lim.
func NewStore(rdb redis.UniversalClient, lim *throttle.Limiter) *Store {
	return &Store{rdb: rdb, lim: lim}
}

// RecordKind names delivery records among the limiter's records of a
// notification (throttle.Limiter.RecordKey).
const RecordKind = keyspace.RecordDelivery

// Key is the key of id's delivery record in tenant: beside the limiter's
// record of the notification, in its hash slot.
func (s *Store) Key(tenant, id string) string { return s.lim.RecordKey(tenant, id, RecordKind) }

// Update records r for the notification id of tenant, for ttl, if its
// status is further along than the recorded one (r.At is ignored: Redis
// sets it). It returns whether r was recorded and the record found before
// (nil when none, or unreadable).
func (s *Store) Update(ctx context.Context, tenant, id string, r Record, ttl time.Duration) (bool, *Record, error) {
	if err := r.check(); err != nil {
		return false, nil, err
	}
	rest := string(r.Status) + ":" + strconv.Itoa(r.ErrorCode) + ":" + r.MessageSID
	res, err := scripts.Delivery.Run(ctx, s.rdb, []string{s.Key(tenant, id)}, ranks[r.Status], rest, max(ttl.Milliseconds(), 1)).Slice()
	if err != nil {
		return false, nil, fmt.Errorf("delivery: record: %w", err)
	}
	if len(res) != 2 {
		return false, nil, fmt.Errorf("delivery: record: unexpected reply %v", res)
	}
	applied, _ := res[0].(int64)
	var prev *Record
	if raw, _ := res[1].(string); raw != "" {
		if p, err := parseRecord(raw); err == nil {
			prev = &p
		}
	}
	return applied == 1, prev, nil
}

// Get returns the delivery record of the notification id of tenant; nil
// when there is none (or it cannot be read).
func (s *Store) Get(ctx context.Context, tenant, id string) (*Record, error) {
	raw, err := s.rdb.Get(ctx, s.Key(tenant, id)).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("delivery: read record: %w", err)
	}
	r, err := parseRecord(raw)
	if err != nil {
		return nil, nil // not one this version can read: say nothing rather than guess
	}
	return &r, nil
}

// SuppressKey is the key of recipient's entry on tenant's old suppression
// list of channel ch (see the package doc): the recipient in normalised form, keyed-hashed. It lives in
// the tenant's limiter group, so a quota check can read it in its own call
// (throttle.ReserveOptions.Block).
func (s *Store) SuppressKey(tenant string, ch tasks.Channel, recipient string) string {
	to := tasks.Notification{Channel: ch, To: recipient}.Normalized().To
	return s.lim.Space().Suppressed(tenant, string(ch), s.lim.Subject(to))
}

// Suppress puts recipient on tenant's old suppression list of channel ch
// for ttl, remembering the error code that put it there (a later one
// replaces it and starts the ttl again). Only tests call it, to write the
// format the migration and the check read (see the package doc).
func (s *Store) Suppress(ctx context.Context, tenant string, ch tasks.Channel, recipient string, code int, ttl time.Duration) error {
	if err := s.rdb.Set(ctx, s.SuppressKey(tenant, ch, recipient), strconv.Itoa(code), ttl).Err(); err != nil {
		return fmt.Errorf("delivery: suppress: %w", err)
	}
	return nil
}

// Suppressed reports whether recipient is on tenant's old suppression list
// of channel ch, and the error code that put it there (tests only).
func (s *Store) Suppressed(ctx context.Context, tenant string, ch tasks.Channel, recipient string) (code int, ok bool, err error) {
	raw, err := s.rdb.Get(ctx, s.SuppressKey(tenant, ch, recipient)).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("delivery: suppression list: %w", err)
	}
	code, _ = strconv.Atoi(raw)
	return code, true, nil
}

// Unsuppress takes recipient off tenant's old suppression list of channel
// ch (tests only). It reports whether it was on it.
func (s *Store) Unsuppress(ctx context.Context, tenant string, ch tasks.Channel, recipient string) (bool, error) {
	n, err := s.rdb.Del(ctx, s.SuppressKey(tenant, ch, recipient)).Result()
	if err != nil {
		return false, fmt.Errorf("delivery: unsuppress: %w", err)
	}
	return n > 0, nil
}

// CodeClass groups provider error codes into a few classes, for metric
// labels: none (no code); recipient (the number cannot take the message:
// 21211 invalid, 21610 unsubscribed, 21612 unreachable by SMS, 21614 not a
// mobile number, 30003 unreachable handset, 30005 unknown handset, 30006
// landline or unreachable carrier); filtered (30004 blocked, 30007 carrier
// filtering); other.
func CodeClass(code int) string {
	switch code {
	case 0:
		return "none"
	case 21211, 21610, 21612, 21614, 30003, 30005, 30006:
		return "recipient"
	case 30004, 30007:
		return "filtered"
	}
	return "other"
}

// RecipientKind names the record of whom an SMS went to, beside its
// delivery record: the keyed hash of the number, nothing in clear.
const RecipientKind = keyspace.RecordRecipient

// RecipientNote is the record that the SMS id of tenant goes to recipient
// (its keyed hash), for ttl: the worker's check writes it with the
// admission (throttle.ReserveOptions.Note), before the provider can call
// back, and a status callback's To is checked against it (WentTo) before
// it marks a number undeliverable.
func (s *Store) RecipientNote(tenant, id, recipient string, ttl time.Duration) *throttle.Note {
	return &throttle.Note{
		Key:   s.lim.RecordKey(tenant, id, RecipientKind),
		Value: s.lim.Subject(tasks.NormalizePhone(recipient)),
		TTL:   max(ttl, time.Second),
	}
}

// WentTo reports whether the SMS id of tenant is recorded as sent to
// recipient; known is false when no recipient is recorded for it.
func (s *Store) WentTo(ctx context.Context, tenant, id, recipient string) (same, known bool, err error) {
	got, err := s.rdb.Get(ctx, s.lim.RecordKey(tenant, id, RecipientKind)).Result()
	if errors.Is(err, redis.Nil) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("delivery: read recipient: %w", err)
	}
	return got == s.lim.Subject(tasks.NormalizePhone(recipient)), true, nil
}
