// Package providers lists the email providers whose webhooks Sluice takes
// and mounts their routes on `sluice api`. A new provider is a package
// under webhook/ and one line in All.
package providers

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/webhook"
	"github.com/sluicehq/sluice/webhook/mailgun"
	"github.com/sluicehq/sluice/webhook/postmark"
	"github.com/sluicehq/sluice/webhook/sendgrid"
	"github.com/sluicehq/sluice/webhook/ses"
)

// All returns the providers, each new (SES's keeps a certificate cache).
func All() []webhook.Provider {
	return []webhook.Provider{ses.New(), sendgrid.Provider{}, postmark.Provider{}, mailgun.Provider{}}
}

// Mounter is where Mount puts the routes: `sluice api`'s server.
type Mounter interface {
	Mount(pattern string, h http.Handler)
}

// Mount mounts POST /v1/webhooks/NAME/{tenant} for every provider on m,
// over cfg (the consent store, the credential store, the replay guard, the
// client address reader), counting in reg.
func Mount(m Mounter, cfg webhook.Config, reg prometheus.Registerer) error {
	metrics, err := webhook.NewMetrics(reg)
	if err != nil {
		return err
	}
	for _, p := range All() {
		m.Mount(webhook.Route(p), webhook.NewHandler(p, cfg, metrics))
	}
	return nil
}
