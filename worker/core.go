package worker

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
	"go.opentelemetry.io/otel/trace"
)

// core is what every stage of the send path shares: the settings, what
// every process opens (services: Redis, the limiter, the plans,
// the key ring, consent), the stores the stages read and write, the
// metrics and the log. It owns no state but the shutdown signal.
type core struct {
	cfg           Config
	log           *slog.Logger
	rdb           redis.UniversalClient
	limiter       *throttle.Limiter
	plans         *plans.Live
	metrics       *Metrics
	tracer        trace.Tracer
	keys          *tasks.Keyring
	layout        tasks.Layout
	client        *asynq.Client   // re-enqueues: reschedules, moves, fallbacks, digest spills
	delivery      *delivery.Store // recipient notes and delivery records
	consent       *consent.Store
	suppressCodes map[int]bool  // SMS_SUPPRESS_CODES; nil: no suppression list
	stopping      chan struct{} // closed when shutdown starts
	pace          atomic.Int64  // the providers' recent request time, ns (an average of the last few dozen)
}

// paced records a provider request's time in the recent pace.
func (co *core) paced(d time.Duration) {
	for {
		old := co.pace.Load()
		next := int64(d)
		if old > 0 {
			next = old + (int64(d)-old)/32
		}
		if co.pace.CompareAndSwap(old, next) {
			return
		}
	}
}

// paceOf is the providers' recent request time (0: none yet).
func (co *core) paceOf() time.Duration { return time.Duration(co.pace.Load()) }

func (co *core) archived(n tasks.Notification, reason string) {
	co.metrics.Archived.WithLabelValues(string(n.Channel), co.categoryLabel(n), reason).Inc()
}

// withRedis runs f, and while Redis cannot be reached runs it again every
// UnavailableRetry until ctx ends: a short outage costs seconds, not a trip
// through Asynq (which cannot move the task while Redis is away).
func (co *core) withRedis(ctx context.Context, log *slog.Logger, what string, f func(context.Context) error) error {
	start := time.Now()
	for tries := 1; ; tries++ {
		err := f(ctx)
		if err == nil || !unavailable(err) {
			if err == nil && tries > 1 {
				log.Info("redis answers again", "what", what, "after", time.Since(start).Round(time.Millisecond), "tries", tries)
			}
			return err
		}
		if tries == 1 {
			log.Warn(unavailableWhy(err)+"; nothing is sent meanwhile, trying again", "what", what, "every", co.cfg.UnavailableRetry, "err", err)
		}
		select {
		case <-time.After(co.cfg.UnavailableRetry):
		case <-ctx.Done():
			return err
		}
	}
}

// afterSendContext outlives the task's cancellation (the send happened; its
// record must be written) but not its deadline plus a grace period.
func (co *core) afterSendContext(ctx context.Context) (context.Context, context.CancelFunc) {
	deadline := time.Now().Add(co.cfg.ShutdownTimeout)
	if d, ok := ctx.Deadline(); ok && d.After(time.Now()) {
		deadline = d
	}
	return context.WithDeadline(context.WithoutCancel(ctx), deadline)
}

// categoryLabel bounds the category metric label to the categories the
// rules name, the default one, and "other".
func (co *core) categoryLabel(n tasks.Notification) string {
	c := n.CategoryOrDefault()
	if c == tasks.DefaultCategory || co.currentPolicy().Names(c) {
		return c
	}
	return "other"
}

// currentPlans is the policy in force and its version (0 before the plans
// are followed, and while no plan was ever set).
func (co *core) currentPlans() (plans.Policy, int64) {
	snap := co.plans.Current()
	return snap.Policy, snap.Version
}

// currentPolicy is the rules in force: SLUICE_RULES with the tenant plans
// of the latest version loaded. A check reads it once.
func (co *core) currentPolicy() plans.Policy { return co.plans.Policy() }

// unavailable tells Redis being away (network, loading, failover, memory
// full, replicas not acknowledging) from answers that retrying cannot
// change (bad input, a script error).
func unavailable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, throttle.ErrInvalidRule) || errors.Is(err, throttle.ErrInvalidKey) || errors.Is(err, throttle.ErrTooManyRules) {
		return false
	}
	if errors.Is(err, throttle.ErrNotReplicated) || errors.Is(err, throttle.ErrOutOfMemory) {
		return true
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		// OOM: at maxmemory under noeviction; NOREPLICAS: min-replicas-to-write;
		// MOVED/ASK: a slot's master changed under a WAITing check.
		for _, p := range []string{"LOADING", "READONLY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "BUSY", "OOM ", "NOREPLICAS", "MOVED ", "ASK "} {
			if strings.HasPrefix(msg, p) {
				return true
			}
		}
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrClosed) ||
		strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "EOF") ||
		strings.Contains(err.Error(), "connection reset")
}

// unavailableWhy says in a few words why Redis could not be used.
func unavailableWhy(err error) string {
	var rerr redis.Error
	switch {
	case errors.Is(err, throttle.ErrNotReplicated):
		return "redis replicas did not acknowledge the admission (REDIS_WAIT_REPLICAS)"
	case errors.Is(err, throttle.ErrOutOfMemory), errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "OOM "):
		return "redis is out of memory (maxmemory, noeviction)"
	}
	return "redis unreachable"
}
