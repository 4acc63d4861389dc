package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
)

// HeaderIdempotencyKey is the request header of the IETF httpapi draft
// "The Idempotency-Key HTTP Header Field".
const HeaderIdempotencyKey = "Idempotency-Key"

// HeaderReplayed is set to "true" on a response replayed for a retry.
const HeaderReplayed = "Idempotent-Replayed"

// MaxIdempotencyKey bounds a key's length.
const MaxIdempotencyKey = 255

// ErrBadIdempotencyKey reports an Idempotency-Key header that does not parse.
var ErrBadIdempotencyKey = errors.New("bad Idempotency-Key")

// ParseIdempotencyKey reads the Idempotency-Key header: per the draft a
// Structured Field String ("..." with \" and \\ escapes, RFC 8941); a bare
// value of visible ASCII without quotes or spaces is accepted too, as most
// clients send one. The key is 1–255 characters. ok is false when the
// header is absent.
func ParseIdempotencyKey(h http.Header) (key string, ok bool, err error) {
	vals := h.Values(HeaderIdempotencyKey)
	if len(vals) == 0 {
		return "", false, nil
	}
	if len(vals) > 1 {
		return "", false, fmt.Errorf("%w: given %d times", ErrBadIdempotencyKey, len(vals))
	}
	key, err = parseKeyValue(vals[0])
	if err != nil {
		return "", false, err
	}
	return key, true, nil
}

func parseKeyValue(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", fmt.Errorf("%w: empty", ErrBadIdempotencyKey)
	}
	var b strings.Builder
	if v[0] == '"' {
		i := 1
		for ; i < len(v); i++ {
			c := v[i]
			switch {
			case c == '\\':
				i++
				if i == len(v) || (v[i] != '"' && v[i] != '\\') {
					return "", fmt.Errorf("%w: a backslash may only escape \" or \\", ErrBadIdempotencyKey)
				}
				b.WriteByte(v[i])
			case c == '"':
				if i != len(v)-1 {
					return "", fmt.Errorf("%w: characters after the closing quote (parameters are not supported)", ErrBadIdempotencyKey)
				}
				if b.Len() == 0 {
					return "", fmt.Errorf("%w: empty", ErrBadIdempotencyKey)
				}
				return checkKeyLen(b.String())
			case c < 0x20 || c > 0x7e:
				return "", fmt.Errorf("%w: only printable ASCII is allowed", ErrBadIdempotencyKey)
			default:
				b.WriteByte(c)
			}
		}
		return "", fmt.Errorf("%w: no closing quote", ErrBadIdempotencyKey)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return "", fmt.Errorf("%w: a bare key is visible ASCII without spaces, quotes or backslashes; quote it as a string (\"...\") otherwise", ErrBadIdempotencyKey)
		}
	}
	return checkKeyLen(v)
}

func checkKeyLen(k string) (string, error) {
	if len(k) > MaxIdempotencyKey {
		return "", fmt.Errorf("%w: %d characters, over %d", ErrBadIdempotencyKey, len(k), MaxIdempotencyKey)
	}
	return k, nil
}

// NotificationID is the id of the index-th notification of a request that
// carried Idempotency-Key key for tenant: "ik_" and 32 hex digits of
// SHA-256(tenant, key, index). A retry of the request gets the same ids, so
// it can never enqueue a notification twice — even when the idempotency
// record is gone (the id is then refused as still enqueued, or skipped by
// the workers as already sent). A single notification is index 0. Other
// tenants' keys never give the same id.
func NotificationID(tenant, key string, index int) string {
	h := sha256.New()
	h.Write([]byte("sluice-api-v1\x00" + tenant + "\x00"))
	h.Write([]byte(strconv.Itoa(len(key)) + ":" + key + "\x00" + strconv.Itoa(index)))
	// "_", not "-": asynqmon lists a task by its id up to the first '-',
	// which would show every keyed notification as "ik".
	return "ik_" + hex.EncodeToString(h.Sum(nil)[:16])
}

// IdempotencyRedisKey is the Redis key of tenant's record for key: the
// tenant in clear (it is the hash tag, the tenant's Cluster slot) and a
// hash of the key.
func IdempotencyRedisKey(tenant, key string) string {
	sum := sha256.Sum256([]byte(key))
	return keyspace.Idempotency(tenant, base64.RawURLEncoding.EncodeToString(sum[:]))
}

// idemRecord is what is kept per key: in flight (with its owner), then
// what the answer was — its status, how many notifications and their
// states, one letter each (one letter for all when they agree) — from
// which a replay is rebuilt: the ids are NotificationID(tenant, key, i).
// A 500-notification batch's record is about 200 bytes of Redis instead of
// the whole response (57 kB). Body is read only from records written
// before (they replay as kept).
type idemRecord struct {
	State       string    `json:"state"` // "processing" or "done"
	Owner       string    `json:"owner,omitempty"`
	Fingerprint string    `json:"fp,omitempty"`
	Status      int       `json:"status,omitempty"`
	Count       int       `json:"n,omitempty"`     // notifications answered
	Batch       bool      `json:"batch,omitempty"` // answered as a batch
	States      string    `json:"s,omitempty"`     // stateLetters, one per notification or one for all
	ContentType string    `json:"content_type,omitempty"`
	Location    string    `json:"location,omitempty"`
	Body        []byte    `json:"body,omitempty"`
	At          time.Time `json:"at"`
}

// stateLetters are the states an answer can hold, one letter each.
var stateLetters = map[string]byte{StateQueued: 'q', StateWaiting: 'w', StateSending: 'g', StateSent: 's', StateArchived: 'a',
	StateUnknown: 'u', StateDelivered: 'd', StateUndelivered: 'x', StateFailed: 'f'}

// compactAnswer turns an accepted answer into a record without its body;
// ok is false for an answer it cannot rebuild (then the body is kept).
func compactAnswer(rec *idemRecord, tenant, key string, batch bool, out []Accepted) bool {
	letters := make([]byte, len(out))
	for i, a := range out {
		c, known := stateLetters[a.State]
		if !known || a.Tenant != tenant || a.ID != NotificationID(tenant, key, i) {
			return false
		}
		letters[i] = c
	}
	rec.Count, rec.Batch, rec.States = len(out), batch, string(letters)
	if strings.Count(rec.States, rec.States[:1]) == len(rec.States) {
		rec.States = rec.States[:1]
	}
	return true
}

// replay rebuilds the answer a compact record stands for.
func (rec *idemRecord) replay(tenant, key string) (any, string, bool) {
	if rec.Count < 1 || (len(rec.States) != 1 && len(rec.States) != rec.Count) || (!rec.Batch && rec.Count != 1) {
		return nil, "", false
	}
	names := map[byte]string{}
	for st, c := range stateLetters {
		names[c] = st
	}
	out := make([]Accepted, rec.Count)
	for i := range out {
		c := rec.States[0]
		if len(rec.States) > 1 {
			c = rec.States[i]
		}
		st, ok := names[c]
		if !ok {
			return nil, "", false
		}
		out[i] = Accepted{ID: NotificationID(tenant, key, i), Tenant: tenant, State: st}
	}
	if !rec.Batch {
		return out[0], "/v1/notifications/" + out[0].ID, true
	}
	return BatchAccepted{Notifications: out}, "", true
}

const (
	stateProcessing = "processing"
	stateDone       = "done"
)

// idemStore keeps idempotency records in Redis.
type idemStore struct {
	rdb     redis.UniversalClient
	ttl     time.Duration // of a response
	lockTTL time.Duration // of a request in flight
}

// begin takes key for a new request, or returns the record a previous one
// left. It reads first, so a request in flight is seen without a write.
func (s *idemStore) begin(ctx context.Context, rkey string) (*idemRecord, string, error) {
	for try := 0; try < 3; try++ {
		rec, err := s.get(ctx, rkey)
		if err != nil || rec != nil {
			return rec, "", err
		}
		var owner [12]byte
		_, _ = rand.Read(owner[:])
		mine := &idemRecord{State: stateProcessing, Owner: base64.RawURLEncoding.EncodeToString(owner[:]), At: time.Now().UTC()}
		body, _ := json.Marshal(mine)
		ok, err := s.rdb.SetNX(ctx, rkey, body, s.lockTTL).Result()
		if err != nil {
			return nil, "", fmt.Errorf("api: idempotency record: %w", err)
		}
		if ok {
			return nil, mine.Owner, nil
		}
	}
	return nil, "", errors.New("api: idempotency record: it keeps changing; try again")
}

func (s *idemStore) get(ctx context.Context, rkey string) (*idemRecord, error) {
	raw, err := s.rdb.Get(ctx, rkey).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("api: idempotency record: %w", err)
	}
	var rec idemRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, fmt.Errorf("api: idempotency record does not read: %w", err)
	}
	return &rec, nil
}

// update changes the record if owner still holds it (keeping its TTL when
// ttl is 0, deleting it when rec is nil).
func (s *idemStore) update(ctx context.Context, rkey, owner string, rec *idemRecord, ttl time.Duration) error {
	return s.rdb.Watch(ctx, func(tx *redis.Tx) error {
		cur, err := s.getTx(ctx, tx, rkey)
		if err != nil {
			return err
		}
		if cur == nil || cur.State != stateProcessing || cur.Owner != owner {
			return nil // expired, or taken over: not ours to change
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			switch {
			case rec == nil:
				p.Del(ctx, rkey)
			case ttl == 0:
				body, _ := json.Marshal(rec)
				p.SetArgs(ctx, rkey, body, redis.SetArgs{KeepTTL: true})
			default:
				body, _ := json.Marshal(rec)
				p.Set(ctx, rkey, body, ttl)
			}
			return nil
		})
		return err
	}, rkey)
}

func (s *idemStore) getTx(ctx context.Context, tx *redis.Tx, rkey string) (*idemRecord, error) {
	raw, err := tx.Get(ctx, rkey).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var rec idemRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		return nil, err
	}
	return &rec, nil
}

// fingerprint identifies a request's content: method, path and body bytes.
func fingerprint(r *http.Request, body []byte) string {
	h := sha256.New()
	h.Write([]byte(r.Method + " " + r.URL.Path + "?" + r.URL.RawQuery + "\n"))
	h.Write(body)
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil))
}
