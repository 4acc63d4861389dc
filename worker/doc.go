// Package worker is Sluice's throttled Asynq server: a mux with one handler
// per channel, each sending through the provider the configuration names
// (sender/providers: SMTP, a Twilio-compatible HTTP API, Telnyx, or the log
// sender), behind the send path: stages of their own types, composed in
// path.go, which names them and their files.
//
// # What happens to a task
//
//  1. The middleware decodes and validates the payload. Poison input (bad
//     JSON, an invalid address or number, CR/LF in a header, an oversize
//     body) is archived at once with the reason (asynq.SkipRetry).
//  2. It asks the limiter, in one script call, with every rule that applies
//     to the task's channel, recipient and tenant (Config.Rules).
//  3. Denied: the task is handed back to Asynq as a *ThrottledError, which
//     is not a failure: no retry is spent, failed/processed stats do not
//     move, and it is scheduled for the moment its slot opens rounded up to
//     a whole second (Asynq keeps whole seconds and truncates).
//  4. Allowed: the sender sends. Success marks the notification done (a
//     re-run task will not send again). A definite non-send releases the
//     quota slot. Permanent provider errors archive (a refusal that says
//     the recipient cannot take messages marks it undeliverable in package
//     consent, for the tenant); transient ones retry with backoff
//     (honouring Retry-After) until the retry budget is spent.
//     A throttling answer (429, Twilio 20429/30001, SMTP 421/451/452/454)
//     holds its provider or sender scope in Redis (throttle.Limiter.Hold):
//     every worker's checks name the holds (ReserveOptions.Holds) and book
//     after them, and the task waits for the hold's end as a deferral.
//  5. Redis unreachable (or out of memory, or, with Config.RedisWaitReplicas,
//     replicas not acknowledging the admission): nothing new is admitted and
//     nothing is sent on an unacknowledged admission; the check is tried
//     again every Config.UnavailableRetry, without spending a retry. Sends
//     admitted before may still go out: at most the tasks the worker runs
//     at once, Concurrency + PriorityConcurrency + 2 × MaxWaiters — or,
//     with Config.HeldDeadAfter on (the default), Concurrency +
//     PriorityConcurrency: a send held for its slot goes only once Redis
//     answered its claim (held.go).
//
// # Redis's settings
//
// Run reads every Redis node's settings (internal/redisguard): it refuses a
// maxmemory-policy that may evict unless Config.RedisAllowEviction, logs
// each node's durability, warns about rule limits above
// zset-max-listpack-entries, and keeps watching: an eviction or full memory
// makes /readyz degraded.
//
// # Orphaned tasks
//
// A task Asynq holds as active that no worker runs (its worker killed, or
// its dequeue reply lost as Redis died) is put back in the queue by every
// worker's sweep once its lease has stood still for Config.OrphanAfter and
// no live server lists it, instead of after Asynq's 60–120 s lease recovery.
//
// A send held in process for its slot (waitForSlot: an OTP admitted for a
// slot ahead, a digest's carrier waiting for its window) is recovered
// sooner (held.go): while it holds any, a worker stamps itself in Redis
// every 250 ms; one unstamped for Config.HeldDeadAfter (1 s, by Redis's
// clock) is presumed dead, and a sweeper turns each send's admission into a
// booking of the same slot and puts the task back: within 1.5 s of the
// worker's stop (two reads 250 ms apart find the same old stamp). The holder claims its admission just before its send;
// the takeover succeeds only on an unclaimed one, so a live worker presumed
// dead (late stamps) either sends first or neither sends, gives back nor
// completes what was taken over: no send goes twice.
//
// # Retry budget
//
// Asynq v0.26 archives a task whose retries are used up before it asks
// whether the error is a failure, so a denied task enqueued with MaxRetry(0)
// would be archived. tasks.NewTask therefore keeps the real budget in a
// header and gives Asynq one more; the middleware archives on real failures
// by the header. A task built without tasks.NewTask whose Asynq retries are
// used up is rescheduled as a copy (same payload, the remaining budget).
//
// # Tracing
//
// Each run of a task is a span (SpanTask, kind consumer) whose parent is the
// producer's span from the task's traceparent header (see
// tasks.Enqueue), with a child for the quota check (SpanQuotaCheck: the
// decision, the slot, the rule or quiet hours waited for) and one for the
// send (SpanSend). A task that waits for its slot runs again under the same
// parent, so every run of a notification is in its producer's trace. Spans
// come from Options.TracerProvider (default: the global one, a no-op until
// the process installs an SDK). They name channel, category, tenant and ids,
// never a recipient, subject or body; errors are recorded redacted.
package worker
