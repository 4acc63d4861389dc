// Package apiserver assembles the API process: the ingest API of package
// api with the routes other packages own mounted on it — the SMS status
// callbacks of sender/twilio. It is what `sluice api` runs, and what tests
// outside cmd/sluice (deploy's metrics check) start, so both serve the same
// routes and metrics. api itself imports no sender.
package apiserver

import (
	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/sender/twilio"
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
	return s, nil
}
