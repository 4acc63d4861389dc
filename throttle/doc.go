// Package throttle is an exact sliding-window-log limiter in Redis.
//
// Each limited subject and rule has one sorted set: score = admission time
// in milliseconds, member = the stable id of the admitted send. A check is one
// Lua script (scripts/allow.lua) that, for every rule of the check, trims the
// entries that left the window, counts what is left, and admits only if every
// rule has room — then adds the member to every set and sets each set's TTL
// to its window.
//
// # Guarantees
//
//   - Exact: for every key and instant t, admissions scored in [t−window, t]
//     never exceed the limit, however many goroutines, processes or hosts ask.
//   - One clock: Redis TIME decides; worker clocks never do.
//   - Boundary: an entry scored exactly now−window is still inside; one
//     millisecond older is out.
//   - Denials add nothing, so a set never holds more than its limit.
//   - Retry-after is exact: on denial the script reads, with ZRANGE …
//     WITHSCORES, the entry that must leave and returns oldest+window+1ms−now.
//   - Several rules, one answer: all-or-nothing across the limits of a check;
//     the denial names the rule with the longest wait.
//   - Idempotent: asking again for an admitted member returns Duplicate and
//     counts nothing.
//   - No PII in keys: subjects are stored as an HMAC-SHA256 (first 16 bytes).
//
// # Redis Cluster
//
// Every key of a check carries its group (the tenant) as hash tag, so one
// check always touches one slot and runs as one script. Checks across groups
// are not offered: ask once per group.
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
// # Memory
//
// A window holds at most its limit, so memory is bounded by
// subjects × limit × bytes-per-entry whatever the traffic; see docs/redis.md for
// measured bytes per entry.
package throttle
