package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/worker"
)

func newWorkerCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "worker",
		Short: "Run the throttled worker (config from SLUICE_* environment variables)",
		Long: `Run the throttled worker until SIGINT or SIGTERM. On shutdown in-flight sends
get SLUICE_SHUTDOWN_TIMEOUT to finish; unfinished tasks go back to the queue.
The effective configuration (secrets masked) and the quota rules are logged
at start.`,
		Args: argsError(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := worker.UnknownVariables(nil, knownVariables()); err != nil {
				return err
			}
			cfg, err := worker.LoadConfig()
			if err != nil {
				return err
			}
			log := worker.NewLogger(cmd.ErrOrStderr(), cfg)
			args := []any{}
			for _, kv := range cfg.Redacted() {
				k, v, _ := strings.Cut(kv, "=")
				args = append(args, k, v)
			}
			log.Info("effective configuration", args...)
			w, err := worker.New(cfg, worker.Options{Logger: log})
			if err != nil {
				return err
			}
			return w.Run(cmd.Context())
		},
	}
}

// knownVariables are the SLUICE_* names any sluice command reads.
func knownVariables() []string { return append(worker.KnownVariables(), api.KnownVariables()...) }

// warnUnknownVariables prints, for the tools, what the services refuse to start with.
func warnUnknownVariables(cmd *cobra.Command) {
	if err := worker.UnknownVariables(nil, knownVariables()); err != nil {
		fmt.Fprintln(cmd.ErrOrStderr(), "sluice: warning:", err)
	}
}
