package app

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/dashboard"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/sender/inbound"
	"github.com/sluicehq/sluice/sender/telnyx"
	"github.com/sluicehq/sluice/sender/twilio"
	"github.com/sluicehq/sluice/sender/whatsapp"
	"github.com/sluicehq/sluice/services"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/unsubscribe"
	"github.com/sluicehq/sluice/webhook"
	webhooks "github.com/sluicehq/sluice/webhook/providers"
)

// APIOptions are what NewAPI takes besides the configuration. All optional.
type APIOptions struct {
	// Redis replaces the client built from SLUICE_REDIS_URL (tests); the
	// caller closes it.
	Redis redis.UniversalClient
	// Logger; default: the configuration's LOG_LEVEL and LOG_FORMAT on stderr.
	Logger *slog.Logger
	// Registry for the metrics; default a new one with Go and process collectors.
	Registry *prometheus.Registry
	// Listener serves the API instead of API_ADDR.
	Listener net.Listener
	// TracerProvider: as api.Options.
	TracerProvider trace.TracerProvider
}

// NewAPI builds the API process: the shared services, the ingest API, and
// the routes other packages own mounted beside it — the SMS providers'
// status callbacks and incoming messages (sender/twilio, sender/telnyx,
// sender/inbound), the email providers' bounce and complaint webhooks
// (webhook/...), the one-click unsubscribe links (/u/) and the dashboard
// (/ui). environ
// is where the mounted packages read their own settings (nil: the process
// environment), as api.ParseConfig read cfg. Run runs it and closes
// everything when it returns; Close, when it will not run.
func NewAPI(cfg api.Config, environ map[string]string, o APIOptions) (*api.Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	svc, err := services.Open(cfg.Base, services.Options{Redis: o.Redis, Logger: o.Logger, Registry: o.Registry})
	if err != nil {
		return nil, err
	}
	s, err := api.New(cfg, svc, api.Options{Listener: o.Listener, TracerProvider: o.TracerProvider})
	if err != nil {
		svc.Close()
		return nil, err
	}
	if err := mountAPIRoutes(s, cfg, environ, svc); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// mountAPIRoutes mounts the routes other packages own on s.
func mountAPIRoutes(s *api.Server, cfg api.Config, environ map[string]string, svc *services.Set) error {
	// The SMS provider's status callbacks and incoming messages (STOP, START, HELP).
	tw, err := twilio.CallbackSettings(environ)
	if err != nil {
		return err
	}
	store := delivery.NewStore(svc.Redis, svc.Limiter)
	cb, err := twilio.NewCallbacks(tw, cfg.Base, store, svc.Consent, svc.Limiter, svc.Log, svc.Registry)
	if err != nil {
		return err
	}
	insp := asynq.NewInspectorFromRedisClient(svc.Redis)
	cb.OnUndelivered = func(ctx context.Context, tenant, id string) {
		// An SMS that will not arrive: its fallback, if it has one, goes now.
		if err := store.RunFallback(ctx, insp, tenant, id); err == nil {
			svc.Log.Info("SMS undelivered: its fallback goes now", "tenant", tenant, "id", id)
		} else if !errors.Is(err, delivery.ErrNoFallback) {
			svc.Log.Warn("SMS undelivered: could not start its fallback; it goes at its After, if it has one", "tenant", tenant, "id", id, "err", err)
		}
	}
	s.Mount(twilio.CallbackRoute, cb)
	replies := inbound.New(svc.Consent, svc.Plans.Policy, enqueuer(svc, cfg.Base.Layout()), svc.Log.With("component", "inbound"))
	in, err := twilio.NewInbound(tw, replies, webhook.NewGuard(svc.Redis), svc.Log, svc.Registry)
	if err != nil {
		return err
	}
	s.Mount(twilio.InboundRoute, in)
	// The second SMS wire format's delivery reports and incoming messages (Telnyx).
	tx, err := telnyx.WebhookSettings(environ)
	if err != nil {
		return err
	}
	th, err := telnyx.NewWebhooks(tx, cfg.Base, telnyx.Deps{Redis: svc.Redis, Limiter: svc.Limiter, Consent: svc.Consent,
		Log: svc.Log, Registry: svc.Registry, Policy: svc.Plans.Policy, Enqueue: enqueuer(svc, cfg.Base.Layout())})
	if err != nil {
		return err
	}
	s.Mount(telnyx.CallbackRoute, http.HandlerFunc(th.Callback))
	s.Mount(telnyx.InboundRoute, http.HandlerFunc(th.Inbound))
	// WhatsApp's signed webhooks per tenant: inbound messages (the service
	// window, STOP, "Stop promotions") and the statuses of the messages sent.
	wa, err := whatsapp.NewWebhooks(whatsapp.Deps{Creds: webhook.NewStore(svc.Redis, svc.Keys), Guard: webhook.NewGuard(svc.Redis),
		Consent: svc.Consent, Inbound: replies, Delivery: store, Limiter: svc.Limiter, Log: svc.Log.With("component", "whatsapp"),
		Registry: svc.Registry, RecordTTL: cfg.DedupeTTL, OnFailed: cb.OnUndelivered})
	if err != nil {
		return err
	}
	s.Mount(whatsapp.VerifyRoute, http.HandlerFunc(wa.Verify))
	s.Mount(whatsapp.WebhookRoute, wa)
	// The email providers' signed bounce and complaint webhooks, per tenant.
	err = webhooks.Mount(s, webhook.Config{Consent: svc.Consent, Store: webhook.NewStore(svc.Redis, svc.Keys), Guard: webhook.NewGuard(svc.Redis),
		Log: svc.Log.With("component", "webhook"), UndeliverableFor: cfg.EmailSuppressTTL, ClientIP: webhook.HeaderIP(cfg.ClientIPHeader)}, svc.Registry)
	if err != nil {
		return err
	}
	// The one-click unsubscribe links of the emails the workers send.
	signer, err := unsubscribe.NewSigner(cfg.SubjectSecret)
	if err != nil {
		return err
	}
	unsubscribe.New(signer, svc.Consent, svc.Plans.Policy, svc.Log.With("component", "unsubscribe"), svc.Registry).Mount(s)
	// The dashboard.
	d, err := dashboard.New(dashboard.NewBackend(cfg.Base, svc, s.Auth(), s.Stopping, cfg.MaxConns))
	if err != nil {
		return err
	}
	d.Mount(s)
	return nil
}

// enqueuer enqueues a notification into the lane and shard the rules in
// force route it to (the replies of sender/inbound: a HELP answer).
func enqueuer(svc *services.Set, layout tasks.Layout) func(context.Context, tasks.Notification) error {
	client := asynq.NewClientFromRedisClient(svc.Redis)
	return func(ctx context.Context, n tasks.Notification) error {
		_, err := tasks.Enqueue(ctx, client, svc.Keys, n, asynq.Queue(svc.Plans.Policy().Queue(layout, n)))
		return err
	}
}
