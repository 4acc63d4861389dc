package telnyx

import (
	"context"
	"net/http"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/consent/inbound"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/webhook"
)

// Mounter is where Mount puts the routes: `sluice api`'s server.
type Mounter interface {
	Mount(pattern string, h http.Handler)
}

// Mount reads the provider's settings from environ (nil: the process
// environment), validates what the API reads of them, and mounts
// CallbackRoute and InboundRoute on m over deps. Without
// SLUICE_TELNYX_PUBLIC_KEY the routes answer 404 saying so.
func Mount(m Mounter, environ map[string]string, base config.Base, deps *config.Deps) error {
	st, err := Provider.NewSettings(environ)
	if err != nil {
		return err
	}
	s := *st.(*Settings)
	var p config.Problems
	s.ValidateShared(&p)
	if err := p.Err(); err != nil {
		return err
	}
	h, err := newWebhooks(s, base, deps)
	if err != nil {
		return err
	}
	m.Mount(CallbackRoute, http.HandlerFunc(h.Callback))
	m.Mount(InboundRoute, http.HandlerFunc(h.Inbound))
	return nil
}

func newWebhooks(s Settings, base config.Base, deps *config.Deps) (*Webhooks, error) {
	codes, _ := s.codes() // validated
	h := &Webhooks{ttl: base.DedupeTTL, suppressFor: base.SMSSuppressTTL, codes: codes,
		delivery: delivery.NewStore(deps.Redis, deps.Limiter), consent: deps.Consent, lim: deps.Limiter,
		guard: webhook.NewGuard(deps.Redis), log: deps.Log.With("component", "telnyx"), now: time.Now,
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_telnyx_webhooks_total",
			Help: "Telnyx webhooks by route (callback, inbound) and outcome: recorded, ignored, duplicate, unsigned, forged, stale, malformed, or the inbound message's intent.",
		}, []string{"route", "outcome"})}
	if s.PublicKey != "" {
		h.key, _ = ParsePublicKey(s.PublicKey) // validated
	}
	if err := deps.Registry.Register(h.events); err != nil {
		return nil, err
	}
	client := asynq.NewClientFromRedisClient(deps.Redis)
	layout := base.Layout()
	enqueue := func(ctx context.Context, n tasks.Notification) error {
		_, err := tasks.Enqueue(ctx, client, deps.Keys, n, asynq.Queue(deps.Plans.Policy().Queue(layout, n)))
		return err
	}
	h.inbound = inbound.New(deps.Consent, deps.Plans.Policy, enqueue, deps.Log.With("component", "inbound"))
	return h, nil
}
