// Package throttle is an exact sliding-window-log limiter in Redis.
//
// Each limited subject and rule has one sorted set: score = the instant of
// a send in milliseconds (its slot: now, or a booked instant ahead), member
// = the stable id of the send. A check is one call of the limiter library
// (scripts/limiter.lua, the index of the Lua files joined into it), a batch
// of operations that share one clock reading (Redis TIME). Its reserve
// operation trims, for every rule of the check, the entries that left the
// window; reads the entries around the wanted instant with ZCOUNT and
// ZRANGEBYSCORE … WITHSCORES; and finds the earliest slot at which one more
// send keeps every rule (outside any closed spans: quiet hours) — then
// admits the send there, books it for later, or denies it, all rules or
// none. Series reads how one window filled, step by step, for a chart
// (scripts/series.lua, read-only, on the same clock), so no reader outside
// builds a key or counts entries itself.
//
// # Operations
//
// The library has ten operations, each in its own scripts/op_*.lua with
// its KEYS/ARGV/return contract on top, each written by one encoder of
// ops.go, which a test checks against that header:
//
//   - R reserve (Reserve, Allow): admit a send now or for an instant just
//     ahead, book a later slot, or deny, drop, expire or block it.
//   - P place: a check's limits in another group of a Redis Cluster,
//     before its own group reserves (across.go).
//   - D done (MarkDone): record an attempt's send as completed.
//   - X release (Release): give an attempt's slot back.
//   - S state: read a notification's record (a check across groups).
//   - U usage (Usage): how full each rule is, read-only.
//   - H hold (Hold): hold a scope, a provider's back-pressure (hold.go).
//   - L lease (Acquire): take in-flight slots (inflight.go).
//   - F free (Free): give in-flight slots back.
//   - B breaker (ProviderFailed, TryProbe, ProviderRecovered): a
//     provider's circuit breaker, shared by every worker (breaker.go).
//
// # Guarantees
//
//   - Exact: for every key and instant t, admissions scored in [t−window, t]
//     never exceed the limit, however many goroutines, processes or hosts ask.
//   - One clock: Redis TIME decides; worker clocks never do.
//   - Boundary: an entry scored exactly now−window is still inside; one
//     millisecond older is out.
//   - Denials add nothing, so a set never holds more than its limit.
//   - Retry-after is exact: on denial the script reads the window's entries
//     with their scores (ZRANGE … WITHSCORES, by score) and returns the
//     instant the oldest entry that must leave opens a slot:
//     oldest+window+1ms−now when one rule is full.
//   - Several rules, one answer: all-or-nothing across the limits of a check;
//     the denial names the rule with the longest wait.
//   - Idempotent: asking again for an admitted member returns Duplicate and
//     counts nothing.
//   - No PII in keys: subjects are stored as an HMAC-SHA256 (first 16 bytes).
//
// # Redis Cluster
//
// Every key of a check carries its group (the tenant) as hash tag, so a
// check of one group touches one slot and runs as one script. A check whose
// limits live in several groups (a sender window shared by every tenant) is
// taken one group at a time on a Cluster: placed in every other group at an
// instant a few milliseconds ahead, then admitted in its own, and rolled
// back everywhere when any group moves the slot (across.go).
//
// # Replicas
//
// Redis replicates asynchronously: a master that fails takes with it the
// admissions its replicas had not received. With Options.WaitReplicas every
// check that admits is followed, on the same connection, by WAIT for that
// many replicas (on a Cluster, to the master of the check's slot); an
// admission fewer acknowledged is an error wrapping ErrNotReplicated, and
// nothing may be sent on it. The same run asking again (ReserveOptions.Nonce)
// gets its own admission back and waits again.
//
// # Counter rules
//
// Two kinds of Rule keep counts in a hash instead of entries in a sorted
// set (calendar.go; the script's "Counter rules"): a calendar rule
// (Rule.Calendar, "2000/1d@America/Los_Angeles") keeps one counter per
// period of an IANA zone, whose boundaries the check passes (PeriodStart,
// NextPeriod: DST-correct); a bucketed rule (Rule.Buckets, "10000/1h~60")
// keeps one count per bucket and counts every bucket a span can touch as
// wholly inside it, so it never admits what the exact log would not and
// admits whatever a log one bucket longer would. Both take part in
// bookings, releases (at the attempt's recorded slot), drop rules, Usage
// and Series; Allow refuses them (no member is kept to dedupe on), and on a
// Cluster they must live in the check's own group.
//
// # Memory
//
// A window holds at most its limit, so memory is bounded by
// subjects × limit × bytes-per-entry whatever the traffic; see docs/redis.md for
// measured bytes per entry. A counter key holds one field per bucket or
// period (plus those booked ahead): about 1 KB for 60 buckets.
package throttle
