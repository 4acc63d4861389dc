// Package plans holds a deployment's and its tenants' rules and works
// out what each notification is checked against: which rate limits and
// in-flight caps bind it, the spans its recipient's quiet hours close, its
// deadline, its lane and shard, and what an opt-out covers.
//
// # The rule grammar
//
// Parse reads a rule list (SLUICE_RULES, or a tenant plan): entries
// separated by commas or new lines, each an Entry of one Kind — a rate
// rule (KindRate, CHANNEL[.CATEGORY]:SCOPE=LIMIT/WINDOW [drop], SCOPE
// recipient, tenant, sender or provider), an in-flight cap
// (KindConcurrency), a priority lane (KindExempt), quiet hours (KindQuiet),
// a send-by bound (KindMaxDefer), the re-run policy (KindRerun), a default
// zone (KindZone), the bulk lane (KindBulk), a default List-Unsubscribe
// (KindUnsubscribe), a tenant's own shard (KindShard), the consent entries
// (KindConsentExempt, KindOptOut, KindReply, KindKeywords) and the caps on
// queued work (KindMaxQueued, KindMaxQueuedBytes). Parse's doc lists the
// syntax of each; docs/rules.md explains them. Bad entries are errors
// wrapping ErrBadRules that name the entry.
//
// A Policy is a parsed list. Policy.Match answers what applies to one
// tenant, channel and category (a tenant's entry replaces the default of
// the same target; the most specific quiet hours, max-defer and rerun
// win); Policy.Queue the lane and shard a notification waits in;
// Policy.Consent and ConsentExempt what an opt-out covers and lets
// through; Policy.QueuedCaps a tenant's caps on queued work.
//
// # The planner
//
// Planner.Check turns a notification under a policy into a Check: the
// limits bound to its recipient and origin (throttle.Limit, throttle.Cap;
// sender and provider windows live in SharedGroup, across tenants), the
// quiet spans of its candidate zones as closed intervals for the limiter,
// and its deadline (expires_at, or enqueue time plus max-defer). The
// worker plans every check with it, and the quota report and the
// dashboard work out what they show with it, so the three agree.
//
// # Tenant plans in Redis
//
// A tenant's plan is a rule list of its own (no TENANT/ prefixes) kept by
// Store in Redis (sluice:{plans}:tenants, with a version counter and a log
// of the last 1000 changes in the same hash slot; `sluice tenant set`
// writes them) and merged over the defaults (Policy.With). A Watcher
// reloads the plans on every change announced on pub/sub and checks the
// version every interval; Live is the rules in force a process reads once
// per check, so a change holds from the moment it is applied and a check
// never mixes two versions. A stored plan that no longer validates is
// left out and reported.
//
// Besides the standard library the package depends on
// github.com/nyaruka/phonenumbers (zones and US states of numbers),
// github.com/redis/go-redis/v9 (tenant plans in Redis), and Sluice's tasks
// (the notification), throttle (the limits it builds), consent (to check
// a tenant's keywords) and keyspace (the keys of the plans in Redis); never on the worker, the API or the command
// (TestDependencies, TestPackageDoc; internal/codecheck's TestLayers keeps
// every package in its layer).
//
// # Quiet hours
//
// Quiet hours are kept in the recipient's local time: the TCPA restricts
// telephone solicitations to 8 am–9 pm at the called party's location.
// The planner asks Closed for the spans of the next day or two, and the
// limiter places each send outside them.
//
// QuietHours is a daily span of local wall-clock time, [Start, End), with
// minute precision. If Start > End it crosses midnight: 21:00–08:00 is
// quiet from 21:00 one evening to 08:00 the next morning. Start == End is
// invalid, because it could mean never or always. ParseQuietHours reads
// "21:00-08:00" (also "21-8", "21:00 – 08:00", and "24:00" as an end), and
// String writes the canonical "21:00-08:00" back.
//
// # Presets
//
// A preset is quiet hours that depend on where the recipient is and on the
// day of the week. ParseQuietHours reads one by name, and a rule writes it
// as sms.marketing:quiet=tcpa. PresetTCPA keeps the hours US law allows for
// telephone solicitations by text, in the recipient's local time:
//
//	federal (47 CFR 64.1200(c)(1))            08:00–21:00 every day
//	Florida, Oklahoma, Maryland, Mississippi,
//	New Jersey                                08:00–20:00 every day
//	Connecticut                               09:00–20:00 every day
//	Texas (SB 140, from 1 September 2025)     09:00–21:00 Monday–Saturday, 12:00–21:00 Sunday
//
// The quiet span that begins on a day runs from that day's close to the
// next day's open (Texas: Saturday 21:00 to Sunday 12:00), with the same
// reading of days on which the clock jumps as a daily span. A day's rule is
// that of its local date (Texas's holds from the night of 31 August 2025
// into 1 September on).
//
// The state comes from the number (USStates): phonenumbers'
// GetGeocodingForNumber names it ("Florida", "San Francisco, CA"); a
// number whose area code belongs to a state with a rule of its own counts
// as possibly in that state too, whatever the geocoder says of its
// exchange. Where the state is unknown — no phone (ClosedFor without one,
// and Closed), a toll-free or non-geographic number, a number outside the
// US — every state's rule holds at once: 09:00–20:00 Monday to Saturday and
// 12:00–20:00 on Sunday. Where several states are candidates, theirs all
// hold. A US territory (Puerto Rico, Guam, the US Virgin Islands, American
// Samoa, the Northern Mariana Islands) has the federal window. An area
// code that spans two zones (Florida's 850 and 448, Texas's 432) adds both
// to the candidate zones. A number outside the US gets the strictest US
// rule, which is not its own country's: give its hours in a category of
// its own with quiet=HH:MM-HH:MM.
//
// An area code is a presumption, not a location: a recipient who moved
// keeps the old number. The preset follows the number (Florida's law
// presumes a call to a Florida area code reaches someone in Florida); a
// payload's tz changes the zones the rule is read in, never the state.
//
// # Zones
//
// Zones lists a recipient's candidate zones: the payload's IANA zone if it
// names one, else the zones the phone number's country and area map to,
// else a fallback (the tenant's or deployment's zone). A number can map to
// several zones: +1 907 (Alaska) to America/Adak and America/Anchorage, a
// +1 800 toll-free number to all 42 zones of the North American Numbering
// Plan, from Pacific/Pago_Pago (UTC−11) to Pacific/Guam (UTC+10).
//
// When the zone is uncertain, an instant is quiet if it is quiet in ANY
// candidate zone: Closed returns the union of the zones' spans, and Quiet
// is true if any zone is quiet. The more candidates, the less time is open:
// 21:00–08:00 across the 42 NANP zones leaves 22:00–00:30 UTC open in
// winter.
//
// # Daylight saving time
//
// On the days the clock jumps, some readings do not occur (spring forward:
// in New York on 2026-03-08 the clock goes from 01:59:59 EST to 03:00:00
// EDT) and some occur twice (fall back: on 2026-11-01, 01:00–01:59 is read
// first in EDT, then again in EST). When in doubt, the package keeps the
// recipient's phone quiet. Each day's quiet span runs
//
//   - from the FIRST instant at which the local clock reads Start or later:
//     a Start that does not occur is passed when the clock jumps over it,
//     so the span starts at the jump (02:15–06:00 on 2026-03-08 in New York
//     is quiet from 03:00 EDT); a Start that occurs twice starts the span
//     at its first occurrence;
//   - to the LAST instant at which the local clock reads End or earlier:
//     an End that does not occur ends the span at the jump (01:30–02:30 on
//     2026-03-08 is quiet from 01:30 EST to 03:00 EDT, half an hour); an
//     End that occurs twice ends it at its last occurrence (01:30–02:30 on
//     2026-11-01 is quiet from 01:30 EDT to 02:30 EST, two hours;
//     00:30–01:30 from 00:30 EDT to the second 01:30, in EST; 23:00–01:00
//     until 01:00 EST, the first reading of the repeat included).
//
// So a span can be longer than its nominal length, or shorter, and one that
// lies wholly inside a gap (02:00–03:00 on 2026-03-08 in New York) does not
// occur that day. Between the two readings of a repeated hour an instant
// can be quiet although its clock reading alone is outside Start–End
// (01:15 EST on 2026-11-01 under 01:30–02:30): the span began at the first
// 01:30 and its End has not been reached since. Instants are computed from
// the zone's transitions (time.Time.ZoneBounds), never from time.Date,
// whose choice for a reading in a gap or a repeat is unspecified.
//
// Zones whose offset is not whole hours (Asia/Kolkata, UTC+05:30) and
// transitions at midnight need no special case.
package plans
