package tasks

import (
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/keyspace"
)

// Lane is the part of the queue a notification waits in. Workers serve the
// priority lane with its own dequeuer and slots, so nothing in the standard
// or bulk lanes is ever ahead of a priority notification; bulk shares the
// standard dequeuer at a lower weight, so it never starves standard.
type Lane string

// The lanes.
const (
	// LanePriority holds the categories the rules exempt (sms.otp:exempt):
	// OTPs, fraud alerts.
	LanePriority Lane = "priority"
	// LaneStandard holds everything that is neither exempt nor bulk.
	LaneStandard Lane = "standard"
	// LaneBulk holds the categories the rules mark bulk (sms.marketing:bulk,
	// email.newsletter:bulk).
	LaneBulk Lane = "bulk"
)

// Lanes lists every lane, most urgent first.
var Lanes = []Lane{LanePriority, LaneStandard, LaneBulk}

// Bounds of a Layout.
const (
	DefaultShards = 8
	MaxShards     = 64
)

// ErrLayout reports a queue layout that cannot be used.
var ErrLayout = errors.New("bad queue layout")

// DefaultLayout is the layout of a deployment that sets neither
// SLUICE_QUEUE nor SLUICE_QUEUE_SHARDS: what Enqueue routes to.
var DefaultLayout = Layout{Base: DefaultQueue, Shards: DefaultShards}

// Layout names the Asynq queues of a deployment: each lane is split into
// Shards queues, "<base>.<lane>.<shard>", and a tenant's notifications of
// one lane always go to the same shard, so per tenant and lane they keep
// their enqueue order, and one tenant's flood delays only the tenants that
// share its shard. Every queue name is its own Redis Cluster hash tag, so
// the shards spread over a Cluster's masters. Producers and workers must
// use the same Base and Shards (SLUICE_QUEUE, SLUICE_QUEUE_SHARDS).
//
// Base itself is the single queue of releases before lanes: workers still
// serve it (Legacy), so tasks enqueued there are never stranded.
type Layout struct {
	// Base starts every queue name; "" means DefaultQueue.
	Base string
	// Shards is the number of queues per lane, 1–MaxShards; 0 means DefaultShards.
	Shards int
}

func (l Layout) base() string {
	if l.Base == "" {
		return DefaultQueue
	}
	return l.Base
}

func (l Layout) shards() int {
	if l.Shards == 0 {
		return DefaultShards
	}
	return l.Shards
}

// Validate reports a base name that Asynq or the shard names cannot carry,
// or a shard count out of bounds.
func (l Layout) Validate() error {
	b := l.base()
	if len(b) > 64 {
		return fmt.Errorf("%w: queue base %q is longer than 64 characters", ErrLayout, b)
	}
	for i := 0; i < len(b); i++ {
		c := b[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("%w: queue base %q: only A-Z a-z 0-9 _ - . are allowed", ErrLayout, b)
		}
	}
	if n := l.shards(); n < 1 || n > MaxShards {
		return fmt.Errorf("%w: %d shards, want 1 to %d", ErrLayout, n, MaxShards)
	}
	return nil
}

// Legacy is the single queue of earlier releases (Base): still served, no
// longer written by Sluice's producers.
func (l Layout) Legacy() string { return l.base() }

// Queue names shard of lane: "<base>.<lane>.<shard>", with a "-K" suffix
// where one is needed to put the name's Redis Cluster hash slot in the
// shard's share of the slot space (shard i of n: slots [i·16384/n,
// (i+1)·16384/n)), so the shards spread evenly over a Cluster's masters
// instead of wherever CRC16 happens to put similar names.
func (l Layout) Queue(lane Lane, shard int) string {
	key := queueKey{l.base(), l.shards(), lane, shard}
	if q, ok := queueNames.Load(key); ok {
		return q.(string)
	}
	q := keyspace.InShare(l.base()+"."+string(lane)+"."+strconv.Itoa(shard), shard, key.n)
	queueNames.Store(key, q)
	return q
}

type queueKey struct {
	base  string
	n     int
	lane  Lane
	shard int
}

var queueNames sync.Map // queueKey → name

// LaneQueues lists the shards of one lane.
func (l Layout) LaneQueues(lane Lane) []string {
	out := make([]string, l.shards())
	for i := range out {
		out[i] = l.Queue(lane, i)
	}
	return out
}

// Queues lists every lane's shards, priority first, then the legacy queue:
// everything a worker serves.
func (l Layout) Queues() []string {
	var out []string
	for _, lane := range Lanes {
		out = append(out, l.LaneQueues(lane)...)
	}
	return append(out, l.Legacy())
}

// KeyPrefix is the one Redis key prefix every Asynq key of the layout's
// queues starts with ("asynq:{<base>": the legacy queue's "asynq:{<base>}:…"
// and every shard's "asynq:{<base>.…"). It may match other queues whose
// names start with the base too.
func (l Layout) KeyPrefix() string { return keyspace.QueuesStartingWith(l.base()) }

// Parse tells which lane and shard a queue name of this layout is; ok is
// false for the legacy queue and for names of other layouts.
func (l Layout) Parse(queue string) (lane Lane, shard int, ok bool) {
	rest, found := strings.CutPrefix(queue, l.base()+".")
	if !found {
		return "", 0, false
	}
	name, num, found := strings.Cut(rest, ".")
	if !found {
		return "", 0, false
	}
	num, _, _ = strings.Cut(num, "-")
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 || n >= l.shards() || strconv.Itoa(n) != num {
		return "", 0, false
	}
	for _, ln := range Lanes {
		if string(ln) == name && l.Queue(ln, n) == queue {
			return ln, n, true
		}
	}
	return "", 0, false
}

// Pins give tenants shards of their own (a tenant plan's shard=K): no
// other tenant is routed to a pinned shard.
type Pins map[string]int

// Shard is the shard of tenant: its pin when it has one inside the layout,
// else the highest-scoring of the shards nobody is pinned to (rendezvous
// hashing, so pinning a shard moves only the tenants that were on it).
func (l Layout) Shard(tenant string, pins Pins) int {
	n := l.shards()
	if s, ok := pins[tenant]; ok && s >= 0 && s < n {
		return s
	}
	taken := map[int]bool{}
	for _, s := range pins {
		if s >= 0 && s < n {
			taken[s] = true
		}
	}
	if len(taken) == n {
		taken = nil // every shard is someone's: share them all
	}
	best, bestScore := 0, uint64(0)
	for s := 0; s < n; s++ {
		if taken[s] {
			continue
		}
		h := fnv.New64a()
		h.Write([]byte(tenant))
		h.Write([]byte{0, byte(s)})
		if sc := h.Sum64(); sc >= bestScore {
			best, bestScore = s, sc
		}
	}
	return best
}

// Route is the queue of a tenant's notification in lane.
func (l Layout) Route(tenant string, lane Lane, pins Pins) string {
	return l.Queue(lane, l.Shard(tenant, pins))
}

// DefaultLane is the lane a producer without the rules routes a category
// to, by convention: otp, 2fa, mfa, verification, fraud, fraud_alert,
// fraud-alert and security to the priority lane; marketing, promo,
// promotion, promotional, newsletter, campaign, digest and bulk to the
// bulk lane; everything else to standard. Workers route by the rules in
// force (exempt categories are priority, bulk ones bulk) and move a task
// whose queue differs at its first check, so a convention that the rules
// do not follow costs one move, never a lost or misordered lane.
func DefaultLane(category string) Lane {
	switch category {
	case "otp", "2fa", "mfa", "verification", "fraud", "fraud_alert", "fraud-alert", "security":
		return LanePriority
	case "marketing", "promo", "promotion", "promotional", "newsletter", "campaign", "digest", "bulk":
		return LaneBulk
	}
	return LaneStandard
}

// Candidates lists the queues a tenant's task may be in, most likely
// first: the tenant's shard of each lane under pins, its shard without
// them (a task enqueued before a pin), and the legacy queue. A tenant of
// "" (a reader that does not know it) gets every queue.
func (l Layout) Candidates(tenant string, pins Pins) []string {
	if tenant == "" {
		return l.Queues()
	}
	var out []string
	for _, s := range []int{l.Shard(tenant, pins), l.Shard(tenant, nil)} {
		for _, lane := range Lanes {
			if q := l.Queue(lane, s); !containsString(out, q) {
				out = append(out, q)
			}
		}
	}
	return append(out, l.Legacy())
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// FindTask looks up task id in the queues it may be in (Candidates). It
// returns asynq.ErrTaskNotFound when none holds it.
func (l Layout) FindTask(insp *asynq.Inspector, tenant string, pins Pins, id string) (*asynq.TaskInfo, error) {
	for _, q := range l.Candidates(tenant, pins) {
		info, err := insp.GetTaskInfo(q, id)
		switch {
		case err == nil:
			return info, nil
		case errors.Is(err, asynq.ErrTaskNotFound), errors.Is(err, asynq.ErrQueueNotFound):
		default:
			return nil, err
		}
	}
	return nil, fmt.Errorf("task %s: %w", id, asynq.ErrTaskNotFound)
}
