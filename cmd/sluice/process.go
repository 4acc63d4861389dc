package main

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/telemetry"
)

// process is a Sluice process (app builds them): it runs until
// its context ends.
type process interface {
	Run(ctx context.Context) error
}

// runProcess is what `sluice worker` and `sluice api` do around their process:
// log the effective configuration (redacted: KEY=value pairs, secrets
// masked), set up tracing as the OTEL_* variables ask (telemetry: off
// unless OTEL_TRACES_EXPORTER names an exporter), build the process, run
// it until ctx ends, and flush the spans still buffered.
func runProcess(ctx context.Context, log *slog.Logger, service string, redacted []string, build func() (process, error)) error {
	args := make([]any, 0, 2*len(redacted))
	for _, kv := range redacted {
		k, v, _ := strings.Cut(kv, "=")
		args = append(args, k, v)
	}
	log.Info("effective configuration", args...)
	shutdown, err := telemetry.Setup(ctx, telemetry.Options{ServiceName: service, Logger: log})
	if err != nil {
		return err
	}
	defer flushTraces(shutdown, log)
	p, err := build()
	if err != nil {
		return err
	}
	return p.Run(ctx)
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
