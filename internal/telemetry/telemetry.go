// Package telemetry sets up OpenTelemetry tracing for the sluice commands
// from the standard OTEL_* environment variables. Tracing is off unless
// OTEL_TRACES_EXPORTER names an exporter:
//
//	OTEL_TRACES_EXPORTER          unset or none: off; otlp; console (or stdout);
//	                              a comma-separated list sends to each
//	OTEL_EXPORTER_OTLP_PROTOCOL   http/protobuf (default) or grpc; the
//	                              OTEL_EXPORTER_OTLP_TRACES_PROTOCOL wins
//	OTEL_EXPORTER_OTLP_ENDPOINT   and the exporters' other OTEL_EXPORTER_OTLP_*
//	                              variables (headers, TLS, timeout, compression)
//	OTEL_SERVICE_NAME             default: the command's name, e.g. sluice-worker
//	OTEL_RESOURCE_ATTRIBUTES      more resource attributes
//	OTEL_TRACES_SAMPLER[_ARG]     default parentbased_always_on
//	OTEL_BSP_*                    batching of exported spans
//	OTEL_SDK_DISABLED=true        off, whatever else is set
//
// Only this package and cmd/sluice import the SDK; the tasks and worker
// packages use the API alone.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// ErrConfig reports an OTEL_* variable with a value this build cannot honour.
var ErrConfig = errors.New("invalid OpenTelemetry configuration")

// Options say what the environment does not.
type Options struct {
	// ServiceName is service.name unless OTEL_SERVICE_NAME or
	// OTEL_RESOURCE_ATTRIBUTES set it. Default "sluice".
	ServiceName string
	// Logger gets OpenTelemetry's own errors (a failed export) and the
	// startup line. Default slog.Default().
	Logger *slog.Logger
	// Getenv reads OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER and the OTLP
	// protocol; default os.Getenv. (The exporters and the resource read the
	// rest of their variables from the process environment themselves.)
	Getenv func(string) string
	// Stdout is where the console exporter writes; default os.Stdout.
	Stdout io.Writer
}

// Exporters returns the names in OTEL_TRACES_EXPORTER that export (none
// and empty entries left out); nil when tracing is off.
func Exporters(getenv func(string) string) []string {
	if getenv == nil {
		getenv = os.Getenv
	}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return nil
	}
	var out []string
	for name := range strings.SplitSeq(getenv("OTEL_TRACES_EXPORTER"), ",") {
		name = strings.ToLower(strings.TrimSpace(name))
		if name != "" && name != "none" {
			out = append(out, name)
		}
	}
	return out
}

// NewTracerProvider returns the SDK tracer provider the environment asks
// for, batching spans to each exporter, or nil when tracing is off. The
// caller shuts it down (which flushes).
func NewTracerProvider(ctx context.Context, o Options) (*sdktrace.TracerProvider, error) {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.ServiceName == "" {
		o.ServiceName = "sluice"
	}
	names := Exporters(o.Getenv)
	if len(names) == 0 {
		return nil, nil
	}
	var opts []sdktrace.TracerProviderOption
	var exporters []sdktrace.SpanExporter
	for _, name := range names {
		exp, err := newExporter(ctx, name, o)
		if err != nil {
			for _, e := range exporters {
				_ = e.Shutdown(ctx)
			}
			return nil, err
		}
		exporters = append(exporters, exp)
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	// Later sources win: the command's name, then OTEL_RESOURCE_ATTRIBUTES
	// and OTEL_SERVICE_NAME.
	res, err := resource.New(ctx, resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", o.ServiceName)),
		resource.WithFromEnv())
	if err != nil {
		// A malformed OTEL_RESOURCE_ATTRIBUTES: keep what could be read.
		logger(o).Warn("opentelemetry: resource", "err", err)
	}
	opts = append(opts, sdktrace.WithResource(res))
	return sdktrace.NewTracerProvider(opts...), nil
}

func newExporter(ctx context.Context, name string, o Options) (sdktrace.SpanExporter, error) {
	switch name {
	case "otlp":
		proto := strings.TrimSpace(o.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
		if proto == "" {
			proto = strings.TrimSpace(o.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
		}
		switch proto {
		case "", "http/protobuf":
			exp, err := otlptracehttp.New(ctx)
			if err != nil {
				return nil, fmt.Errorf("opentelemetry: OTLP/HTTP exporter: %w", err)
			}
			return exp, nil
		case "grpc":
			exp, err := otlptracegrpc.New(ctx)
			if err != nil {
				return nil, fmt.Errorf("opentelemetry: OTLP/gRPC exporter: %w", err)
			}
			return exp, nil
		}
		return nil, fmt.Errorf("%w: OTEL_EXPORTER_OTLP_PROTOCOL (or _TRACES_PROTOCOL) is %q; this build speaks http/protobuf and grpc", ErrConfig, proto)
	case "console", "stdout":
		exp, err := stdouttrace.New(stdouttrace.WithWriter(o.Stdout))
		if err != nil {
			return nil, fmt.Errorf("opentelemetry: console exporter: %w", err)
		}
		return exp, nil
	}
	return nil, fmt.Errorf("%w: OTEL_TRACES_EXPORTER names %q; use none, otlp or console", ErrConfig, name)
}

// Setup installs the tracer provider the environment asks for as the
// global one, and W3C Trace Context plus Baggage as the global propagator
// (also when tracing is off, so a trace coming in still goes on into the
// tasks). The returned function flushes and stops the exporters; call it
// on exit. With tracing off it does nothing.
func Setup(ctx context.Context, o Options) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	tp, err := NewTracerProvider(ctx, o)
	if err != nil || tp == nil {
		return func(context.Context) error { return nil }, err
	}
	log := logger(o)
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		log.Warn("opentelemetry", "err", err)
	}))
	otel.SetTracerProvider(tp)
	log.Info("tracing on", "exporters", strings.Join(Exporters(o.Getenv), ","))
	return func(ctx context.Context) error {
		if err := tp.Shutdown(ctx); err != nil {
			return fmt.Errorf("opentelemetry: flush and stop the exporters: %w", err)
		}
		return nil
	}, nil
}

func logger(o Options) *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.Default()
}
