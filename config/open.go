package config

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/consent"
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
	// payload: Deps.Keys is nil).
	NoKeys bool
}

// Deps are what every command builds from its settings.
type Deps struct {
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
func Open(b Base, o Options) (*Deps, error) {
	defaults, err := plans.Parse(b.Rules)
	if err != nil {
		return nil, fmt.Errorf("%w: %sRULES: %w", ErrConfig, EnvPrefix, err)
	}
	var keys *tasks.Keyring
	if !o.NoKeys {
		if keys, err = tasks.ParseKeyring(b.PayloadKeys); err != nil {
			return nil, fmt.Errorf("%w: %sPAYLOAD_KEYS: %w", ErrConfig, EnvPrefix, err)
		}
	}
	d := &Deps{Redis: o.Redis, Keys: keys, Log: o.Logger, Registry: o.Registry, Plans: plans.NewLive(defaults)}
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
		return nil, fmt.Errorf("%w: %sCONSENT_RETENTION: %w", ErrConfig, EnvPrefix, err)
	}
	d.Queued = tasks.NewQueueQuota(d.Redis, b.QueuedCaps())
	return d, nil
}

// Follow starts applying the tenant plans in Redis to d.Plans until ctx
// ends, logging every change; onChange (optional) runs after each.
func (d *Deps) Follow(ctx context.Context, interval time.Duration, onChange func(version int64)) error {
	return d.Plans.Follow(ctx, d.Redis, interval, d.Log, onChange)
}

// LoadPlans reads the tenant plans once and returns the rules in force
// (for a tool: the commands that run follow them instead). A stored plan
// that no longer validates is left out, as workers leave it out, and
// reported in the error beside the policy; Redis trouble returns only the
// error.
func (d *Deps) LoadPlans(ctx context.Context) (plans.Policy, error) {
	snap, err := plans.NewStore(d.Redis, d.Plans.Defaults()).Load(ctx)
	if err != nil && snap.Version == 0 && snap.Plans == nil {
		return plans.Policy{}, err
	}
	return snap.Policy, err
}

// Close stops the limiter and closes the Redis client if Open made it.
func (d *Deps) Close() {
	if d.Limiter != nil {
		_ = d.Limiter.Close()
	}
	if d.ownRedis && d.Redis != nil {
		_ = d.Redis.Close()
	}
}

// GuardOptions are the redisguard options of b (REDIS_ALLOW_EVICTION,
// REDIS_CHECK_INTERVAL, REDIS_DEGRADED_FOR), for workers and the API alike.
func (b Base) GuardOptions() redisguard.Options {
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
func (d *Deps) StartGuard(ctx context.Context, b Base, waitReplicas int, what string) (*redisguard.Guard, redisguard.Report, error) {
	o := b.GuardOptions()
	o.WaitReplicas = waitReplicas
	o.Logger, o.Registerer = d.Log.With("component", "redis"), d.Registry
	g := redisguard.New(d.Redis, o)
	r, err := g.Start(ctx)
	if err != nil {
		return nil, redisguard.Report{}, fmt.Errorf("%s: %w", what, err)
	}
	return g, r, nil
}
