package tasks_test

import (
	"context"
	"testing"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
)

// Enqueue hands the caller's span context to the task as a W3C traceparent
// (and tracestate) header, which ExtractTrace reads back as a remote parent;
// without a span, or through NewTask, no trace header is written.
func TestEnqueueCarriesTraceContext(t *testing.T) {
	t.Parallel()
	_, rdb := redistest.New(t)
	c := asynq.NewClientFromRedisClient(rdb)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	ts, err := trace.ParseTraceState("vendor=abc")
	if err != nil {
		t.Fatal(err)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
		TraceState: ts,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)

	n := tasks.NewSMS("acme", "+14155550100", "hi")
	if _, err := tasks.Enqueue(ctx, c, nil, n); err != nil {
		t.Fatal(err)
	}
	ti, err := insp.GetTaskInfo(tasks.DefaultLayout.Route("acme", tasks.LaneStandard, nil), n.ID)
	if err != nil {
		t.Fatal(err)
	}
	const want = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if got := ti.Headers[tasks.HeaderTraceParent]; got != want {
		t.Fatalf("traceparent = %q, want %q (headers %v)", got, want, ti.Headers)
	}
	if got := ti.Headers[tasks.HeaderTraceState]; got != "vendor=abc" {
		t.Fatalf("tracestate = %q", got)
	}
	if ti.Headers[tasks.HeaderRetryBudget] == "" {
		t.Fatalf("the retry budget header is gone: %v", ti.Headers)
	}
	got := trace.SpanContextFromContext(tasks.ExtractTrace(context.Background(), ti.Headers))
	if !got.IsRemote() || got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() || !got.IsSampled() || got.TraceState().String() != "vendor=abc" {
		t.Fatalf("extracted %+v, want the producer's span context as a remote parent", got)
	}

	// No span in ctx: no trace headers, and nothing to extract.
	plain := tasks.NewSMS("acme", "+14155550100", "hi")
	if _, err := tasks.Enqueue(context.Background(), c, nil, plain); err != nil {
		t.Fatal(err)
	}
	ti, err = insp.GetTaskInfo(tasks.DefaultLayout.Route("acme", tasks.LaneStandard, nil), plain.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ti.Headers[tasks.HeaderTraceParent]; ok {
		t.Fatalf("traceparent without a span: %v", ti.Headers)
	}
	if sc := trace.SpanContextFromContext(tasks.ExtractTrace(context.Background(), ti.Headers)); sc.IsValid() {
		t.Fatalf("extracted %+v from headers without a trace", sc)
	}

	// NewTask has no context; NewTaskContext has.
	task, err := tasks.NewTask(tasks.NewSMS("acme", "+14155550100", "hi"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := task.Headers()[tasks.HeaderTraceParent]; ok {
		t.Fatalf("NewTask wrote a traceparent: %v", task.Headers())
	}
	task, err = tasks.NewTaskContext(ctx, tasks.NewSMS("acme", "+14155550100", "hi"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := task.Headers()[tasks.HeaderTraceParent]; got != want {
		t.Fatalf("NewTaskContext traceparent = %q", got)
	}
}
