// Package keyspace builds every Redis key Sluice writes or reads, and
// holds the table of them (Table) that docs/architecture.md's "Redis keys"
// section shows, generated from it.
//
// It only assembles strings from parts its callers have already
// normalised: a tenant, a channel, a subject already hashed (the keyed
// hash of a recipient stays with the limiter, throttle.Limiter.Subject),
// an id. It imports nothing of Sluice, so every layer may use it, and no
// other package spells a key: a key's layout is written once, here.
//
// Three families of keys:
//
//   - the limiter's and its neighbours', under a configurable prefix
//     (DefaultPrefix, "sl1"; a new layout gets a new prefix): Space;
//   - Sluice's own, under "sluice:" (plans, tokens, queued quotas, held
//     sends...): the package-level functions and constants;
//   - Asynq's, "asynq:{<queue>}:…", those Sluice names itself for its
//     scripts and reads (Asynq builds the same ones), and its own
//     "fair" and "fair:clock" beside them: Queue.
//
// Every key string is byte-for-byte the one earlier releases built, so
// deployed data is found after an upgrade (keyspace_test.go pins them).
package keyspace
