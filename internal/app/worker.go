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
	"github.com/sluicehq/sluice/internal/services"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/sender/providers"
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
	senders := o.Senders
	if senders == nil {
		if senders, err = OpenSenders(cfg, svc.Log); err != nil {
			svc.Close()
			return nil, err
		}
	}
	w, err := worker.New(cfg, svc, worker.Options{Senders: senders, Listener: o.Listener, OnDecision: o.OnDecision,
		OnPlanChange: o.OnPlanChange, TracerProvider: o.TracerProvider, NoRedisChecks: o.NoRedisChecks})
	if err != nil {
		if o.Senders == nil {
			closeSenders(senders)
		}
		svc.Close()
		return nil, err
	}
	return w, nil
}

// OpenSenders opens the provider each channel's SLUICE_*_SENDER names,
// with its settings read from cfg.Environ (sender/providers lists them).
func OpenSenders(cfg worker.Config, log *slog.Logger) (map[tasks.Channel]sender.Sender, error) {
	out := map[tasks.Channel]sender.Sender{}
	for ch, name := range map[tasks.Channel]string{tasks.Email: cfg.EmailSender, tasks.SMS: cfg.SMSSender} {
		prov, ok := sender.Lookup(providers.All, ch, name)
		if !ok {
			closeSenders(out)
			return nil, fmt.Errorf("%w: no %s sender %q", config.ErrConfig, ch, name)
		}
		st, err := prov.NewSettings(cfg.Environ)
		if err == nil {
			var s sender.Sender
			if s, err = st.Open(sender.Env{Log: log, Base: cfg.Base}); err == nil {
				out[ch] = s
				continue
			}
		}
		closeSenders(out)
		return nil, err
	}
	return out, nil
}

func closeSenders(senders map[tasks.Channel]sender.Sender) {
	for _, s := range senders {
		if c, ok := s.(io.Closer); ok {
			_ = c.Close()
		}
	}
}
