// Package tasks is what a producer imports to send notifications through
// Sluice: the task types, the payload, its validation and the enqueue
// helper. It does not pull in the worker, the senders or metrics.
//
// # Enqueue
//
//	client := asynq.NewClient(asynq.RedisClientOpt{Addr: "localhost:6379"})
//	keys, err := tasks.ParseKeyring(os.Getenv("SLUICE_PAYLOAD_KEYS")) // seals the payload
//	info, err := tasks.Enqueue(ctx, client, keys, tasks.NewSMS("acme", "+14155550100", "Your code is 123456"))
//
// A notification's ID (a UUIDv7 unless set) is its task id: enqueueing the same
// id twice returns ErrDuplicate, so a producer can retry an enqueue safely.
//
// # Email
//
// An email has a text Body (required) and may add an HTML body, a Reply-To
// address, custom headers and a List-Unsubscribe target:
//
//	n := tasks.NewEmail("acme", "ann@example.com", "Your receipt", "Thanks for your order.")
//	n.HTML = "<p>Thanks for your <b>order</b>.</p>"
//	n.ReplyTo = "support@acme.example"
//	n.Headers = map[string]string{"X-Campaign": "receipts"}
//	n.ListUnsubscribe = "https://acme.example/u/8f2c, mailto:unsub@acme.example?subject=8f2c"
//
// With HTML the email is multipart/alternative (text, then HTML); Sluice does
// not derive the text part from HTML, nor sanitise the HTML. Headers cannot
// set or override what Sluice or a mail system writes (ReservedHeader).
// List-Unsubscribe carries both URIs, and an https URL adds RFC 8058's
// List-Unsubscribe-Post: List-Unsubscribe=One-Click. These fields are errors
// on an SMS.
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
// must not contain CR, LF or other control characters; bodies have size
// bounds (an email's text and HTML together at most MaxEmailBodyBytes, the
// encoded payload at most MaxPayloadBytes). A task that fails validation in
// the worker is archived at once and never sent.
package tasks
