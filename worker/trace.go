package worker

import (
	"context"
	"errors"
	"time"

	"github.com/hibiken/asynq"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// TracerName is the instrumentation scope of the worker's spans.
const TracerName = "github.com/sluicehq/sluice/worker"

// The worker's spans. One run of a task is a SpanTask (kind consumer, its
// parent the producer's span from the task's traceparent header) with a
// SpanQuotaCheck child and, when it sends, a SpanSend child. A task that is
// rescheduled runs again under the same parent: every run of a
// notification is in the producer's trace.
const (
	SpanTask       = "sluice.task"
	SpanQuotaCheck = "sluice.quota_check"
	SpanSend       = "sluice.send"
)

// Span attributes. None holds personal data: no recipient, sender, subject,
// body or metadata; errors are recorded after redaction (see redact).
const (
	AttrChannel   = attribute.Key("sluice.channel")
	AttrCategory  = attribute.Key("sluice.category")
	AttrTenant    = attribute.Key("sluice.tenant")
	AttrID        = attribute.Key("sluice.notification.id")
	AttrRetried   = attribute.Key("sluice.task.retried") // Asynq's count of failed runs before this one
	AttrOutcome   = attribute.Key("sluice.outcome")      // how the run ended, see taskOutcome / sendOutcome
	AttrDecision  = attribute.Key("sluice.decision")     // the limiter's status; admitted_later: admitted for a slot ahead
	AttrWaitFor   = attribute.Key("sluice.wait_for")     // the rule, or "quiet hours", that set a slot later than now
	AttrWaitMS    = attribute.Key("sluice.wait_ms")      // how far ahead the slot was, in ms
	AttrSlot      = attribute.Key("sluice.slot")         // the slot (RFC 3339, UTC, Redis clock)
	AttrBooked    = attribute.Key("sluice.booked")       // the limiter holds the slot for the task
	AttrAttempt   = attribute.Key("sluice.attempt")      // the limiter's admission number for the id (1; more after an unknown outcome)
	AttrRemaining = attribute.Key("sluice.remaining")    // fewest further sends any rule takes around the slot
	AttrRules     = attribute.Key("sluice.rules")        // how many rules were checked
	AttrWakeAt    = attribute.Key("sluice.wake_at")      // when Asynq runs a rescheduled task again (RFC 3339, UTC)
	AttrNotSent   = attribute.Key("sluice.not_sent")     // a failed send that certainly did not reach the provider
)

// traceNotification names the decoded notification on the task's span.
func traceNotification(ctx context.Context, n tasks.Notification) {
	trace.SpanFromContext(ctx).SetAttributes(AttrID.String(n.ID), AttrTenant.String(n.Tenant),
		AttrChannel.String(string(n.Channel)), AttrCategory.String(n.CategoryOrDefault()))
}

// endCheck ends the quota check's span with the decision (or the error);
// why is what set a slot later than now (waitReason).
func endCheck(span trace.Span, d throttle.Decision, why string, err error) {
	defer span.End()
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return
	}
	span.SetAttributes(AttrDecision.String(decisionLabel(d)), AttrAttempt.Int(d.Attempt),
		AttrBooked.Bool(d.Booked), AttrRemaining.Int(d.Remaining), AttrWaitMS.Int64(d.Wait.Milliseconds()))
	if !d.At.IsZero() {
		span.SetAttributes(AttrSlot.String(d.At.UTC().Format(time.RFC3339Nano)))
	}
	if why != "" {
		span.SetAttributes(AttrWaitFor.String(why))
	}
}

// endSend ends the send's span; err is send's result, already redacted.
func endSend(span trace.Span, err error) {
	defer span.End()
	if err == nil {
		span.SetAttributes(AttrOutcome.String("sent"))
		return
	}
	var se *sender.SendError
	outcome := "transient"
	if errors.As(err, &se) {
		if se.Permanent {
			outcome = "permanent"
		}
		span.SetAttributes(AttrNotSent.Bool(se.NotSent))
	}
	span.SetAttributes(AttrOutcome.String(outcome))
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// taskOutcome names how a run ended, for the task's span.
func taskOutcome(err error) string {
	var te *ThrottledError
	var ue *UnavailableError
	switch {
	case err == nil:
		return "done"
	case errors.As(err, &te), errors.Is(err, asynq.RevokeTask):
		return "rescheduled"
	case errors.As(err, &ue):
		return "unavailable"
	case errors.Is(err, asynq.SkipRetry):
		return "archived"
	}
	return "retry"
}

// startSend starts the send's span: the provider call and its record.
func (co *core) startSend(ctx context.Context, n tasks.Notification, d throttle.Decision) (context.Context, trace.Span) {
	return co.tracer.Start(ctx, SpanSend, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(AttrChannel.String(string(n.Channel)), AttrAttempt.Int(d.Attempt), AttrWaitMS.Int64(d.Wait.Milliseconds())))
}

// startCheck starts the quota check's span.
func (co *core) startCheck(ctx context.Context, limits []throttle.Limit) (context.Context, trace.Span) {
	return co.tracer.Start(ctx, SpanQuotaCheck, trace.WithAttributes(AttrRules.Int(len(limits))))
}

// traceMiddleware starts the task's span, as a child of the producer's span
// carried in the task headers, and ends it with the run's outcome.
func (co *core) traceMiddleware(next asynq.Handler) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		taskID, _ := asynq.GetTaskID(ctx)
		queue, _ := asynq.GetQueueName(ctx)
		retried, _ := asynq.GetRetryCount(ctx)
		ctx, span := co.tracer.Start(tasks.ExtractTrace(ctx, t.Headers()), SpanTask,
			trace.WithSpanKind(trace.SpanKindConsumer),
			trace.WithAttributes(
				attribute.String("messaging.system", "asynq"),
				attribute.String("messaging.operation.type", "process"),
				attribute.String("messaging.destination.name", queue),
				attribute.String("messaging.message.id", taskID),
				AttrChannel.String(channelLabel(t.Type())),
				AttrRetried.Int(retried),
			))
		defer span.End()
		err := next.ProcessTask(ctx, t)
		span.SetAttributes(AttrOutcome.String(taskOutcome(err)))
		var te *ThrottledError
		if errors.As(err, &te) {
			span.SetAttributes(AttrWaitFor.String(te.Rule), AttrWakeAt.String(te.WakeAt.UTC().Format(time.RFC3339Nano)))
		}
		if err != nil && isFailure(err) && !errors.Is(err, asynq.RevokeTask) {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		return err
	})
}
