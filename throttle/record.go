package throttle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RecordKind is what a notification's record (Reserve's state key) says.
type RecordKind byte

// The kinds of record, as the limiter library writes them (scripts/op_reserve.lua, op_done.lua).
const (
	RecordBooked   RecordKind = 'b' // its attempt holds a slot ahead
	RecordAdmitted RecordKind = 'a' // its attempt was admitted: maybe sent
	RecordDone     RecordKind = 'd' // its attempt's send completed (MarkDone)
)

// Record is a notification's record: "b<attempt>:<slot ms>:<nonce>",
// "a<attempt>:<slot ms>:<nonce>" or "d<attempt>:<ms>". Only this package
// writes (scripts/op_reserve.lua, op_release.lua, op_done.lua) and reads
// (ParseRecord) it.
type Record struct {
	Kind    RecordKind
	Attempt int
	// At is the slot (booked, admitted) or when the send was recorded
	// (done); zero if unknown.
	At time.Time
	// Nonce names the run that booked or admitted it ("" if none).
	Nonce string
}

// ErrBadRecord reports a record this version cannot read.
var ErrBadRecord = errors.New("throttle: unreadable notification record")

// ParseRecord reads a notification record.
func ParseRecord(s string) (Record, error) {
	if len(s) < 2 || (s[0] != byte(RecordBooked) && s[0] != byte(RecordAdmitted) && s[0] != byte(RecordDone)) {
		return Record{}, ErrBadRecord
	}
	att, rest, ok := strings.Cut(s[1:], ":")
	if !ok {
		return Record{}, ErrBadRecord
	}
	n, err := strconv.Atoi(att)
	if err != nil || n < 0 || len(att) > 9 {
		return Record{}, ErrBadRecord
	}
	ms, nonce, _ := strings.Cut(rest, ":")
	t, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || t < 0 || t > 1<<50 {
		return Record{}, ErrBadRecord
	}
	r := Record{Kind: RecordKind(s[0]), Attempt: n, Nonce: nonce}
	if t > 0 {
		r.At = time.UnixMilli(t).UTC()
	}
	return r, nil
}

// Record reads id's record in group: nil when there is none (never
// reserved, released, or expired) or when it is not one this version can
// read.
func (l *Limiter) Record(ctx context.Context, group, id string) (*Record, error) {
	raw, err := l.client.Get(ctx, l.StateKey(group, id)).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("throttle: record: %w", err)
	}
	r, err := ParseRecord(raw)
	if err != nil {
		return nil, nil
	}
	return &r, nil
}

// Records reads the records of ids in group, in one round trip: each as
// Record reads it (nil: none, or not one this version reads).
func (l *Limiter) Records(ctx context.Context, group string, ids []string) ([]*Record, error) {
	cmds := make([]*redis.StringCmd, len(ids))
	_, err := l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.Get(ctx, l.StateKey(group, id))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("throttle: records: %w", err)
	}
	out := make([]*Record, len(ids))
	for i, c := range cmds {
		raw, err := c.Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue
		case err != nil:
			return nil, fmt.Errorf("throttle: records: %w", err)
		}
		if r, err := ParseRecord(raw); err == nil {
			out[i] = &r
		}
	}
	return out, nil
}

// RecordKey returns the key of another record about id beside its own,
// in the same hash slot: StateKey(group, id) + ":" + kind (e.g. "dlv" for
// the delivery report of an SMS).
func (l *Limiter) RecordKey(group, id, kind string) string {
	return l.space.Record(group, l.Member(id), kind)
}
