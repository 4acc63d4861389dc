// Package tasks is what a producer imports to send notifications through
// Sluice: the task types, the payload, its validation and the enqueue
// helper. It does not pull in the worker, the senders or metrics.
//
// # Enqueue
//
//	client := asynq.NewClient(asynq.RedisClientOpt{Addr: "localhost:6379"})
//	info, err := tasks.Enqueue(ctx, client, tasks.NewSMS("acme", "+14155550100", "Your code is 123456"))
//
// A notification's ID (a UUIDv7 unless set) is its task id: enqueueing the same
// id twice returns ErrDuplicate, so a producer can retry an enqueue safely.
//
// # Tracing
//
// Enqueue (and NewTaskContext) put the span context of ctx into the task's
// headers as a W3C traceparent (and tracestate), with whatever else the
// global propagator carries; the worker continues the trace from there.
// Without a span in ctx nothing is added. This package uses only the
// OpenTelemetry API: it starts no spans and exports nothing itself.
//
// # Validation
//
// Addresses must be bare RFC 5322 addresses, numbers E.164; header fields
// must not contain CR or LF; bodies have size bounds. A task that fails
// validation in the worker is archived at once and never sent.
package tasks
