package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/testkit/sluicetest"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/sender/twilio"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/worker"
)

// traces records every span of a test's own tracer provider in memory.
type traces struct {
	tp    *sdktrace.TracerProvider
	exp   *tracetest.InMemoryExporter
	ended chan struct{}
}

func newTraces(t *testing.T) *traces {
	t.Helper()
	tr := &traces{exp: tracetest.NewInMemoryExporter(), ended: make(chan struct{}, 1)}
	// The syncer exports a span as it ends; the signal runs after it.
	tr.tp = sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
		sdktrace.WithSyncer(tr.exp),
		sdktrace.WithSpanProcessor(endSignal(tr.ended)))
	t.Cleanup(func() { _ = tr.tp.Shutdown(context.Background()) })
	return tr
}

// wait blocks until cond holds for the ended spans, or fails the test.
func (tr *traces) wait(t *testing.T, timeout time.Duration, what string, cond func(tracetest.SpanStubs) bool) tracetest.SpanStubs {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		spans := tr.exp.GetSpans()
		if cond(spans) {
			return spans
		}
		select {
		case <-tr.ended:
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s; spans:\n%s", timeout, what, dump(spans))
		}
	}
}

// endSignal is a span processor that wakes a waiter whenever a span ends.
type endSignal chan struct{}

func (e endSignal) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (e endSignal) OnEnd(sdktrace.ReadOnlySpan) {
	select {
	case e <- struct{}{}:
	default:
	}
}
func (e endSignal) Shutdown(context.Context) error   { return nil }
func (e endSignal) ForceFlush(context.Context) error { return nil }

func attr(s tracetest.SpanStub, k attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes {
		if kv.Key == k {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func attrString(s tracetest.SpanStub, k attribute.Key) string {
	v, _ := attr(s, k)
	return v.Emit()
}

// named returns the spans called name, optionally only those whose
// attribute key has value val.
func named(spans tracetest.SpanStubs, name string, key attribute.Key, val string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range spans {
		if s.Name == name && (key == "" || attrString(s, key) == val) {
			out = append(out, s)
		}
	}
	return out
}

// childrenOf returns the spans whose parent is p, by name.
func childrenOf(spans tracetest.SpanStubs, p tracetest.SpanStub) map[string]tracetest.SpanStubs {
	out := map[string]tracetest.SpanStubs{}
	for _, s := range spans {
		if s.Parent.SpanID() == p.SpanContext.SpanID() && s.SpanContext.TraceID() == p.SpanContext.TraceID() {
			out[s.Name] = append(out[s.Name], s)
		}
	}
	return out
}

func dump(spans tracetest.SpanStubs) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s trace=%s span=%s parent=%s status=%v %v\n", s.Name, s.SpanContext.TraceID(), s.SpanContext.SpanID(), s.Parent.SpanID(), s.Status, s.Attributes)
	}
	return b.String()
}

// noPII fails the test if any span name, attribute, event, status or link
// holds one of the needles.
func noPII(t *testing.T, spans tracetest.SpanStubs, needles ...string) {
	t.Helper()
	for _, s := range spans {
		texts := []string{s.Name, s.Status.Description}
		for _, kv := range s.Attributes {
			texts = append(texts, string(kv.Key)+"="+kv.Value.Emit())
		}
		for _, ev := range s.Events {
			texts = append(texts, ev.Name)
			for _, kv := range ev.Attributes {
				texts = append(texts, string(kv.Key)+"="+kv.Value.Emit())
			}
		}
		for _, l := range s.Links {
			for _, kv := range l.Attributes {
				texts = append(texts, string(kv.Key)+"="+kv.Value.Emit())
			}
		}
		for _, text := range texts {
			for _, n := range needles {
				if strings.Contains(text, n) {
					t.Errorf("span %s holds personal data %q: %s", s.Name, n, text)
				}
			}
		}
	}
}

// leakySender fails every email permanently with an error quoting the
// recipient, subject and body, as some providers do.
type leakySender struct{}

func (leakySender) Send(_ context.Context, n tasks.Notification) error {
	return &sender.SendError{Err: fmt.Errorf("provider rejected %s (subject %q): %s", n.To, n.Subject, n.Body), Permanent: true, NotSent: true}
}

// A producer's span → tasks.Enqueue → a real worker: each task's span is a
// child of the producer's span (through the traceparent header, not the Go
// context), the quota check and the send are its children, they carry the
// channel, category, tenant, decision and outcome, a failed send is recorded
// as an error, and no span holds a recipient, subject or body.
func TestTraceFollowsTheNotification(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=5/1m,email:recipient=5/1m")
	// Slack wide enough that a reply slowed by a starved machine is not a
	// late wake-up, whose second check would be a second check span.
	b.cfg.SendSlack = time.Second
	tr := newTraces(t)
	sms, err := twilio.NewSender(twilio.Config{BaseURL: b.sms.URL, AccountSID: b.sms.AccountSID, AuthToken: b.sms.AuthToken, From: "+15005550006"})
	if err != nil {
		t.Fatal(err)
	}
	b.startOpts(t, b.cfg, app.WorkerOptions{TracerProvider: tr.tp,
		Senders: map[tasks.Channel]sender.Sender{tasks.SMS: sms, tasks.Email: leakySender{}}})

	const number, code = "+14155550187", "Your code is 842613"
	const mailbox, subject, letter = "jane.doe@example.com", "Statement for March", "Dear Jane, your balance is 1234.56"
	text := tasks.NewSMS("acme", number, code)
	mail := tasks.NewEmail("acme", mailbox, subject, letter)

	// The producer: e.g. the ingest API's request span.
	ctx, producer := tr.tp.Tracer("producer").Start(context.Background(), "ingest", trace.WithSpanKind(trace.SpanKindServer))
	b.enqueueCtx(ctx, t, text)
	b.enqueueCtx(ctx, t, mail)
	producer.End()
	psc := producer.SpanContext()

	spans := tr.wait(t, 30*time.Second, "both tasks' spans", func(s tracetest.SpanStubs) bool {
		return len(named(s, worker.SpanTask, "", "")) == 2
	})
	if got := b.sms.Deliveries(); len(got) != 1 || got[0].ID != text.ID {
		t.Fatalf("deliveries %+v, want the SMS", got)
	}
	if len(spans) != 7 {
		t.Errorf("%d spans, want 7 (producer; task, check, send for each)\n%s", len(spans), dump(spans))
	}
	for _, s := range spans {
		if s.SpanContext.TraceID() != psc.TraceID() {
			t.Errorf("span %s is in trace %s, want the producer's %s", s.Name, s.SpanContext.TraceID(), psc.TraceID())
		}
	}

	for _, tc := range []struct {
		n                  tasks.Notification
		outcome, sent      string
		status             codes.Code
		channel, destQueue string
	}{
		{text, "done", "sent", codes.Unset, "sms", b.cfg.Layout().Route("acme", tasks.LaneStandard, nil)},
		{mail, "archived", "permanent", codes.Error, "email", b.cfg.Layout().Route("acme", tasks.LaneStandard, nil)},
	} {
		tasksOf := named(spans, worker.SpanTask, worker.AttrID, tc.n.ID)
		if len(tasksOf) != 1 {
			t.Fatalf("%s: %d task spans\n%s", tc.channel, len(tasksOf), dump(spans))
		}
		task := tasksOf[0]
		if task.Parent.SpanID() != psc.SpanID() || !task.Parent.IsRemote() {
			t.Errorf("%s: task's parent %s (remote %v), want the producer's span %s, through the task headers", tc.channel, task.Parent.SpanID(), task.Parent.IsRemote(), psc.SpanID())
		}
		if task.SpanKind != trace.SpanKindConsumer {
			t.Errorf("%s: task span kind %v, want consumer", tc.channel, task.SpanKind)
		}
		for k, want := range map[attribute.Key]string{
			worker.AttrChannel: tc.channel, worker.AttrTenant: "acme", worker.AttrCategory: tasks.DefaultCategory,
			worker.AttrOutcome: tc.outcome, worker.AttrRetried: "0",
			"messaging.system": "asynq", "messaging.message.id": tc.n.ID, "messaging.destination.name": tc.destQueue,
		} {
			if got := attrString(task, k); got != want {
				t.Errorf("%s: task %s = %q, want %q", tc.channel, k, got, want)
			}
		}
		if task.Status.Code != tc.status {
			t.Errorf("%s: task status %v, want %v", tc.channel, task.Status, tc.status)
		}
		kids := childrenOf(spans, task)
		if len(kids[worker.SpanQuotaCheck]) != 1 || len(kids[worker.SpanSend]) != 1 || len(kids) != 2 {
			t.Fatalf("%s: task's children %v, want one check and one send\n%s", tc.channel, kids, dump(spans))
		}
		check, send := kids[worker.SpanQuotaCheck][0], kids[worker.SpanSend][0]
		for k, want := range map[attribute.Key]string{
			worker.AttrDecision: "admitted", worker.AttrAttempt: "1", worker.AttrBooked: "false",
			worker.AttrWaitMS: "0", worker.AttrRules: "1",
		} {
			if got := attrString(check, k); got != want {
				t.Errorf("%s: check %s = %q, want %q", tc.channel, k, got, want)
			}
		}
		if _, ok := attr(check, worker.AttrWaitFor); ok {
			t.Errorf("%s: a send admitted now waits for %q", tc.channel, attrString(check, worker.AttrWaitFor))
		}
		if !check.StartTime.Before(send.StartTime) || send.EndTime.After(task.EndTime) {
			t.Errorf("%s: check, send and task out of order", tc.channel)
		}
		if got := attrString(send, worker.AttrOutcome); got != tc.sent {
			t.Errorf("%s: send outcome %q, want %q", tc.channel, got, tc.sent)
		}
		if send.Status.Code != tc.status || send.SpanKind != trace.SpanKindClient {
			t.Errorf("%s: send status %v kind %v, want %v, client", tc.channel, send.Status, send.SpanKind, tc.status)
		}
		if tc.status == codes.Error {
			if len(send.Events) == 0 || send.Events[0].Name != "exception" {
				t.Errorf("%s: the failed send recorded no exception event: %+v", tc.channel, send.Events)
			} else if msg := send.Events[0].Attributes; !strings.Contains(fmt.Sprint(msg), "provider rejected") {
				t.Errorf("%s: exception %v does not say what failed", tc.channel, msg)
			}
			if attrString(send, worker.AttrNotSent) != "true" {
				t.Errorf("%s: send not_sent = %q", tc.channel, attrString(send, worker.AttrNotSent))
			}
		}
	}
	noPII(t, spans, number, "5550187", code, "842613", mailbox, "jane.doe", subject, letter, "balance is")
}

// A notification whose slot lies past MAX_INLINE_WAIT is booked: its check
// span carries the decision, the rule it waits for and the slot; its run
// ends as rescheduled (not an error), and the run that sends later is in the
// same trace, again a child of the producer's span.
func TestTraceOfABookedNotification(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	const window = 4 * time.Second
	b := setup(t, "sms:recipient=1/4s")
	// Slack wide enough that a reply slowed by a starved machine is not a
	// late wake-up, whose second check would be a second check span.
	b.cfg.SendSlack = time.Second
	tr := newTraces(t)
	b.startOpts(t, b.cfg, app.WorkerOptions{TracerProvider: tr.tp})
	producer := tr.tp.Tracer("producer")

	first := tasks.NewSMS("acme", "+14155550142", "first")
	ctx, p1 := producer.Start(context.Background(), "ingest first")
	b.enqueueCtx(ctx, t, first)
	p1.End()
	b.sms.WaitCount(t, 1, 10*time.Second)

	second := tasks.NewSMS("acme", "+14155550142", "second")
	ctx, p2 := producer.Start(context.Background(), "ingest second")
	b.enqueueCtx(ctx, t, second)
	p2.End()
	psc := p2.SpanContext()

	spans := tr.wait(t, 30*time.Second, "the second notification's sending run", func(s tracetest.SpanStubs) bool {
		return len(named(named(s, worker.SpanTask, worker.AttrID, second.ID), worker.SpanTask, worker.AttrOutcome, "done")) == 1
	})
	if got := b.sms.Deliveries(); len(got) != 2 || got[1].ID != second.ID {
		t.Fatalf("deliveries %+v", got)
	}

	firstRun := named(spans, worker.SpanTask, worker.AttrID, first.ID)
	if len(firstRun) != 1 {
		t.Fatalf("first: %d task spans\n%s", len(firstRun), dump(spans))
	}
	firstCheck := childrenOf(spans, firstRun[0])[worker.SpanQuotaCheck]
	if len(firstCheck) != 1 {
		t.Fatalf("first: no check span\n%s", dump(spans))
	}
	firstSlot, err := time.Parse(time.RFC3339Nano, attrString(firstCheck[0], worker.AttrSlot))
	if err != nil {
		t.Fatalf("first: slot: %v", err)
	}

	runs := named(spans, worker.SpanTask, worker.AttrID, second.ID)
	if len(runs) != 2 {
		t.Fatalf("second: %d task spans, want 2 (booked, then sent)\n%s", len(runs), dump(spans))
	}
	if runs[0].StartTime.After(runs[1].StartTime) {
		runs[0], runs[1] = runs[1], runs[0]
	}
	for i, run := range runs {
		if run.SpanContext.TraceID() != psc.TraceID() || run.Parent.SpanID() != psc.SpanID() {
			t.Errorf("second, run %d: trace %s parent %s, want the producer's trace %s and span %s", i+1,
				run.SpanContext.TraceID(), run.Parent.SpanID(), psc.TraceID(), psc.SpanID())
		}
	}
	if runs[0].SpanContext.SpanID() == runs[1].SpanContext.SpanID() {
		t.Fatal("both runs share a span")
	}

	// Run 1: booked and handed back to Asynq.
	booked, later := runs[0], runs[1]
	if got := attrString(booked, worker.AttrOutcome); got != "rescheduled" {
		t.Errorf("run 1 outcome %q, want rescheduled", got)
	}
	if booked.Status.Code == codes.Error {
		t.Errorf("run 1: a booked task is not a failure, status %v", booked.Status)
	}
	if attrString(booked, worker.AttrWaitFor) != "sms:recipient 1/4s" || attrString(booked, worker.AttrWakeAt) == "" {
		t.Errorf("run 1: wait_for %q wake_at %q", attrString(booked, worker.AttrWaitFor), attrString(booked, worker.AttrWakeAt))
	}
	kids := childrenOf(spans, booked)
	if len(kids[worker.SpanSend]) != 0 || len(kids[worker.SpanQuotaCheck]) != 1 {
		t.Fatalf("run 1: children %v, want a check and no send", kids)
	}
	check := kids[worker.SpanQuotaCheck][0]
	for k, want := range map[attribute.Key]string{
		worker.AttrDecision: "booked", worker.AttrBooked: "true", worker.AttrWaitFor: "sms:recipient 1/4s", worker.AttrAttempt: "1",
	} {
		if got := attrString(check, k); got != want {
			t.Errorf("run 1: check %s = %q, want %q", k, got, want)
		}
	}
	slot, err := time.Parse(time.RFC3339Nano, attrString(check, worker.AttrSlot))
	if err != nil {
		t.Fatalf("run 1: slot: %v", err)
	}
	if gap := slot.Sub(firstSlot); gap < window || gap > window+b.cfg.SendSlack+10*time.Millisecond {
		t.Errorf("run 1: slot %v is %v after the first send's %v, want the window %v (+ slack %v)", slot, gap, firstSlot, window, b.cfg.SendSlack)
	}
	if v, _ := attr(check, worker.AttrWaitMS); time.Duration(v.AsInt64())*time.Millisecond <= b.cfg.MaxInlineWait {
		t.Errorf("run 1: wait %d ms, want more than MAX_INLINE_WAIT %v (else it would wait in process)", v.AsInt64(), b.cfg.MaxInlineWait)
	}

	// Run 2: admitted for the booked slot, sent.
	kids = childrenOf(spans, later)
	if len(kids[worker.SpanQuotaCheck]) != 1 || len(kids[worker.SpanSend]) != 1 {
		t.Fatalf("run 2: children %v, want a check and a send", kids)
	}
	if got := attrString(kids[worker.SpanQuotaCheck][0], worker.AttrDecision); got != "admitted" && got != "admitted_later" {
		t.Errorf("run 2: decision %q, want admitted", got)
	}
	if got := attrString(kids[worker.SpanSend][0], worker.AttrOutcome); got != "sent" {
		t.Errorf("run 2: send outcome %q", got)
	}
	noPII(t, spans, "+14155550142", "5550142")
}

// enqueueCtx enqueues n with ctx, so the task carries ctx's span context.
func (b *bundle) enqueueCtx(ctx context.Context, t *testing.T, n tasks.Notification) {
	t.Helper()
	if _, err := tasks.Enqueue(ctx, b.client, b.keys(t), n); err != nil {
		t.Fatalf("enqueue %s: %v", n.ID, err)
	}
}
