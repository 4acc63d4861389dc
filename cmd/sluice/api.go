package main

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/apiserver"
	"github.com/sluicehq/sluice/internal/telemetry"
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
			cfg, err := api.ParseConfig(nil)
			if err != nil {
				return err
			}
			log := cfg.NewLogger(cmd.ErrOrStderr())
			args := []any{}
			for _, kv := range cfg.Redacted() {
				k, v, _ := strings.Cut(kv, "=")
				args = append(args, k, v)
			}
			log.Info("effective configuration", args...)
			shutdown, err := telemetry.Setup(cmd.Context(), telemetry.Options{ServiceName: "sluice-api", Logger: log})
			if err != nil {
				return err
			}
			defer flushTraces(shutdown, log)
			s, err := apiserver.New(cfg, nil, api.Options{Logger: log})
			if err != nil {
				return err
			}
			return s.Run(cmd.Context())
		},
	}
}
