// Package apiserver assembles the API process: the ingest API of package
// api with the routes other packages own mounted on it — the SMS status
// callbacks of sender/twilio, the one-click unsubscribe links of package
// unsubscribe at /u/, and the dashboard at /ui. It is what `sluice
// api` runs, and what tests outside cmd/sluice (the dashboard's, deploy's
// metrics check) start, so both serve the same routes and metrics. api
// itself imports no sender and not the dashboard.
package apiserver

import (
	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/dashboard"
	"github.com/sluicehq/sluice/sender/telnyx"
	"github.com/sluicehq/sluice/sender/twilio"
	"github.com/sluicehq/sluice/unsubscribe"
	webhooks "github.com/sluicehq/sluice/webhook/providers"
)

// New returns the API server of cfg with every mounted route. environ is
// where the mounted packages read their own settings (nil: the process
// environment), as api.ParseConfig read cfg.
func New(cfg api.Config, environ map[string]string, opts api.Options) (*api.Server, error) {
	s, err := api.New(cfg, opts)
	if err != nil {
		return nil, err
	}
	if err := twilio.Mount(s, environ, cfg.Base, s.Deps()); err != nil {
		s.Close()
		return nil, err
	}
	if err := telnyx.Mount(s, environ, cfg.Base, s.Deps()); err != nil {
		s.Close()
		return nil, err
	}
	if err := webhooks.Mount(s, s.Deps(), cfg.Base, cfg.ClientIPHeader); err != nil {
		s.Close()
		return nil, err
	}
	signer, err := unsubscribe.NewSigner(cfg.SubjectSecret)
	if err != nil {
		s.Close()
		return nil, err
	}
	deps := s.Deps()
	unsubscribe.New(signer, deps.Consent, deps.Plans.Policy, deps.Log.With("component", "unsubscribe"), deps.Registry).Mount(s)
	d, err := dashboard.New(dashboard.NewBackend(cfg.Base, s.Deps(), s.Auth(), s.Stopping))
	if err != nil {
		s.Close()
		return nil, err
	}
	d.Mount(s)
	return s, nil
}
