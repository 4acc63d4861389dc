// Package api is Sluice's HTTP ingest API, run by `sluice api`: producers
// enqueue notifications over HTTP, read their state and their tenant's
// quotas. It writes the same Asynq tasks (sealed with SLUICE_PAYLOAD_KEYS)
// as tasks.Enqueue, which the workers send.
//
// # Endpoints
//
// Every route `sluice api` serves, the ones app mounts beside the
// API's own included, one line each: methods, then paths, then what it
// does (TestRoutesDoc in app keeps the list equal to the routes
// the built server registers; ANY is a pattern without a method). The
// dashboard's pages, under /ui, are listed in package dashboard.
//
//	POST /v1/notifications         one notification, or {"notifications": [...]} (1–500), all or nothing → 202
//	GET  /v1/notifications/{id}    queued, waiting (reason, rule, slot), sending, sent, archived (reason), unknown;
//	                               an SMS the provider reported on: delivered, undelivered or failed (error_code)
//	GET  /v1/quotas                the windows of `sluice quota show --json`, under the plans in force
//	GET  /v1/suppressions/{channel}/{recipient}        the recipient's suppressions and consent ledger (masked)
//	POST, PUT /v1/suppressions/{channel}/{recipient}   record one opt-out, opt-in or undeliverable event (source api)
//	DELETE /v1/suppressions/{channel}/{recipient}      opt back in to every category; the ledger keeps what was
//	POST /v1/events/{channel}      up to 1000 events, each with its recipient (a provider's reports, an import), all checked first
//	POST /v1/callbacks/sms/{tenant}/{id}      the Twilio-compatible provider's status callbacks, signed (X-Twilio-Signature) → 204
//	POST /v1/inbound/sms/{tenant}             its incoming messages (STOP, START, HELP: package sender/inbound), signed alike
//	POST /v1/callbacks/telnyx/{tenant}/{id}   Telnyx's delivery reports, signed (Ed25519)
//	POST /v1/inbound/telnyx/{tenant}          Telnyx's incoming messages, signed alike
//	POST /v1/webhooks/{provider}/{tenant}     an email provider's signed bounces and complaints (package webhook):
//	                                          {provider} is ses, sendgrid, postmark or mailgun; or whatsapp
//	                                          (sender/whatsapp): inbound messages and statuses, X-Hub-Signature-256
//	GET  /v1/webhooks/whatsapp/{tenant}       Meta's verification of the WhatsApp webhook URL (hub.challenge)
//	GET, POST /u/{token}           the one-click unsubscribe link of an email (package unsubscribe): a page, and RFC 8058's POST
//	ANY  /v1/                      anything else under /v1: 405 with Allow (from every route registered, the mounted ones included) on a known path, else 404 (problems)
//	GET  /openapi.yaml             the OpenAPI 3.1 document (embedded; tested against the handlers)
//	GET  /metrics, /healthz, /readyz
//
// Routing is the standard library's method-and-path patterns; handlers are
// methods of Server; middleware is func(http.Handler) http.Handler
// (instrument → authenticate → rateLimit). Every error is an RFC 9457
// problem (application/problem+json) written by one helper, with
// invalid-params naming each bad field and, in a batch, its index.
//
// # Batches
//
// A batch is all or nothing even with workers running: its items are
// enqueued held (tasks.Batch: scheduled tasks.BatchHold ahead) and released
// together once all are in; a failure part-way deletes them before any
// worker could take one.
//
// # Routes mounted beside the API
//
// The API knows no other product: app, which builds the process
// `sluice api` runs, mounts the SMS providers' callbacks and incoming
// messages (sender/twilio, sender/telnyx), the email providers' webhooks
// (webhook/providers), the unsubscribe links (package unsubscribe) and the
// dashboard (package dashboard) on the Server with Mount — behind the
// access log and the metrics, not behind the token check or rate — or
// MountBare (static files). A mounted handler names who a request acted
// for in the access log through its
// ResponseWriter's SetIdentity; Auth gives it the API's token checks
// (Identify, Valid, Tenants, and a SessionKey that changes with the token
// key or the admin token); Stopping ends its long answers on shutdown.
//
// # Tokens
//
// A tenant token ("sluice_<id>_<secret>", from `sluice tenant token
// create`) is shown once; Redis keeps only its HMAC-SHA256 under
// SLUICE_API_TOKEN_KEY, a key of the API's own, so a copy of Redis neither
// holds a token nor lets anyone test guesses, and rotating
// SLUICE_SUBJECT_SECRET does not revoke tokens. A tenant token acts for its
// own tenant only: enqueueing for another is 403; another tenant's
// notification is 404, the same answer as for one that does not exist. The
// admin token (SLUICE_API_ADMIN_TOKEN, compared in constant time) reads
// every tenant and names the tenant it acts for with ?tenant=.
//
// # Idempotency
//
// Idempotency-Key follows the IETF httpapi draft. The first request with a
// key takes the key (a record in Redis keyed by the tenant and a SHA-256 of
// the key) before it reads the body; a retry with the same body gets the
// stored 202 (Idempotent-Replayed: true) for SLUICE_API_IDEMPOTENCY_TTL
// (≥ 24 h), with another body 422, and while the first is in flight 409.
// Requests answered with an error keep nothing, so a corrected retry may
// reuse the key. The notification ids are derived from the tenant, the key
// and the index (NotificationID): a retry whose record was lost still
// cannot enqueue twice — its ids are refused as still enqueued, or known
// to the workers as sent.
//
// # Status callbacks
//
// With SLUICE_SMS_STATUS_CALLBACK_URL set, workers ask the provider to
// report each SMS at BASE/v1/callbacks/sms/TENANT/ID. That route carries no
// token: it checks X-Twilio-Signature (HMAC-SHA1 under SLUICE_SMS_AUTH_TOKEN
// of BASE + the request's path and query + the sorted form fields), refusing
// a missing or wrong one with 403 before it reads or writes anything, then
// answers 404 for a notification without a limiter record. Statuses are
// kept by package delivery, forward only; a first final one is counted in
// sluice_delivery_outcomes_total, and a permanent failure whose code is in
// SLUICE_SMS_SUPPRESS_CODES marks the recipient undeliverable in package
// consent (the tenant's suppressions), which the workers' quota check
// reads before each send. Telnyx's routes do the same with its own
// signature (sender/telnyx).
//
// # Rate limit
//
// Each token may make SLUICE_API_RATE requests (default 50/1s), counted by
// throttle.Limiter.Allow in Redis, so the limit is exact across replicas of
// the API; past it the answer is 429 with Retry-After.
package api
