package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/testkit/apienv"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// A producer that is not Go sends a W3C traceparent with its request: the
// API's span continues that trace, the task carries the API span's
// context, and the worker's spans join the same trace.
func TestAPIContinuesTheClientsTrace(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=10/1m", map[string]string{"SLUICE_POLL_INTERVAL": "20ms"})
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())), sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	traced := b.another(t, app.APIOptions{TracerProvider: tp})

	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	var a api.Accepted
	r := traced.Do(t, "POST", "/v1/notifications", b.Tokens["acme"], apienv.NewSMS("+14155550100", "traced"),
		"traceparent", "00-"+traceID+"-"+parentID+"-01")
	r.JSON(t, &a)
	var server tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.SpanKind == trace.SpanKindServer && s.Name == "POST /v1/notifications" {
			server = s
		}
	}
	if server.Name == "" {
		t.Fatalf("no server span for the request; spans: %v", exp.GetSpans())
	}
	if server.SpanContext.TraceID().String() != traceID || server.Parent.SpanID().String() != parentID || !server.Parent.IsRemote() {
		t.Fatalf("the API's span is trace %s, parent %s (remote %v); want the client's trace %s, parent %s",
			server.SpanContext.TraceID(), server.Parent.SpanID(), server.Parent.IsRemote(), traceID, parentID)
	}
	ti, err := b.Task(t, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := "00-" + traceID + "-" + server.SpanContext.SpanID().String() + "-01"
	if got := ti.Headers["traceparent"]; got != want {
		t.Fatalf("the task's traceparent is %q, want %q (the API span's context)", got, want)
	}
	// The worker continues it.
	b.RunWorker(t, app.WorkerOptions{TracerProvider: tp})
	b.SMS.WaitCount(t, 1, 10*time.Second)
	sluicetest.Eventually(t, 5*time.Second, "a worker span in the client's trace", func() bool {
		for _, s := range exp.GetSpans() {
			if s.SpanKind != trace.SpanKindServer || !strings.HasPrefix(s.Name, "POST ") {
				if s.SpanContext.TraceID().String() == traceID && s.Parent.SpanID() == server.SpanContext.SpanID() {
					return true
				}
			}
		}
		return false
	})
}
