// Package consent is the consent model every channel shares: who must not
// get which messages any more (suppressions), the record of every opt-out
// and opt-in (the ledger), and what an inbound SMS asks for (Classify).
//
// It knows Redis and the limiter's keys, not the worker, the API or the
// command line: the worker checks a suppression inside the limiter's own
// script call, the API and the CLI record events, and both read the
// ledger, through this package.
//
// # Suppressions
//
// A suppression is keyed by (tenant, channel, recipient) and holds for a
// scope: every category of the channel, or named ones. Each recipient has
// one Redis hash, in the tenant's hash slot beside the limiter's windows:
//
//	key   <prefix>:{<tenant>}:consent:<channel>:<HMAC>     (Store.Key)
//	type  hash
//	field "!"        undeliverable: every category is blocked, exempt ones too
//	field "*"        opted out of every category: all but the exempt categories are blocked
//	field "c:<cat>"  opted out of category <cat>: it is blocked, exempt or not
//	field "+:<cat>"  opted back in to <cat> while "*" stands: it is let through
//	value "<until_ms>:<at_ms>:<source>:<code>"
//	      until_ms   when the mark lapses, 0 for never (opt-outs hold until an opt-in)
//	      at_ms      when the latest event that set it was recorded (Redis time)
//	      source     keyword, one-click, bounce, complaint, api, cli or provider
//	      code       the provider's error code or SMTP reply code, 0 for none
//
// <prefix> is the limiter's (sl1), <HMAC> its keyed hash of the normalised
// recipient under SLUICE_SUBJECT_SECRET (throttle.Limiter.Subject), so no
// address or number is stored in clear. A hash with only lapsing marks
// expires with the last of them; with a mark that never lapses it has no
// TTL. A send of category C (the default category's name when it has
// none) is blocked when, among the marks that count at now,
//
//	"!" is set                                       → reason 1, undeliverable
//	or "c:C" is set                                  → reason 2, the category
//	or "*" is set, C is not exempt, "+:C" is not set → reason 3, every category
//
// That is one HMGET of four fields, so the limiter's script decides it in
// the same call that admits the send, with no extra round trip. The rule is
// written once, in scripts/consent.lua: the limiter's library joins it, and
// CheckScript runs it alone (KEYS[1] the hash, ARGV the time, the category
// and the exempt flag) for Store.Check. State.Blocks is the same decision
// in Go, for readers of a State, held to the script's answers by a test on
// random histories.
//
// # What an opt-out lets through
//
// A tenant may declare categories exempt from an opt-out of every
// category ("*"). Only these belong there, because only for these does the
// law let a sender go on after "stop":
//
//   - A message the recipient has just asked for, sent at once and holding
//     only what was asked — a one-time passcode or password-reset code the
//     recipient requested on the tenant's site, a receipt they asked to be
//     texted. The FCC has held since 2015 that such an on-demand text
//     answers the recipient's own request, which is its consent for that
//     message (the request is made after the opt-out, so it is not the
//     revoked consent).
//   - The one confirmation of an opt-out that 47 CFR 64.1200(a)(12)
//     allows within five minutes, with no marketing in it.
//   - Email that CAN-SPAM calls a transactional or relationship message
//     (15 U.S.C. § 7702(17): a receipt, an account or security notice):
//     the opt-out it requires covers commercial mail.
//
// Calls exempt from the consent rule (64.1200(a)(9): package delivery,
// healthcare, fraud alerts) are not on this list: their exemption is
// conditioned on honouring opt-outs. A category opted out by name ("c:")
// is blocked even when exempt — the recipient said no to exactly that —
// and an undeliverable mark ("!") blocks everything. Which categories are
// exempt is the tenant's declaration and the tenant's responsibility; the
// store only applies it (the check's exempt flag).
//
// # Events
//
// Every change is an Event — OptOut, OptIn, Undeliverable, or Review (a
// reply that reads like a revocation, recorded for a person; it changes
// nothing) — with its Source, Scope, Code, Until, Ref (the message id,
// provider SID or request id that carried it) and Keyword. Store.Record
// applies it to the hash and appends it to the ledger in one script call
// (record.lua), so the hash is always what the ledger's events, in order,
// leave behind, however many callers race; and it begins with a write
// Redis never refuses, so an opt-out is recorded even at maxmemory under
// noeviction. OptOut of every category sets "*" and ends the categories
// opted back in; OptOut of categories sets their "c:"; OptIn of every
// category clears every mark, "!" included; OptIn of categories clears
// their "c:" and, under "*", sets their "+:"; Undeliverable sets "!". A
// mark set again keeps the later end.
//
// # The ledger
//
// Each recipient and channel has a list, oldest first:
//
//	key   <prefix>:{<tenant>}:ledger:<channel>:<HMAC>
//	type  list
//	entry "<at_ms>|<action>|<source>|<scope>|<code>|<until_ms>|<ref>|<keyword>"
//	      e.g. 1767225600000|out|keyword|*|0|0|SM0123456789abcdef0123456789abcdef|STOP
//
// Entries older than the retention (Options.Retention, five years by
// default: past the four-year federal limitations period for TCPA claims)
// are dropped as the next event is recorded and skipped when read; the
// list expires a retention after its last event; at most
// Options.MaxEvents (1000) are kept per recipient, the oldest dropped
// first. Store.Ledger answers "when and how did +1… opt out". The ledger
// holds no message text, only the canonical keyword matched. A
// suppression outlives its ledger: the hash keeps the time and source of
// the event that set each mark. Measured on Redis 7.0 (docs/consent.md):
// a further event costs about 89 bytes of used_memory (a 71-byte entry
// for a STOP with a 34-character SID), a recipient's first about 550–620
// (the hash, 152 bytes by MEMORY USAGE, a one-event ledger, 280, and
// their keyspace entries).
//
// # Delivery's suppression list
//
// Package delivery kept, before this package, an SMS-only list fed by
// provider error codes: <prefix>:{<tenant>}:suppressed:sms:<HMAC>, a
// string holding the code, with a TTL. Its key shares the HMAC with the
// hash here, so Store.MigrateDelivery moves every entry (SCAN, on every
// Cluster master) into an Undeliverable mark of source provider, with the
// same code and end, and a ledger event, and deletes the old key: the old
// format is migrated, not kept. Workers run it once at start
// (MigrateDeliveryOnce, whose marker of a completed run expires after
// MigrationMarkerTTL, like every key that need not live forever). Until
// every worker runs the new check, the limiter may read both keys (the
// old one as today's ReserveOptions.Block).
//
// # Inbound SMS
//
// Classify reads a reply: the FCC's words (STOP, QUIT, END, REVOKE, OPT
// OUT, CANCEL, UNSUBSCRIBE) and the tenant's own opt out, START, UNSTOP and
// YES opt back in, HELP and INFO ask for help — case, punctuation, accents
// and fullwidth forms ignored — and a message that is none of these but
// reads like a revocation ("please stop texting me", "don't text me",
// "wrong number", "no más") is for review. It is a pure function.
package consent
