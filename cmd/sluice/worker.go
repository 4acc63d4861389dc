package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/worker"
)

func newWorkerCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "worker",
		Short: "Run the throttled worker (config from SLUICE_* environment variables)",
		Long: `Run the throttled worker until SIGINT or SIGTERM. On shutdown in-flight sends
get SLUICE_SHUTDOWN_TIMEOUT to finish; unfinished tasks go back to the queue.
The effective configuration (secrets masked) and the quota rules are logged
at start.

Tracing (OpenTelemetry) is off unless OTEL_TRACES_EXPORTER is otlp or
console; the standard OTEL_* variables configure it (docs/operations.md, "Tracing").`,
		Args: argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := config.UnknownVariables(nil, knownVariables()); err != nil {
				return err
			}
			cfg, err := worker.LoadConfig()
			if err != nil {
				return err
			}
			log := cfg.NewLogger(cmd.ErrOrStderr())
			return runProcess(cmd.Context(), log, "sluice-worker", cfg.Redacted(), func() (process, error) {
				return app.NewWorker(cfg, app.WorkerOptions{Logger: log})
			})
		},
	}
}

// knownVariables are the SLUICE_* names any sluice command reads.
func knownVariables() []string {
	return append(append(worker.KnownVariables(), api.KnownVariables()...), worker.ProviderVariables(nil)...)
}

// warnUnknownVariables prints, for the tools, what the services refuse to start with.
func warnUnknownVariables(cmd *cobra.Command) {
	if err := config.UnknownVariables(nil, knownVariables()); err != nil {
		fmt.Fprintln(cmd.ErrOrStderr(), "sluice: warning:", err)
	}
}
