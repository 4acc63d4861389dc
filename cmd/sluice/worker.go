package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/telemetry"
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
			args := []any{}
			for _, kv := range cfg.Redacted() {
				k, v, _ := strings.Cut(kv, "=")
				args = append(args, k, v)
			}
			log.Info("effective configuration", args...)
			shutdown, err := telemetry.Setup(cmd.Context(), telemetry.Options{ServiceName: "sluice-worker", Logger: log})
			if err != nil {
				return err
			}
			defer flushTraces(shutdown, log)
			w, err := worker.New(cfg, worker.Options{Logger: log})
			if err != nil {
				return err
			}
			return w.Run(cmd.Context())
		},
	}
}

// flushTraces sends the spans still buffered and stops the exporters, for
// at most 5 seconds (the run's context is already cancelled by then).
func flushTraces(shutdown func(context.Context) error, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		log.Warn("tracing: spans may be lost", "err", err)
	}
}

// knownVariables are the SLUICE_* names any sluice command reads.
func knownVariables() []string { return append(worker.KnownVariables(), api.KnownVariables()...) }

// warnUnknownVariables prints, for the tools, what the services refuse to start with.
func warnUnknownVariables(cmd *cobra.Command) {
	if err := config.UnknownVariables(nil, knownVariables()); err != nil {
		fmt.Fprintln(cmd.ErrOrStderr(), "sluice: warning:", err)
	}
}
