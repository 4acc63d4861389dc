package tasks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
)

// Per-tenant caps on queued work (one tenant cannot fill the Redis every
// tenant shares). Each notification a producer enqueues is entered in its
// tenant's ledger (a sorted set of ids by lapse time, a hash of their
// stored bytes, their sum) before it is enqueued, in one script that checks
// the caps first: past either cap nothing is entered and the producer
// enqueues nothing. A worker takes the id out when the notification
// leaves the queue (sent, archived, dropped); an entry whose removal was
// lost in a crash lapses after Caps.TTL (or at the notification's
// expires_at), so counts cannot drift up for ever.

// ErrQueueFull reports a tenant at its cap of queued notifications or bytes.
var ErrQueueFull = errors.New("tenant's queued work is at its cap")

// QueueFullError says which cap refused and how full it is; it wraps ErrQueueFull.
type QueueFullError struct {
	Tenant string
	Cap    string // "notifications" or "bytes"
	Limit  int64
	Used   int64 // queued now (notifications or bytes)
	Want   int64 // what the refused request adds
}

func (e *QueueFullError) Error() string {
	return fmt.Sprintf("tenant %s has %d of %d %s queued; %d more do not fit (nothing enqueued)", e.Tenant, e.Used, e.Limit, e.Cap, e.Want)
}

func (e *QueueFullError) Unwrap() error { return ErrQueueFull }

// TaskOverhead is what Redis spends on one queued task besides its payload
// (Asynq's task hash, its entry in its tenant's waiting room or a list or
// set, the ledger's entries), in bytes: measured with used_memory in e2e
// TestTenantQueuedCap, 1,435 to 1,527 B per small SMS in all (about 180 B
// of it payload) when tasks waited in lists, 1,703 to 1,704 B since they
// wait in their tenant's room (a sorted set entry), with a margin.
const TaskOverhead = 1600

// StoredBytes is what a notification is counted as against its tenant's
// byte cap: its encoded payload plus TaskOverhead (sealing adds 29 bytes).
func StoredBytes(n Notification) int64 {
	p, err := n.Normalized().Encode()
	if err != nil {
		return TaskOverhead
	}
	return int64(len(p)) + 29 + TaskOverhead
}

// Caps bound one tenant's queued work. Zero Notifications or Bytes: no cap.
type Caps struct {
	Notifications int64
	Bytes         int64
	// TTL is the longest an entry counts: the safety net for a removal a
	// crash lost. A notification waiting longer stops counting.
	TTL time.Duration
}

// QueueQuota keeps the per-tenant ledgers of queued work in Redis. Safe for
// concurrent use.
type QueueQuota struct {
	rdb  redis.UniversalClient
	caps Caps
	// CapsFor, when set, gives a tenant's caps (a tenant plan's
	// max-queued, max-queued-bytes) from the defaults; set it before use.
	CapsFor func(tenant string, defaults Caps) Caps
}

// capsOf are tenant's caps in force.
func (q *QueueQuota) capsOf(tenant string) Caps {
	if q.CapsFor == nil {
		return q.caps
	}
	c := q.CapsFor(tenant, q.caps)
	c.TTL = q.caps.TTL
	return c
}

// NewQueueQuota returns the ledgers on rdb under caps.
func NewQueueQuota(rdb redis.UniversalClient, caps Caps) *QueueQuota {
	if caps.TTL <= 0 {
		caps.TTL = 48 * time.Hour
	}
	return &QueueQuota{rdb: rdb, caps: caps}
}

// Caps returns the caps in force.
func (q *QueueQuota) Caps() Caps { return q.caps }

// queuedKeys are one tenant's ledger keys, in its Cluster slot.
func queuedKeys(tenant string) []string {
	due, bytes, total := keyspace.Queued(tenant)
	return []string{due, bytes, total}
}

// KEYS[1] due (zset id -> lapse ms)  KEYS[2] bytes (hash id -> bytes)  KEYS[3] total
// ARGV[1] max notifications (0: none)  ARGV[2] max bytes (0: none)  ARGV[3] key ttl ms
// ARGV[4..] triples: id, bytes, ttl ms of the entry
// Returns {1, entered} or {0, cap, used, want}; {2, count, bytes} for a
// call with no items (usage).
var reserveQueued = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 10000)
for _, id in ipairs(lapsed) do
  total = total - tonumber(redis.call('HGET', KEYS[2], id) or '0')
  redis.call('HDEL', KEYS[2], id)
  redis.call('ZREM', KEYS[1], id)
end
if total < 0 then total = 0 end
local n = redis.call('ZCARD', KEYS[1])
if #ARGV < 4 then
  if #lapsed > 0 then redis.call('SET', KEYS[3], string.format('%d', total), 'KEEPTTL') end
  return {2, n, string.format('%d', total)}
end
-- One ZMSCORE, ZADD and HSET per chunk of ids instead of three calls an id
-- (unpack's limit is 8,000 values: chunks of 1,000 ids). An id twice in
-- one call counts once.
local CHUNK = 1000
local fresh, seen = {}, {}
for c = 4, #ARGV, 3 * CHUNK do
  local ids = {}
  for i = c, math.min(#ARGV, c + 3 * CHUNK - 1), 3 do
    ids[#ids + 1] = ARGV[i]
  end
  local scores = redis.call('ZMSCORE', KEYS[1], unpack(ids))
  for j = 1, #ids do
    local i = c + 3 * (j - 1)
    if not scores[j] and not seen[ARGV[i]] then
      seen[ARGV[i]] = true
      fresh[#fresh + 1] = i
    end
  end
end
local addB = 0
for _, i in ipairs(fresh) do
  addB = addB + tonumber(ARGV[i + 1])
end
local maxN, maxB = tonumber(ARGV[1]), tonumber(ARGV[2])
if maxN > 0 and n + #fresh > maxN then
  return {0, 'notifications', n, #fresh}
end
if maxB > 0 and total + addB > maxB then
  return {0, 'bytes', string.format('%d', total), string.format('%d', addB)}
end
for c = 1, #fresh, CHUNK do
  local z, h = {'NX'}, {}
  for k = c, math.min(#fresh, c + CHUNK - 1) do
    local i = fresh[k]
    z[#z + 1] = now + tonumber(ARGV[i + 2])
    z[#z + 1] = ARGV[i]
    h[#h + 1] = ARGV[i]
    h[#h + 1] = ARGV[i + 1]
  end
  redis.call('ZADD', KEYS[1], unpack(z))
  redis.call('HSET', KEYS[2], unpack(h))
end
total = total + addB
local entered = #fresh
redis.call('SET', KEYS[3], string.format('%d', total), 'PX', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {1, entered}
`)

// KEYS as reserveQueued; ARGV ids. Returns how many were removed.
var releaseQueued = redis.NewScript(`
local total = tonumber(redis.call('GET', KEYS[3]) or '0')
local removed = 0
for i = 1, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    total = total - tonumber(redis.call('HGET', KEYS[2], ARGV[i]) or '0')
    redis.call('HDEL', KEYS[2], ARGV[i])
    removed = removed + 1
  end
end
if removed > 0 then
  if total < 0 then total = 0 end
  redis.call('SET', KEYS[3], string.format('%d', total), 'KEEPTTL')
end
return removed
`)

// Reserve enters ns (all of one tenant, ids set) in their tenant's ledger,
// all or none: past a cap it returns a *QueueFullError and enters nothing.
// Ids already entered (a retry) count once.
func (q *QueueQuota) Reserve(ctx context.Context, ns ...Notification) error {
	return q.ReserveTenants(ctx, ns)
}

// ReserveTenants is Reserve for several tenants at once, in one round trip
// (a pipeline of their scripts): groups[i] are all of one tenant. All or
// none: past any tenant's cap it takes the other groups' entries out again
// and returns that tenant's *QueueFullError (the first in groups' order).
func (q *QueueQuota) ReserveTenants(ctx context.Context, groups ...[]Notification) error {
	var rs []*reservation
	for _, ns := range groups {
		if len(ns) == 0 {
			continue
		}
		r, err := q.reservation(ns)
		if err != nil {
			return err
		}
		rs = append(rs, r)
	}
	cmds := make([]*redis.Cmd, len(rs))
	send := func(eval bool) {
		_, _ = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, r := range rs {
				if eval {
					cmds[i] = reserveQueued.Eval(ctx, p, queuedKeys(r.tenant), r.argv...)
				} else {
					cmds[i] = reserveQueued.EvalSha(ctx, p, queuedKeys(r.tenant), r.argv...)
				}
			}
			return nil
		})
	}
	send(false)
	if slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return redis.HasErrorPrefix(c.Err(), "NOSCRIPT") }) {
		// Redis had not seen the script (a fresh server): the calls that
		// ran NOSCRIPT changed nothing, those that ran are retries that
		// count their ids once.
		send(true)
	}
	var first error
	entered := make([]bool, len(rs))
	for i, r := range rs {
		res, err := cmds[i].Slice()
		if err != nil {
			err = fmt.Errorf("tasks: reserve queued work of %s: %w", r.tenant, err)
		} else {
			err = r.verdict(res)
		}
		entered[i] = err == nil
		if err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		for i, r := range rs {
			if entered[i] {
				_, _ = q.Release(context.WithoutCancel(ctx), r.tenant, r.ids...) // else they lapse after TTL
			}
		}
	}
	return first
}

// reservation is one tenant's Reserve call: its script arguments.
type reservation struct {
	tenant string
	caps   Caps
	argv   []any
	ids    []string
}

func (q *QueueQuota) reservation(ns []Notification) (*reservation, error) {
	tenant := ns[0].Tenant
	caps := q.capsOf(tenant)
	ttl := caps.TTL
	r := &reservation{tenant: tenant, caps: caps, argv: []any{caps.Notifications, caps.Bytes, (ttl + time.Minute).Milliseconds()}}
	for _, n := range ns {
		if n.Tenant != tenant {
			return nil, fmt.Errorf("tasks: reserve queued work: one tenant per call, got %q and %q", tenant, n.Tenant)
		}
		if n.ID == "" {
			return nil, fmt.Errorf("tasks: reserve queued work: %w", invalid("id", "is required"))
		}
		life := ttl
		if !n.ExpiresAt.IsZero() {
			life = min(life, max(time.Until(n.ExpiresAt)+time.Minute, time.Minute))
		}
		r.argv = append(r.argv, n.ID, StoredBytes(n), life.Milliseconds())
		r.ids = append(r.ids, n.ID)
	}
	return r, nil
}

// verdict reads the script's reply: nil, or the *QueueFullError of a cap.
func (r *reservation) verdict(res []any) error {
	if ok, _ := res[0].(int64); ok == 0 && len(res) == 4 {
		e := &QueueFullError{Tenant: r.tenant, Cap: fmt.Sprint(res[1]), Limit: r.caps.Notifications, Used: toInt(res[2]), Want: toInt(res[3])}
		if e.Cap == "bytes" {
			e.Limit = r.caps.Bytes
		}
		return e
	}
	return nil
}

// Release takes ids out of tenant's ledger (they left the queue); ids not
// in it are ignored. It returns how many were in.
func (q *QueueQuota) Release(ctx context.Context, tenant string, ids ...string) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	argv := make([]any, len(ids))
	for i, id := range ids {
		argv[i] = id
	}
	n, err := releaseQueued.Run(ctx, q.rdb, queuedKeys(tenant), argv...).Int()
	if err != nil {
		return 0, fmt.Errorf("tasks: release queued work of %s: %w", tenant, err)
	}
	return n, nil
}

// QueuedUsage is a tenant's queued work against its caps.
type QueuedUsage struct {
	Notifications, Bytes       int64
	MaxNotifications, MaxBytes int64
}

// Usage returns tenant's queued work (lapsed entries dropped first).
func (q *QueueQuota) Usage(ctx context.Context, tenant string) (QueuedUsage, error) {
	caps := q.capsOf(tenant)
	res, err := reserveQueued.Run(ctx, q.rdb, queuedKeys(tenant), caps.Notifications, caps.Bytes, caps.TTL.Milliseconds()).Slice()
	if err != nil {
		return QueuedUsage{}, fmt.Errorf("tasks: queued work of %s: %w", tenant, err)
	}
	return QueuedUsage{Notifications: toInt(res[1]), Bytes: toInt(res[2]), MaxNotifications: caps.Notifications, MaxBytes: caps.Bytes}, nil
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

// Enqueue is tasks.Enqueue under the caps: n is entered in its tenant's
// ledger first (refused with a *QueueFullError past a cap, nothing
// enqueued) and taken out again if the enqueue fails (not for
// ErrDuplicate: the id is queued, by an earlier call).
func (q *QueueQuota) Enqueue(ctx context.Context, c *asynq.Client, keys *Keyring, n Notification, opts ...asynq.Option) (*asynq.TaskInfo, error) {
	if n.ID == "" {
		n.ID = NewID()
	}
	if err := q.Reserve(ctx, n); err != nil {
		return nil, err
	}
	info, err := Enqueue(ctx, c, keys, n, opts...)
	if err != nil && !errors.Is(err, ErrDuplicate) {
		if _, rerr := q.Release(context.WithoutCancel(ctx), n.Tenant, n.ID); rerr != nil {
			err = errors.Join(err, rerr) // lapses after TTL
		}
	}
	return info, err
}
