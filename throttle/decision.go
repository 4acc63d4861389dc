package throttle

import (
	"fmt"
	"time"
)

// Status is what a check decided.
type Status int

// The statuses a check can end in. A denial is data, not an error.
const (
	// StatusDenied: no room now (Allow, or Reserve without Book); nothing was added.
	StatusDenied Status = 0
	// StatusAdmitted: the send takes its slot at Decision.At — now, or up to
	// ReserveOptions.Horizon later (the caller sends then).
	StatusAdmitted Status = 1
	// StatusDuplicate: the member was already admitted; nothing counted twice.
	StatusDuplicate Status = 2
	// StatusDone: MarkDone was recorded for the id; nothing changed.
	StatusDone Status = 3
	// StatusBooked: the id holds the slot at Decision.At; asking again from
	// about then admits it.
	StatusBooked Status = 4
	// StatusUnknown: an earlier attempt was admitted and neither marked done
	// nor released, and the policy is AtMostOnce: nothing changed.
	StatusUnknown Status = 5
	// StatusExpired: the earliest slot is after ReserveOptions.Deadline;
	// nothing is held (a booking the id had is released).
	StatusExpired Status = 6
	// StatusDropped: a rule with Drop set was full; nothing was added.
	StatusDropped Status = 7
	// StatusBlocked: ReserveOptions.Block exists (e.g. the recipient is on a
	// suppression list), or ReserveOptions.Consent's suppression hash blocks
	// the category (Decision.BlockReason); nothing was added and a booking
	// the id had is released.
	StatusBlocked Status = 8
)

var statusNames = [...]string{"denied", "admitted", "duplicate", "done", "booked", "unknown", "expired", "dropped", "blocked"}

// String names the status, e.g. "booked".
func (s Status) String() string {
	if s >= 0 && int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("status(%d)", int(s))
}

// Decision is the limiter's answer to a check.
type Decision struct {
	// Status is what was decided; the booleans below restate it.
	Status Status
	// Allowed reports that the send may go: at At, which is Now unless
	// ReserveOptions.Horizon allowed a later instant (see Wait). True also
	// for a Duplicate.
	Allowed bool
	// Duplicate reports that the member was already admitted: nothing was
	// added, nothing counted twice.
	Duplicate bool
	// Done reports that MarkDone was recorded for the id: its work is
	// finished, Allowed is false and nothing was counted.
	Done bool
	// Booked reports that the id holds the slot at At. To keep it, ask again
	// a little before RetryAt with a Horizon longer than that lead: the
	// answer admits the id for At itself. Asked after At, the booking is
	// given back and the id placed anew from now, behind any bookings made
	// since (a recipient's later sends, for one).
	Booked bool
	// At is the slot: when the send is admitted (Allowed), booked (Booked),
	// or would fit (denied, expired). Redis time.
	At time.Time
	// Wait is At − Now: 0 for a send admitted now.
	Wait time.Duration
	// RetryAfter is -1 unless the check was denied or booked; then it is the
	// exact wait until the slot (for a plain denial: until the entry that has
	// to leave the window has left it).
	RetryAfter time.Duration
	// RetryAt is zero unless RetryAfter is set; then it is the host clock's
	// now (Options.Clock) plus RetryAfter — the moment to ask again, in the
	// clock of the process that asked.
	RetryAt time.Time
	// DeniedBy is the index, in the limits given, of the rule that set the
	// slot when it is later than now (denied, booked, admitted for later,
	// expired, dropped); otherwise -1.
	DeniedBy int
	// Remaining is the fewest further sends any rule takes around the slot,
	// booked slots counted as used.
	Remaining int
	// BlockValue is the block key's integer value, or the code of the
	// consent mark that blocks (StatusBlocked).
	BlockValue int64
	// BlockReason says what blocked (StatusBlocked): BlockedByKey, or the
	// consent mark's kind.
	BlockReason BlockReason
	// BlockedSince is when the consent mark that blocks was recorded; zero
	// for the block key.
	BlockedSince time.Time
	// Attempt numbers the id's admissions (Reserve): 1, or k+1 when an
	// earlier attempt k had an unknown outcome and was given a fresh slot.
	Attempt int
	// Now is the time the decision was taken at (Redis TIME unless Options.Now).
	Now time.Time
}

// RerunPolicy says how Reserve treats an id whose earlier attempt was
// admitted but neither marked done nor released: the send may or may not
// have happened.
type RerunPolicy string

// The re-run policies.
const (
	// AtLeastOnce gives the re-run a fresh slot in every window: if it sends
	// again, the second message counts like any other, so quotas hold over
	// every receipt, duplicates included.
	AtLeastOnce RerunPolicy = "f"
	// AtMostOnce answers StatusUnknown: the caller drops the send.
	AtMostOnce RerunPolicy = "o"
	// Idempotent answers StatusDuplicate: the re-run rides the earlier
	// admission (the textbook's idempotent member).
	Idempotent RerunPolicy = "d"
)

// Interval is a span of time [Start, End).
type Interval struct{ Start, End time.Time }

// ReserveOptions shape what Reserve may hand out.
type ReserveOptions struct {
	// Policy for an id admitted before and not finished; default AtLeastOnce.
	Policy RerunPolicy
	// Slack widens every window by this much: entries are kept Window+Slack
	// apart, so a send that reaches its provider up to Slack after its slot
	// still keeps every window of arrival times within its limit. Default 0.
	Slack time.Duration
	// Horizon: a slot at most this far ahead is admitted for that instant
	// (the caller waits and sends then) instead of being booked or denied.
	// Default 0: only now. On Redis Cluster, a check whose limits live in
	// several groups aims at an instant 20 ms ahead so that every group
	// holds it at the same time: it needs a Horizon of at least that.
	Horizon time.Duration
	// Book: a slot past Horizon is booked (StatusBooked) rather than denied.
	Book bool
	// NotBefore is the earliest slot (e.g. the end of quiet hours). Zero: now.
	NotBefore time.Time
	// Deadline is the latest slot: later, the answer is StatusExpired. Zero: none.
	Deadline time.Time
	// Closed are spans in which no slot may lie (quiet hours), sorted. At most 64.
	Closed []Interval
	// StateTTL is how long the id's admission record lives. Default (and
	// minimum) the longest window plus Slack, so an unfinished attempt is
	// known while its entry counts.
	StateTTL time.Duration
	// late: a NotBefore at most this far in the past is kept as the slot
	// (checks across Cluster groups agree on one instant).
	late time.Duration
	// Block, when set, is a key of the check's group whose existence blocks
	// the send (StatusBlocked), read in the same script call: a per-recipient
	// suppression list costs no extra round trip. Needs a state policy.
	Block string
	// Holds are hold keys (HoldKey) read in the same script call: a live
	// hold closes [now, its end) to every slot, so a provider's
	// back-pressure set by one worker (Hold) books every worker's sends
	// after it. On Redis Cluster they are read first, in their own slot.
	Holds []string
	// Consent, when set, is the recipient's suppression hash (consent
	// package), read in the same script call: it blocks the send
	// (StatusBlocked) as its marks say for the category. Needs a state policy.
	Consent *ConsentCheck
	// Note, when set, is written with the admission, in the same script
	// call: a record the caller needs before it sends (whom an SMS goes to)
	// costs no round trip. Its key must be in the check's group. Needs a
	// state policy.
	Note *Note
	// Nonce identifies the caller's run of this id (up to 32 bytes of
	// [A-Za-z0-9_-]): asking again with the nonce of an admission — a retry
	// after a lost reply — returns that admission instead of treating it as
	// an unknown outcome. Empty: every call is a new one.
	Nonce string
	// Seat, when set, is the check's place in a Cohort: it goes to Redis
	// with the other members' checks, in one call.
	Seat Seat
}

// ConsentCheck is what a check reads of the recipient's consent.
type ConsentCheck struct {
	// Key is the suppression hash of (tenant, channel, recipient), in the
	// check's group.
	Key string
	// Category is the send's category; Exempt whether the tenant declares it
	// one that an opt-out of every category lets through.
	Category string
	Exempt   bool
	// LastKey, when set, remembers Category as the one last admitted to the
	// recipient, for LastTTL (an opt-out by keyword then names it).
	LastKey string
	LastTTL time.Duration
}

// Note is a key written (SET, with TTL counted from the slot) when a check
// admits its send, and only then.
type Note struct {
	Key, Value string
	TTL        time.Duration
}

// BlockReason says what blocked a check (StatusBlocked).
type BlockReason int

// The reasons a check is blocked; the consent ones are consent.Reason's.
const (
	BlockedByKey         BlockReason = 0 // ReserveOptions.Block exists
	BlockedUndeliverable BlockReason = 1 // the recipient cannot take messages
	BlockedCategory      BlockReason = 2 // opted out of this category
	BlockedAll           BlockReason = 3 // opted out of every category, and this one is not exempt
)

func (d *Decision) fill(reply []int64, limits int, clock func() time.Time) error {
	st := Status(reply[0])
	rule, wait := int(reply[1]), reply[2]
	if rule < 0 || rule > limits || st < StatusDenied || st > StatusBlocked {
		return fmt.Errorf("unexpected reply %v", reply)
	}
	d.Status = st
	d.Remaining = int(reply[3])
	d.Attempt = int(reply[4])
	d.At = time.UnixMilli(reply[5])
	d.DeniedBy = rule - 1
	d.RetryAfter = -1
	switch st {
	case StatusAdmitted:
		d.Allowed = true
		d.Wait = time.Duration(wait) * time.Millisecond
	case StatusDuplicate:
		d.Allowed, d.Duplicate = true, true
		d.DeniedBy = -1
	case StatusDone:
		d.Done = true
		d.DeniedBy = -1
	case StatusDenied, StatusBooked:
		if wait < 1 {
			return fmt.Errorf("unexpected reply %v", reply)
		}
		d.Booked = st == StatusBooked
		d.Wait = time.Duration(wait) * time.Millisecond
		d.RetryAfter = d.Wait
		d.RetryAt = clock().Add(d.RetryAfter)
	case StatusExpired:
		d.Wait = time.Duration(wait) * time.Millisecond
	case StatusUnknown:
		d.DeniedBy = -1
	case StatusBlocked:
		d.DeniedBy = -1
		if len(reply) != 9 || reply[7] < 0 || reply[7] > int64(BlockedAll) {
			return fmt.Errorf("unexpected reply %v", reply)
		}
		d.BlockValue, d.BlockReason = reply[6], BlockReason(reply[7])
		if reply[8] > 0 {
			d.BlockedSince = time.UnixMilli(reply[8]).UTC()
		}
	}
	if d.Wait == 0 && d.DeniedBy >= 0 && st == StatusAdmitted {
		d.DeniedBy = -1
	}
	return nil
}
