package main

import (
	"errors"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/worker"
)

func newAPICmd() *cobra.Command {
	return &cobra.Command{
		Use:   "api",
		Short: "Serve the HTTP ingest API (config from SLUICE_* environment variables)",
		Long: `Serve the HTTP ingest API until SIGINT or SIGTERM: POST /v1/notifications,
GET /v1/notifications/{id}, GET /v1/quotas, /openapi.yaml, /metrics, /healthz
and /readyz on SLUICE_API_ADDR. Clients authenticate with tenant tokens
(sluice tenant token create TENANT) or SLUICE_API_ADMIN_TOKEN. It reads Redis,
the queue, the rules and the keys from the same variables as the workers.`,
		Args: argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := worker.UnknownVariables(nil, knownVariables()); err != nil {
				return err
			}
			wcfg, werr := worker.LoadConfig()
			cfg, aerr := api.ParseConfig(nil)
			if err := errors.Join(werr, aerr); err != nil {
				return err
			}
			log := worker.NewLogger(cmd.ErrOrStderr(), wcfg)
			args := []any{}
			for _, kv := range append(wcfg.Redacted(), cfg.Redacted()...) {
				k, v, _ := strings.Cut(kv, "=")
				args = append(args, k, v)
			}
			log.Info("effective configuration", args...)
			s, err := api.New(cfg, wcfg, api.Options{Logger: log})
			if err != nil {
				return err
			}
			return s.Run(cmd.Context())
		},
	}
}
