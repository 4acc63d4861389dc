// Package plans works out when a notification may not be sent: the quiet
// hours of its recipient, as absolute spans of time.
//
// The TCPA restricts telephone solicitations to 8 am–9 pm at the called
// party's location, so quiet hours are kept in the recipient's local time.
// The worker asks Closed for the spans of the next day or two and hands
// them to the limiter, which places each send outside them.
//
// The package depends only on the standard library and
// github.com/nyaruka/phonenumbers.
//
// # Quiet hours
//
// QuietHours is a daily span of local wall-clock time, [Start, End), with
// minute precision. If Start > End it crosses midnight: 21:00–08:00 is
// quiet from 21:00 one evening to 08:00 the next morning. Start == End is
// invalid, because it could mean never or always. ParseQuietHours reads
// "21:00-08:00" (also "21-8", "21:00 – 08:00", and "24:00" as an end), and
// String writes the canonical "21:00-08:00" back.
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
