package app

import (
	"fmt"
	"io"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/sender/providers"
	"github.com/sluicehq/sluice/services"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// WorkerOptions are what NewWorker takes besides the configuration. All
// optional.
type WorkerOptions struct {
	// Redis replaces the client built from SLUICE_REDIS_URL (dev mode,
	// tests); the caller closes it.
	Redis redis.UniversalClient
	// Logger; default: the configuration's LOG_LEVEL and LOG_FORMAT on stderr.
	Logger *slog.Logger
	// Registry for the metrics; default a new one with Go and process collectors.
	Registry *prometheus.Registry
	// Senders replace the providers the configuration names, by channel.
	Senders map[tasks.Channel]sender.Sender
	// Listener serves /metrics, /healthz and /readyz instead of HTTP_ADDR.
	Listener net.Listener
	// OnDecision, OnPlanChange, TracerProvider, NoRedisChecks: as worker.Options.
	OnDecision     func(tasks.Notification, throttle.Decision)
	OnPlanChange   func(version int64)
	TracerProvider trace.TracerProvider
	NoRedisChecks  bool
}

// NewWorker builds the worker process: the shared services (Redis, the
// limiter, the key ring, the logger, the registry, the rules, consent,
// the queued-work caps), the senders the configuration names, and the
// worker on them. Run runs it (its parts: worker.Worker.Run) and closes
// everything when it returns.
func NewWorker(cfg worker.Config, o WorkerOptions) (*worker.Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	svc, err := services.Open(cfg.Base, services.Options{Redis: o.Redis, Logger: o.Logger, Registry: o.Registry,
		Limiter: throttle.Options{WaitReplicas: cfg.RedisWaitReplicas, WaitTimeout: cfg.RedisWaitTimeout, DoneLinger: cfg.DoneLinger}})
	if err != nil {
		return nil, err
	}
	var opened map[tasks.Channel][]sender.Named
	if o.Senders == nil {
		if opened, err = OpenSenders(cfg, svc.Log); err != nil {
			svc.Close()
			return nil, err
		}
	}
	w, err := worker.New(cfg, svc, worker.Options{Providers: opened, Senders: o.Senders, Listener: o.Listener, OnDecision: o.OnDecision,
		OnPlanChange: o.OnPlanChange, TracerProvider: o.TracerProvider, NoRedisChecks: o.NoRedisChecks})
	if err != nil {
		closeSenders(opened)
		svc.Close()
		return nil, err
	}
	return w, nil
}

// OpenSenders opens each channel's providers (SLUICE_*_PROVIDERS, or the
// one SLUICE_*_SENDER names), in the order they are tried, each with its
// settings read from its own variables (sender/providers lists them).
func OpenSenders(cfg worker.Config, log *slog.Logger) (map[tasks.Channel][]sender.Named, error) {
	out := map[tasks.Channel][]sender.Named{}
	for _, ch := range worker.Channels {
		specs, err := cfg.Providers(ch)
		if err != nil {
			closeSenders(out)
			return nil, err
		}
		for _, spec := range specs {
			prov, ok := sender.Lookup(providers.All, ch, spec.Kind)
			if !ok {
				closeSenders(out)
				return nil, fmt.Errorf("%w: no %s sender %q", config.ErrConfig, ch, spec.Kind)
			}
			st, err := prov.NewSettings(spec.Environ)
			if err == nil {
				var s sender.Sender
				if s, err = st.Open(sender.Env{Log: log.With("provider", spec.Name), Base: spec.Base}); err == nil {
					out[ch] = append(out[ch], sender.Named{Name: spec.Name, Sender: s})
					continue
				}
			}
			closeSenders(out)
			return nil, err
		}
	}
	return out, nil
}

func closeSenders(senders map[tasks.Channel][]sender.Named) {
	for _, list := range senders {
		for _, s := range list {
			if c, ok := s.Sender.(io.Closer); ok {
				_ = c.Close()
			}
		}
	}
}
