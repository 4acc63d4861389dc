package tasks

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
)

// Trace context headers: a task carries its producer's span context in its
// Asynq headers, in W3C Trace Context form, so the worker's spans continue
// the producer's trace.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// traceContext is always used, whatever the process configured: a producer
// that never touched OpenTelemetry's globals still hands its span context on.
var traceContext = propagation.TraceContext{}

// Propagator is W3C Trace Context plus whatever the process installed with
// otel.SetTextMapPropagator (e.g. baggage). Trace Context comes last, so on
// extraction its traceparent wins. The API extracts a request's trace with
// it, the way the worker extracts a task's.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(otel.GetTextMapPropagator(), traceContext)
}

// InjectTrace writes the span context of ctx (and what the global
// propagator carries) into task headers. Without a span in ctx it writes
// nothing. NewTaskContext and Enqueue call it; use it for tasks built
// another way.
func InjectTrace(ctx context.Context, headers map[string]string) {
	Propagator().Inject(ctx, propagation.MapCarrier(headers))
}

// ExtractTrace returns ctx carrying the remote span context found in task
// headers (written by InjectTrace), or ctx unchanged when there is none.
func ExtractTrace(ctx context.Context, headers map[string]string) context.Context {
	if len(headers) == 0 {
		return ctx
	}
	return Propagator().Extract(ctx, propagation.MapCarrier(headers))
}
