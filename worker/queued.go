package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicehq/sluice/tasks"
)

// releaser takes notifications that left the queue out of their tenants'
// counts of queued work (tasks.QueueQuota) in the background, group
// commit: while one call is on its way, the ids that leave meanwhile wait
// and go together, one call per tenant. A send does not wait for its
// removal, and a busy worker makes far fewer calls than it sends. A
// tenant's count lags its queue by removalLinger and a round trip; a removal lost
// (Redis away for longer than removalTimeout) lapses after
// TENANT_QUEUED_TTL.
type releaser struct {
	q   *tasks.QueueQuota
	log *slog.Logger

	mu      sync.Mutex
	pending map[string][]string // by tenant
	busy    bool
	wg      sync.WaitGroup
}

// removalLinger is how long the first removal of a batch waits for
// company: at a few thousand sends a second, tens of removals per call.
const removalLinger = 5 * time.Millisecond

// removalTimeout bounds one call of removals.
const removalTimeout = 2 * time.Second

// maxRemovals is the most ids one call removes.
const maxRemovals = 500

func newReleaser(q *tasks.QueueQuota, log *slog.Logger) *releaser {
	return &releaser{q: q, log: log, pending: map[string][]string{}}
}

// add queues the removal of id from tenant's count.
func (r *releaser) add(tenant, id string) {
	r.mu.Lock()
	r.pending[tenant] = append(r.pending[tenant], id)
	if r.busy {
		r.mu.Unlock()
		return
	}
	r.busy = true
	r.wg.Add(1)
	r.mu.Unlock()
	go r.run()
}

func (r *releaser) run() {
	defer r.wg.Done()
	time.Sleep(removalLinger) // a batching window: the sends finishing meanwhile join this call
	for {
		r.mu.Lock()
		if len(r.pending) == 0 {
			r.busy = false
			r.mu.Unlock()
			return
		}
		batch := r.pending
		r.pending = map[string][]string{}
		r.mu.Unlock()
		for tenant, ids := range batch {
			for len(ids) > 0 {
				chunk := ids[:min(len(ids), maxRemovals)]
				ids = ids[len(chunk):]
				ctx, cancel := context.WithTimeout(context.Background(), removalTimeout)
				if _, err := r.q.Release(ctx, tenant, chunk...); err != nil {
					r.log.Warn("could not take notifications out of their tenant's queued count; they lapse after TENANT_QUEUED_TTL", "tenant", tenant, "count", len(chunk), "err", err)
				}
				cancel()
			}
		}
	}
}

// wait returns once every removal queued so far was tried.
func (r *releaser) wait() { r.wg.Wait() }
