// Package services opens what every Sluice process shares — one Redis
// client, the limiter, the payload key ring, the logger, the metrics
// registry, the rules in force, the consent store and the queued-work caps
// — from the shared settings (config.Base). app opens one Set per
// process and hands it to the parts it builds; a tool of cmd/sluice opens
// one for itself. config holds the settings only.
package services

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/internal/lifecycle"
	"github.com/sluicehq/sluice/internal/redisguard"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// Options are what Open takes besides the settings. All optional.
type Options struct {
	// Redis replaces the client built from the settings (dev mode, tests);
	// the caller closes it.
	Redis redis.UniversalClient
	// Logger; default: the settings' level and format on stderr.
	Logger *slog.Logger
	// LogOutput is where the default logger writes; default os.Stderr.
	LogOutput io.Writer
	// Registry for metrics; default a new one with Go and process collectors.
	Registry *prometheus.Registry
	// Limiter adds options to the limiter's (the secret and member form come
	// from the settings).
	Limiter throttle.Options
	// NoKeys skips the payload key ring (a tool that seals and opens no
	// payload: Set.Keys is nil).
	NoKeys bool
}

// Set is what every command builds from its settings.
type Set struct {
	Redis    redis.UniversalClient
	Limiter  *throttle.Limiter
	Keys     *tasks.Keyring
	Log      *slog.Logger
	Registry *prometheus.Registry
	// Plans are the rules in force: SLUICE_RULES, with the tenant plans in
	// Redis once Follow runs.
	Plans *plans.Live
	// Consent is the recipients' suppressions and consent ledger.
	Consent *consent.Store
	// Queued is the per-tenant caps on queued work (TENANT_MAX_QUEUED*).
	Queued *tasks.QueueQuota

	ownRedis bool
}

// Open builds the Redis client (without connecting), the limiter, the
// payload key ring, the logger, the registry and the rules of b.
func Open(b config.Base, o Options) (*Set, error) {
	defaults, err := plans.Parse(b.Rules)
	if err != nil {
		return nil, fmt.Errorf("%w: %sRULES: %w", config.ErrConfig, config.EnvPrefix, err)
	}
	var keys *tasks.Keyring
	if !o.NoKeys {
		if keys, err = tasks.ParseKeyring(b.PayloadKeys); err != nil {
			return nil, fmt.Errorf("%w: %sPAYLOAD_KEYS: %w", config.ErrConfig, config.EnvPrefix, err)
		}
	}
	d := &Set{Redis: o.Redis, Keys: keys, Log: o.Logger, Registry: o.Registry, Plans: plans.NewLive(defaults)}
	if d.Log == nil {
		out := o.LogOutput
		if out == nil {
			out = os.Stderr
		}
		d.Log = b.NewLogger(out)
	}
	if d.Registry == nil {
		d.Registry = prometheus.NewRegistry()
		d.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if d.Redis == nil {
		if d.Redis, err = b.NewRedisClient(); err != nil {
			return nil, err
		}
		d.ownRedis = true
	}
	lo := o.Limiter
	lo.Secret, lo.CompactMembers = []byte(b.SubjectSecret), b.CompactMembers
	if d.Limiter, err = throttle.New(d.Redis, lo); err != nil {
		d.Close()
		return nil, err
	}
	if d.Consent, err = consent.NewStore(d.Redis, d.Limiter, b.ConsentOptions()); err != nil {
		d.Close()
		return nil, fmt.Errorf("%w: %sCONSENT_RETENTION: %w", config.ErrConfig, config.EnvPrefix, err)
	}
	d.Queued = tasks.NewQueueQuota(d.Redis, b.QueuedCaps())
	d.Queued.CapsFor = func(tenant string, c tasks.Caps) tasks.Caps { // a plan's max-queued, max-queued-bytes
		n, by, setN, setB := d.Plans.Policy().QueuedCaps(tenant)
		if setN {
			c.Notifications = n
		}
		if setB {
			c.Bytes = by
		}
		return c
	}
	return d, nil
}

// Follow starts applying the tenant plans in Redis to d.Plans until ctx
// ends, logging every change; onChange (optional) runs after each.
func (d *Set) Follow(ctx context.Context, interval time.Duration, onChange func(version int64)) error {
	return d.Plans.Follow(ctx, d.Redis, interval, d.Log, onChange)
}

// LoadPlans reads the tenant plans once and returns the rules in force
// (for a tool: the commands that run follow them instead). A stored plan
// that no longer validates is left out, as workers leave it out, and
// reported in the error beside the policy; Redis trouble returns only the
// error.
func (d *Set) LoadPlans(ctx context.Context) (plans.Policy, error) {
	snap, err := plans.NewStore(d.Redis, d.Plans.Defaults()).Load(ctx)
	if err != nil && snap.Version == 0 && snap.Plans == nil {
		return plans.Policy{}, err
	}
	return snap.Policy, err
}

// Close stops the limiter and closes the Redis client if Open made it.
func (d *Set) Close() {
	if d.Limiter != nil {
		_ = d.Limiter.Close()
	}
	if d.ownRedis && d.Redis != nil {
		_ = d.Redis.Close()
	}
}

// GuardOptions are the redisguard options of b (REDIS_ALLOW_EVICTION,
// REDIS_CHECK_INTERVAL, REDIS_DEGRADED_FOR), for workers and the API alike.
func GuardOptions(b config.Base) redisguard.Options {
	o := redisguard.Options{Interval: b.RedisCheckInterval, AllowEviction: b.RedisAllowEviction, DegradedFor: b.RedisDegradedFor}
	if o.DegradedFor == 0 {
		o.DegradedFor = -1 // 0 means never here; the guard's zero is its default
	}
	return o
}

// StartGuard checks every Redis node's settings (an eviction policy stops
// the command unless REDIS_ALLOW_EVICTION; durability is logged) and keeps
// watching them, for evictions and full memory, until the guard's Stop.
// waitReplicas is the replicas admissions wait for (0 for the API). what
// names the command in the error ("start worker").
func (d *Set) StartGuard(ctx context.Context, b config.Base, waitReplicas int, what string) (*redisguard.Guard, redisguard.Report, error) {
	o := GuardOptions(b)
	o.WaitReplicas = waitReplicas
	o.Logger, o.Registerer = d.Log.With("component", "redis"), d.Registry
	g := redisguard.New(d.Redis, o)
	r, err := g.Start(ctx)
	if err != nil {
		return nil, redisguard.Report{}, fmt.Errorf("%s: %w", what, err)
	}
	return g, r, nil
}

// RunOptions say how a process runs its Set.
type RunOptions struct {
	// What names the process in errors ("worker", "api").
	What string
	// PlanInterval is how often the tenant plans are re-read besides the
	// change notices (SLUICE_PLAN_CHECK_INTERVAL).
	PlanInterval time.Duration
	// OnPlanChange, if set, runs after each change of plans applied.
	OnPlanChange func(version int64)
	// NoRedisChecks skips reading Redis's settings: dev mode's miniredis
	// has none and never evicts.
	NoRedisChecks bool
	// WaitReplicas are the replicas admissions wait for (0 for the API),
	// which the guard checks exist.
	WaitReplicas int
	// OnGuard, if set, gets the guard once it watches Redis, and its first
	// report (for /readyz and the checks a process adds).
	OnGuard func(*redisguard.Guard, redisguard.Report)
}

// Parts are the Set's parts, first in a process's list: the last to stop
// closes the Set (the limiter, and the Redis client if Open made it); then
// Redis is asked once, so a process that cannot use it (nothing listening,
// a wrong password, an untrusted certificate) fails at start with a clear
// error (outages once running are ridden out); Redis's settings are
// checked and watched (docs/redis.md, "Redis requirements"); and the
// tenant plans are followed.
func (d *Set) Parts(b config.Base, o RunOptions) []lifecycle.Part {
	parts := []lifecycle.Part{
		lifecycle.Func("services", nil, func(context.Context) error { d.Close(); return nil }),
		lifecycle.Func("redis", func(ctx context.Context) error { return d.ping(ctx, b, o.What) }, nil),
	}
	if !o.NoRedisChecks {
		var guard *redisguard.Guard
		parts = append(parts, lifecycle.Func("redis-guard",
			func(ctx context.Context) error {
				g, r, err := d.StartGuard(ctx, b, o.WaitReplicas, "start "+o.What)
				if err != nil {
					return err
				}
				guard = g
				if o.OnGuard != nil {
					o.OnGuard(g, r)
				}
				return nil
			},
			func(context.Context) error { guard.Stop(); return nil }))
	}
	var stopFollow context.CancelFunc
	return append(parts, lifecycle.Func("plans",
		func(ctx context.Context) error {
			var fctx context.Context
			fctx, stopFollow = context.WithCancel(context.WithoutCancel(ctx))
			if err := d.Follow(fctx, o.PlanInterval, o.OnPlanChange); err != nil {
				stopFollow()
				return err
			}
			return nil
		},
		func(ctx context.Context) error {
			stopFollow()
			select {
			case <-d.Plans.Done():
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}))
}

// ping asks Redis once, with an error that says what to fix.
func (d *Set) ping(ctx context.Context, b config.Base, what string) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := d.Redis.Ping(pctx).Err()
	if err == nil {
		return nil
	}
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &certErr) {
		trusted := config.EnvPrefix + "REDIS_CA_FILE is empty: the system roots"
		if b.RedisCAFile != "" {
			trusted = "the CAs in " + config.EnvPrefix + "REDIS_CA_FILE=" + b.RedisCAFile
		}
		return fmt.Errorf("start %s: redis (%sREDIS_URL): its TLS certificate is not trusted by %s: %w", what, config.EnvPrefix, trusted, err)
	}
	return fmt.Errorf("start %s: redis (%sREDIS_URL): %w", what, config.EnvPrefix, err)
}
