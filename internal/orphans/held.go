package orphans

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
)

// Held tasks: a task a worker holds in process, waiting for the slot it
// was admitted for, is Asynq-"active" and leased like a task being sent,
// so the lease sweep would find it only after After (15 s). Such a task
// is recovered in seconds instead:
//
//   - While it holds at least one, a worker's Holder beats every
//     BeatInterval (250 ms): one script call that stamps the holder with
//     Redis's clock in HoldersKey. Each task it holds is an entry of its
//     hash (HeldKey), written as the wait begins and deleted as it ends
//     (the latter riding the read the worker makes just before the send).
//     A worker holding nothing sends nothing.
//   - The sweeper reads HoldersKey with the lease sets it already reads
//     (unless its gate knows the list empty: an idle fleet reads nothing),
//     and while any holder is listed, every HeldOptions.Interval (250 ms).
//     A holder not stamped for HeldOptions.DeadAfter (1 s) by Redis's
//     clock is presumed dead; for each task it held, the worker's
//     HeldOptions.TakeOver fences the task's admission (only one sweeper,
//     and only while the holder has not begun the send, succeeds) and the
//     task goes back to the head of its queue (requeueOrphan without its lease check: the move
//     Asynq makes when a server stops with a task unfinished).
//
// Recovery: the holder's last stamp is at most BeatInterval before it
// stopped; a read finds it unstamped for DeadAfter at most an Interval
// after that, and it is presumed dead when the next read, an Interval
// later, finds the same stamp (two answered reads: a holder whose stamps
// an outage of Redis held up gets a beat to stamp again): at most
// DeadAfter + 2 × Interval (1.5 s) after it stopped, plus the takeover's
// round trips, then the dequeue.
//
// A live holder whose stamps were late (a starved CPU) may be presumed dead:
// the fence decides (see the worker's takeover): it either began its send
// first (the takeover fails; nothing moves), or it finds, just before its
// send, that it lost the task, and neither sends nor completes it.

// The keys of held tasks share the Redis Cluster hash tag "{held}" (one
// slot: a holder's stamp and its hash in one script).

// HoldersKey lists the holders (sorted set: member the holder's id, score
// its last stamp, Redis's clock in ms).
const HoldersKey = keyspace.Holders

// HeldKey is the hash of the tasks holder holds: field "<queue>\n<task
// id>\n<run>", value the worker's fence.
func HeldKey(holder string) string { return keyspace.Held(holder) }

// HeldTTL is how long a holder's keys live after its last stamp or hold.
const HeldTTL = time.Minute

// BeatInterval is how often a Holder holding a task stamps itself.
const BeatInterval = 250 * time.Millisecond

// DefaultDeadAfter is how long a holder may go unstamped before its tasks
// are taken over.
const DefaultDeadAfter = time.Second

// MinDeadAfter is the shortest DeadAfter: three beats.
const MinDeadAfter = 3 * BeatInterval

// holdScript stamps a holder while its hash holds tasks, after writing one
// (ARGV[2] not ""); a holder holding nothing is taken off the list.
//
// KEYS[1] holders  KEYS[2] the holder's hash
// ARGV[1] holder id  ARGV[2] field ("" none)  ARGV[3] value  ARGV[4] ttl ms
var holdScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[2] ~= '' then redis.call('HSET', KEYS[2], ARGV[2], ARGV[3]) end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('ZADD', KEYS[1], now, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return now
`)

// deadScript returns Redis's clock, how many holders are listed, and the
// id and stamp of each not stamped for ARGV[1] ms.
//
// KEYS[1] holders  ARGV[1] dead after, ms
var deadScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now, redis.call('ZCARD', KEYS[1])}
if out[2] == 0 then return out end
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[1])), 'WITHSCORES')
for _, v in ipairs(dead) do out[#out + 1] = v end
return out
`)

// forgetScript takes a holder off the list if it was not stamped since
// (ARGV[2]) and its hash is gone.
//
// KEYS[1] holders  KEYS[2] the holder's hash  ARGV[1] id  ARGV[2] stamp
var forgetScript = redis.NewScript(`
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not s or tonumber(s) ~= tonumber(ARGV[2]) or redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
return 1
`)

// Holder registers the tasks one worker holds waiting for their slots and
// stamps it while it holds any. Run keeps the stamps; Hold registers.
type Holder struct {
	rdb  redis.UniversalClient
	id   string
	log  *slog.Logger
	mu   sync.Mutex
	n    int           // tasks held
	wake chan struct{} // a first task is held
}

// NewHolder returns a Holder with an id of its own.
func NewHolder(rdb redis.UniversalClient, log *slog.Logger) *Holder {
	var b [12]byte
	_, _ = rand.Read(b[:])
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Holder{rdb: rdb, id: base64.RawURLEncoding.EncodeToString(b[:]), log: log, wake: make(chan struct{}, 1)}
}

// ID names the holder in HoldersKey.
func (h *Holder) ID() string { return h.id }

// heldField names one run's hold of a task: a task taken over may be held
// again, by the same holder, while its first run still waits.
func heldField(queue, id, run string) string { return queue + "\n" + id + "\n" + run }

// Hold registers task id of queue as held by one run of it (run: any
// name unique to the run), with the worker's fence, and stamps the holder;
// one round trip. The caller ends the hold with Unhold
// (or QueueUnhold) whatever happens. An error leaves the task to the lease
// sweep (After) should the worker die; the hold still counts.
func (h *Holder) Hold(ctx context.Context, queue, id, run, fence string) error {
	h.mu.Lock()
	h.n++
	if h.n == 1 {
		select {
		case h.wake <- struct{}{}:
		default:
		}
	}
	h.mu.Unlock()
	err := holdScript.Run(ctx, h.rdb, []string{HoldersKey, HeldKey(h.id)}, h.id, heldField(queue, id, run), fence, HeldTTL.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("orphans: hold %s: %w", id, err)
	}
	return nil
}

// QueueUnhold queues on p the end of a hold (HDEL) and counts it ended.
func (h *Holder) QueueUnhold(ctx context.Context, p redis.Pipeliner, queue, id, run string) {
	p.HDel(ctx, HeldKey(h.id), heldField(queue, id, run))
	h.ended()
}

// Unhold ends a hold in a round trip of its own.
func (h *Holder) Unhold(ctx context.Context, queue, id, run string) {
	if err := h.rdb.HDel(ctx, HeldKey(h.id), heldField(queue, id, run)).Err(); err != nil {
		h.log.Debug("could not end a hold; its entry lapses with the holder's keys", "task", id, "err", err)
	}
	h.ended()
}

func (h *Holder) ended() {
	h.mu.Lock()
	h.n--
	h.mu.Unlock()
}

func (h *Holder) held() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// Run stamps the holder every BeatInterval while it holds a task, and once
// more when it holds none (which takes it off the list), until ctx ends.
func (h *Holder) Run(ctx context.Context) {
	t := time.NewTicker(BeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.wake:
		}
		t.Reset(BeatInterval)
		for held := true; held; {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			held = h.held() > 0
			h.beat(ctx)
		}
	}
}

func (h *Holder) beat(ctx context.Context) {
	bctx, cancel := context.WithTimeout(ctx, BeatInterval)
	defer cancel()
	if err := holdScript.Run(bctx, h.rdb, []string{HoldersKey, HeldKey(h.id)}, h.id, "", "", HeldTTL.Milliseconds()).Err(); err != nil && ctx.Err() == nil {
		h.log.Debug("holder: stamp not written", "err", err)
	}
}

// HeldTask is a task a dead holder held.
type HeldTask struct {
	Queue, ID string
	// Fence is what the worker wrote when it began to hold the task.
	Fence string
}

// HeldOptions turn on the recovery of held tasks (see Holder).
type HeldOptions struct {
	// DeadAfter is how long a holder may go unstamped by Redis's clock;
	// default DefaultDeadAfter, at least MinDeadAfter.
	DeadAfter time.Duration
	// Interval is how often holders are read while any is listed; default
	// BeatInterval.
	Interval time.Duration
	// TakeOver fences a dead holder's task: true when the task is now the
	// sweeper's to put back (its admission kept for its re-run), false
	// when it is not (its holder began the send, or another sweeper took
	// it over): it is then left alone.
	TakeOver func(ctx context.Context, t HeldTask) (bool, error)
	// OnRecovered is called for each task put back, with how long its
	// holder had gone unstamped (Redis's clock).
	OnRecovered func(t HeldTask, unseen time.Duration)
}

// heldState is the sweeper's knowledge of holders.
type heldState struct {
	opts    HeldOptions
	holders int64 // listed at the last read
	// suspects are the holders the last answered read found unstamped for
	// DeadAfter, with that stamp: presumed dead when the next read, at
	// least an Interval later, finds the same stamp (Redis answered both:
	// after an outage, a holder gets a beat to stamp again).
	suspects map[string]string
	seenAt   time.Time // when suspects were read
	// answered is when (Redis's clock, ms) this sweeper's reads began to be
	// answered again after one was not (0: the last one was not; 1: none
	// failed yet): a holder is then presumed dead only after Redis answered
	// for DeadAfter, as time without answers from Redis never counts
	// against a holder (whose stamps it held up too).
	answered int64

	// With a gate: the holders' list known empty (read so on the gate's
	// tracking connection, no write of it reported since) until quietUntil;
	// the sweep then does not read it. quietAt is the epoch it was read
	// empty in (-1: none); a reported write bumps epoch, which ends it.
	quietAt    atomic.Int64
	quietUntil time.Time
	epoch      atomic.Int64
}

// forget drops what the reads of holders found: Redis did not answer one.
func (h *heldState) forget() {
	h.suspects, h.answered = nil, 0
}

// quietFor is how long a quiet list is trusted without a write reported
// (the gate's own default recheck).
const quietFor = 10 * time.Second

// Written is for the gate's OnWrite: a write of the holders' list ends
// what the sweeper knew of it.
func (s *Sweeper) Written(keys []string) {
	if s.held == nil {
		return
	}
	for _, k := range keys {
		if k == HoldersKey {
			s.held.epoch.Add(1)
			return
		}
	}
}

// Forgot is for the gate's OnForget: writes may have gone unreported.
func (s *Sweeper) Forgot() {
	if s.held != nil {
		s.held.epoch.Add(1)
	}
}

// readHolders says whether a sweep reads the holders' list: not while it
// is known empty.
func (s *Sweeper) readHolders() bool {
	return s.held != nil && (s.held.quietAt.Load() != s.held.epoch.Load() || time.Now().After(s.held.quietUntil))
}

// confirmQuiet has the gate read the holders' list, found empty, on its
// tracking connection: still empty and not written since, the sweep skips
// it until a write is reported.
func (s *Sweeper) confirmQuiet(ctx context.Context) {
	if s.gate == nil || !s.gate.Active() {
		return
	}
	e := s.held.epoch.Load()
	if n, err := s.gate.Confirm(ctx, HoldersKey); err != nil || n != 0 {
		return
	}
	s.held.quietUntil = time.Now().Add(quietFor)
	s.held.quietAt.Store(e) // a write reported since (epoch > e) ends it at once
}

func newHeldState(o *HeldOptions) (*heldState, error) {
	if o == nil {
		return nil, nil
	}
	if o.TakeOver == nil {
		return nil, fmt.Errorf("%w: held tasks without TakeOver", ErrOptions)
	}
	if o.DeadAfter == 0 {
		o.DeadAfter = DefaultDeadAfter
	}
	if o.DeadAfter < MinDeadAfter {
		return nil, fmt.Errorf("%w: DeadAfter %v is below %v (three beats)", ErrOptions, o.DeadAfter, MinDeadAfter)
	}
	if o.Interval <= 0 {
		o.Interval = BeatInterval
	}
	h := &heldState{opts: *o, answered: 1}
	h.quietAt.Store(-1)
	return h, nil
}

// queueDead queues the read of dead holders on p (the script itself: a
// pipeline cannot load it on a miss).
func (s *Sweeper) queueDead(ctx context.Context, p redis.Pipeliner) *redis.Cmd {
	return deadScript.Eval(ctx, p, []string{HoldersKey}, s.held.opts.DeadAfter.Milliseconds())
}

// SweepHeld reads the holders once and takes over the tasks of those
// presumed dead; it returns the ids put back.
func (s *Sweeper) SweepHeld(ctx context.Context) ([]string, error) {
	if s.held == nil {
		return nil, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 2*s.held.opts.Interval+time.Second)
	defer cancel()
	return s.recoverHeld(cctx, deadScript.Run(cctx, s.rdb, []string{HoldersKey}, s.held.opts.DeadAfter.Milliseconds()))
}

// recoverHeld takes over the tasks of the dead holders cmd (queueDead) read.
func (s *Sweeper) recoverHeld(ctx context.Context, cmd *redis.Cmd) ([]string, error) {
	vals, err := cmd.Slice()
	if err == nil && len(vals) < 2 {
		err = errors.New("orphans: unexpected reply of the holders' read")
	}
	if err != nil {
		s.held.forget()
		return nil, err
	}
	now, _ := vals[0].(int64)
	s.held.holders, _ = vals[1].(int64)
	if s.held.answered == 0 {
		s.held.answered = now
	}
	if s.held.holders == 0 {
		s.confirmQuiet(ctx)
	}
	prev, confirm := s.held.suspects, time.Since(s.held.seenAt) >= s.held.opts.Interval*3/4
	s.held.suspects, s.held.seenAt = map[string]string{}, time.Now()
	var moved []string
	var errs []error
	for i := 2; i+1 < len(vals); i += 2 {
		id, _ := vals[i].(string)
		stamp, _ := vals[i+1].(string)
		ms, _ := strconv.ParseInt(stamp, 10, 64)
		if now-s.held.answered <= s.held.opts.DeadAfter.Milliseconds() {
			continue // Redis has not answered this sweeper for DeadAfter yet
		}
		if !confirm || prev[id] != stamp {
			s.held.suspects[id] = stamp
			continue
		}
		m, err := s.recoverHolder(ctx, id, stamp, time.Duration(now-ms)*time.Millisecond)
		moved = append(moved, m...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	return moved, errors.Join(errs...)
}

// recoverHolder takes over each task a dead holder held, then takes the
// holder off the list if nothing stamped it since.
func (s *Sweeper) recoverHolder(ctx context.Context, holder, stamp string, unseen time.Duration) ([]string, error) {
	key := HeldKey(holder)
	entries, err := s.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		return nil, err
	}
	var moved []string
	var errs []error
	for field, fence := range entries {
		parts := strings.SplitN(field, "\n", 3)
		if len(parts) != 3 {
			s.rdb.HDel(ctx, key, field)
			continue
		}
		q, id := parts[0], parts[1]
		t := HeldTask{Queue: q, ID: id, Fence: fence}
		mine, err := s.held.opts.TakeOver(ctx, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if mine {
			n, err := requeueOrphan.Run(ctx, s.rdb, requeueKeys(q, id), id, "").Int() // no lease to match: the fence decided
			if err != nil {
				errs = append(errs, err) // fenced, still active: the lease sweep puts it back
			} else if n == 1 {
				moved = append(moved, id)
				s.log.Info("requeued a task its worker held for its slot: the worker stopped answering", "task", id, "queue", q,
					"holder", holder, "unseen", unseen.Round(time.Millisecond))
				if s.onRequeued != nil {
					s.onRequeued(q, id)
				}
				if s.held.opts.OnRecovered != nil {
					s.held.opts.OnRecovered(t, unseen)
				}
			}
		}
		s.rdb.HDel(ctx, key, field)
	}
	if len(errs) == 0 {
		_ = forgetScript.Run(ctx, s.rdb, []string{HoldersKey, key}, holder, stamp).Err()
	}
	return moved, errors.Join(errs...)
}
