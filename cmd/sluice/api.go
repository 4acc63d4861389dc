package main

import (
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/config"
)

func newAPICmd() *cobra.Command {
	return &cobra.Command{
		Use:   "api",
		Short: "Serve the HTTP ingest API (config from SLUICE_* environment variables)",
		Long: `Serve the HTTP ingest API until SIGINT or SIGTERM: POST /v1/notifications,
GET /v1/notifications/{id}, GET /v1/quotas, /openapi.yaml, /metrics, /healthz
and /readyz on SLUICE_API_ADDR, the dashboard at /ui, and the SMS provider's
status callbacks. Clients authenticate with tenant tokens (sluice tenant
token create TENANT) or SLUICE_API_ADMIN_TOKEN. It reads Redis, the queue,
the rules and the keys from the same variables as the workers.

Tracing (OpenTelemetry) is off unless OTEL_TRACES_EXPORTER is otlp or
console; a request's W3C traceparent is continued into the tasks it enqueues.`,
		Args: argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := config.UnknownVariables(nil, knownVariables()); err != nil {
				return err
			}
			cfg, err := api.ReadConfig(nil) // app.NewAPI validates it
			if err != nil {
				return err
			}
			log := cfg.NewLogger(cmd.ErrOrStderr())
			return runProcess(cmd.Context(), log, "sluice-api", cfg.Redacted(), func() (process, error) {
				return app.NewAPI(cfg, nil, app.APIOptions{Logger: log})
			})
		},
	}
}
