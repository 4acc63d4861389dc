package telnyx

import (
	"context"
	"crypto/ed25519"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/sender/inbound"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/webhook"
)

// Deps are what the webhook routes work with, from the API process
// (app builds them).
type Deps struct {
	Redis    redis.UniversalClient
	Limiter  *throttle.Limiter
	Consent  *consent.Store
	Log      *slog.Logger
	Registry prometheus.Registerer
	// Policy is the rules in force; Enqueue enqueues a reply (a HELP
	// answer) into the lane and shard they route it to.
	Policy  func() plans.Policy
	Enqueue func(context.Context, tasks.Notification) error
}

// WebhookSettings reads the provider's settings from environ (nil: the
// process environment) and validates what the API reads of them.
func WebhookSettings(environ map[string]string) (Settings, error) {
	return sender.ReadShared[Settings](Provider, environ)
}

// NewWebhooks builds the handlers of CallbackRoute (h.Callback) and
// InboundRoute (h.Inbound). Without SLUICE_TELNYX_PUBLIC_KEY they answer
// 404 saying so.
func NewWebhooks(s Settings, base config.Base, d Deps) (*Webhooks, error) {
	codes := s.SuppressCodes
	h := &Webhooks{ttl: base.DedupeTTL, suppressFor: base.SMSSuppressTTL, codes: codes,
		delivery: delivery.NewStore(d.Redis, d.Limiter), consent: d.Consent, lim: d.Limiter,
		guard: webhook.NewGuard(d.Redis), log: d.Log.With("component", "telnyx"), now: time.Now, notOwnedLog: webhook.NewLogEvery(10 * time.Second),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_telnyx_webhooks_total",
			Help: "Telnyx webhooks by route (callback, inbound) and outcome: recorded, ignored, duplicate, unsigned, forged, stale, malformed, not_owned (authentic, but not the tenant's: another number than the notification's, or an inbound message to a number or profile the tenant does not own), or the inbound message's intent.",
		}, []string{"route", "outcome"})}
	if len(s.PublicKey) != 0 {
		h.key = ed25519.PublicKey(s.PublicKey)
	}
	if err := d.Registry.Register(h.events); err != nil {
		return nil, err
	}
	h.inbound = inbound.New(d.Consent, d.Policy, d.Enqueue, d.Log.With("component", "inbound"))
	return h, nil
}
