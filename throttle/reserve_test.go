package throttle_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

func reserveOpts() throttle.ReserveOptions {
	return throttle.ReserveOptions{Book: true, Horizon: 2 * time.Second}
}

// A booked slot is the earliest at which the rule keeps its window; asking
// again from about then admits the id; a slot within the horizon is admitted
// for that instant.
func TestReserveBooksAndAdmits(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 2, Window: 10 * time.Second})
	t0 := b.clock.Now()
	for _, id := range []string{"a", "b"} {
		d, err := b.lim.Reserve(ctx, b.group, id, reserveOpts(), lim)
		if err != nil || d.Status != throttle.StatusAdmitted || d.Wait != 0 || d.Attempt != 1 {
			t.Fatalf("%s: %+v %v", id, d, err)
		}
	}
	want := map[string]time.Duration{"c": 10001 * time.Millisecond, "d": 10001 * time.Millisecond, "e": 20002 * time.Millisecond}
	for _, id := range []string{"c", "d", "e"} {
		d, err := b.lim.Reserve(ctx, b.group, id, reserveOpts(), lim)
		if err != nil || d.Status != throttle.StatusBooked || d.RetryAfter != want[id] || d.DeniedBy != 0 || !d.At.Equal(t0.Add(want[id])) {
			t.Fatalf("%s: %+v %v; want booked in %v", id, d, err, want[id])
		}
	}
	u, _ := b.lim.Usage(ctx, b.group, 0, lim)
	if u[0].Used != 2 || u[0].Booked != 3 || !u[0].NextFree.Equal(t0.Add(20002*time.Millisecond)) {
		t.Fatalf("usage %+v", u[0])
	}
	// c wakes 1.5 s before its slot: admitted for the slot itself (within the horizon).
	b.clock.Set(t0.Add(8501 * time.Millisecond))
	d, _ := b.lim.Reserve(ctx, b.group, "c", reserveOpts(), lim)
	if d.Status != throttle.StatusAdmitted || d.Wait != 1500*time.Millisecond || !d.At.Equal(t0.Add(10001*time.Millisecond)) {
		t.Fatalf("c early: %+v", d)
	}
	// d wakes 5 s early: beyond the horizon, it keeps its booking.
	b.clock.Set(t0.Add(5001 * time.Millisecond))
	if d, _ := b.lim.Reserve(ctx, b.group, "d", reserveOpts(), lim); d.Status != throttle.StatusBooked || !d.At.Equal(t0.Add(10001*time.Millisecond)) {
		t.Fatalf("d early: %+v", d)
	}
	// a newcomer cannot take a place before the bookings: the slot after e.
	if d, _ := b.lim.Reserve(ctx, b.group, "f", reserveOpts(), lim); d.Status != throttle.StatusBooked || !d.At.Equal(t0.Add(20002*time.Millisecond)) {
		t.Fatalf("f: %+v", d)
	}
	// Release of a booking gives the place back.
	if n, err := b.lim.Release(ctx, b.group, "e", 1, lim); n != 1 || err != nil {
		t.Fatalf("release e: %d %v", n, err)
	}
	if d, _ := b.lim.Reserve(ctx, b.group, "g", reserveOpts(), lim); d.Status != throttle.StatusBooked || !d.At.Equal(t0.Add(20002*time.Millisecond)) {
		t.Fatalf("g takes e's place: %+v", d)
	}
}

// A rule far from its limit does not move a slot, whatever its bookings.
func TestReserveNonBindingRuleDoesNotDelay(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	tenant := throttle.Limit{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 10, Window: 10 * time.Second}}
	rcpt := func(i int) throttle.Limit {
		return throttle.Limit{Scope: "sms:recipient", Subject: string(rune('a' + i)), Rule: throttle.Rule{Limit: 1, Window: 6 * time.Second}}
	}
	t0 := b.clock.Now()
	// 4 recipients × 3 sends: each recipient's sends go at 0, 6, 12 s; the
	// tenant key fills with 12 entries (more than its limit of 10) but no
	// 10 s span ever holds more than 8.
	for i := 0; i < 4; i++ {
		for j := 0; j < 3; j++ {
			d, err := b.lim.Reserve(ctx, b.group, string(rune('a'+i))+string(rune('0'+j)), reserveOpts(), rcpt(i), tenant)
			if err != nil {
				t.Fatal(err)
			}
			want := t0.Add(time.Duration(j) * 6001 * time.Millisecond)
			if !d.At.Equal(want) {
				t.Fatalf("recipient %d send %d: slot %v, want %v (%+v)", i, j, d.At.Sub(t0), want.Sub(t0), d)
			}
		}
	}
}

// The re-run of an id admitted and neither done nor released: at-least-once
// takes a fresh slot (the first keeps counting); at-most-once reports
// unknown; done answers done.
func TestReserveRerunPolicies(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 2, Window: time.Minute})
	o := reserveOpts()
	d1, _ := b.lim.Reserve(ctx, b.group, "x", o, lim)
	d2, _ := b.lim.Reserve(ctx, b.group, "x", o, lim)
	if d1.Attempt != 1 || d2.Status != throttle.StatusAdmitted || d2.Attempt != 2 {
		t.Fatalf("fresh re-run: %+v then %+v", d1, d2)
	}
	if n := b.client.ZCard(ctx, b.key(t, lim)).Val(); n != 2 {
		t.Fatalf("window holds %d entries, want both attempts", n)
	}
	// The window is now full: a third attempt books.
	if d, _ := b.lim.Reserve(ctx, b.group, "x", o, lim); d.Status != throttle.StatusBooked || d.Attempt != 3 {
		t.Fatalf("third attempt: %+v", d)
	}
	o.Policy = throttle.AtMostOnce
	b.lim.Reserve(ctx, b.group, "y", throttle.ReserveOptions{}, recipient(throttle.PerMinute(5)))
	if d, _ := b.lim.Reserve(ctx, b.group, "y", o, recipient(throttle.PerMinute(5))); d.Status != throttle.StatusUnknown || d.Allowed {
		t.Fatalf("at-most-once re-run: %+v", d)
	}
	// Release of attempt 2 after a fresh re-run rolls back to attempt 1 (still unknown).
	lim5 := recipient(throttle.Rule{Limit: 5, Window: time.Hour})
	b.lim.Reserve(ctx, b.group, "z", reserveOpts(), lim5)
	d, _ := b.lim.Reserve(ctx, b.group, "z", reserveOpts(), lim5)
	if n, _ := b.lim.Release(ctx, b.group, "z", d.Attempt, lim5); n != 1 {
		t.Fatalf("release of attempt 2 removed %d", n)
	}
	if d, _ := b.lim.Reserve(ctx, b.group, "z", throttle.ReserveOptions{Policy: throttle.AtMostOnce}, lim5); d.Status != throttle.StatusUnknown {
		t.Fatalf("after releasing the fresh attempt: %+v", d)
	}
	if d, _ := b.lim.Reserve(ctx, b.group, "z", reserveOpts(), lim5); d.Attempt != 2 {
		t.Fatalf("next fresh attempt: %+v", d)
	}
	// Done wins over everything and keeps its TTL.
	if err := b.lim.MarkDone(ctx, b.group, "z", 2, time.Hour); err != nil {
		t.Fatal(err)
	}
	b.clock.Add(2 * time.Hour) // the windows forgot z; the done record did not (it is a real TTL)
	if d, _ := b.lim.Reserve(ctx, b.group, "z", reserveOpts(), lim5); d.Status != throttle.StatusDone {
		t.Fatalf("after MarkDone: %+v", d)
	}
	if pttl := b.client.PTTL(ctx, b.lim.StateKey(b.group, "z")).Val(); pttl <= 59*time.Minute {
		t.Fatalf("done record PTTL %v", pttl)
	}
	// Releasing attempt 1 of a plain admission forgets it: the id is new again.
	b.lim.Reserve(ctx, b.group, "w", reserveOpts(), lim5)
	b.lim.Release(ctx, b.group, "w", 1, lim5)
	if d, _ := b.lim.Reserve(ctx, b.group, "w", throttle.ReserveOptions{Policy: throttle.AtMostOnce}, lim5); d.Status != throttle.StatusAdmitted || d.Attempt != 1 {
		t.Fatalf("after release: %+v", d)
	}
}

// A slot past the deadline expires and lets go of the booking; a full drop
// rule drops; nothing is placed inside a closed span or before NotBefore.
func TestReserveDeadlineDropClosed(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 1, Window: time.Minute})
	t0 := b.clock.Now()
	b.lim.Reserve(ctx, b.group, "a", reserveOpts(), lim)
	o := reserveOpts()
	o.Deadline = t0.Add(30 * time.Second)
	d, _ := b.lim.Reserve(ctx, b.group, "b", o, lim)
	if d.Status != throttle.StatusExpired || d.Allowed || !d.At.Equal(t0.Add(time.Minute+time.Millisecond)) {
		t.Fatalf("past the deadline: %+v", d)
	}
	if n := b.client.ZCard(ctx, b.key(t, lim)).Val(); n != 1 {
		t.Fatalf("an expired send left %d entries", n)
	}
	// A booking that expires on wake is released.
	d, _ = b.lim.Reserve(ctx, b.group, "c", reserveOpts(), lim)
	if d.Status != throttle.StatusBooked {
		t.Fatalf("c: %+v", d)
	}
	o.Deadline = t0.Add(time.Second)
	b.clock.Add(2 * time.Second)
	// c's own booking is taken back first, so its slot is unchanged and past the deadline.
	if d, _ := b.lim.Reserve(ctx, b.group, "c", o, lim); d.Status != throttle.StatusExpired {
		t.Fatalf("c with a deadline before its slot: %+v", d)
	}
	if n := b.client.ZCard(ctx, b.key(t, lim)).Val(); n != 1 {
		t.Fatalf("expired booking kept: %d entries", n)
	}
	if b.client.Exists(ctx, b.lim.StateKey(b.group, "c")).Val() != 0 {
		t.Fatal("expired booking kept its state")
	}

	drop := lim
	drop.Drop = true
	if d, _ := b.lim.Reserve(ctx, b.group, "e", reserveOpts(), drop); d.Status != throttle.StatusDropped || d.DeniedBy != 0 {
		t.Fatalf("drop rule full: %+v", d)
	}
	other := recipient(throttle.Rule{Limit: 1, Window: time.Hour})
	other.Subject = "+14155550111"
	other.Drop = true
	if d, _ := b.lim.Reserve(ctx, b.group, "f", reserveOpts(), other); d.Status != throttle.StatusAdmitted {
		t.Fatalf("drop rule with room: %+v", d)
	}

	q := recipient(throttle.PerMinute(100))
	q.Subject = "+14155550122"
	o = reserveOpts()
	now := b.clock.Now()
	o.Closed = []throttle.Interval{{Start: now.Add(-time.Hour), End: now.Add(3 * time.Hour)}}
	if d, _ := b.lim.Reserve(ctx, b.group, "g", o, q); d.Status != throttle.StatusBooked || !d.At.Equal(now.Add(3*time.Hour)) {
		t.Fatalf("inside a closed span: %+v", d)
	}
	o = reserveOpts()
	o.NotBefore = now.Add(time.Second)
	if d, _ := b.lim.Reserve(ctx, b.group, "h", o, q); d.Status != throttle.StatusAdmitted || d.Wait != time.Second {
		t.Fatalf("not before +1s: %+v", d)
	}
}

func TestReserveBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.PerMinute(1))
	for name, o := range map[string]throttle.ReserveOptions{
		"Policy":  {Policy: "x"},
		"Slack":   {Slack: -1},
		"Horizon": {Horizon: 2 * time.Hour},
		"Closed":  {Closed: []throttle.Interval{{Start: time.Unix(10, 0), End: time.Unix(5, 0)}}},
	} {
		if _, err := b.lim.Reserve(ctx, b.group, "m", o, lim); !errors.Is(err, throttle.ErrInvalidRule) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := b.lim.Reserve(ctx, b.group, "a#2", throttle.ReserveOptions{}, lim); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Errorf("member with '#': %v", err)
	}
	if err := b.lim.MarkDone(ctx, b.group, "m", 0, time.Hour); !errors.Is(err, throttle.ErrInvalidRule) {
		t.Errorf("attempt 0: %v", err)
	}
	// A state key holding something else fails that call only, with a clear error.
	b.client.Set(ctx, b.lim.StateKey(b.group, "bad"), "garbage", time.Minute)
	if _, err := b.lim.Reserve(ctx, b.group, "bad", throttle.ReserveOptions{}, lim); err == nil {
		t.Error("garbage state accepted")
	}
	if keys := b.client.Keys(ctx, "sl1:*:sms*").Val(); len(keys) != 0 {
		t.Fatalf("bad input wrote keys: %v", keys)
	}
}

// A call retried after its reply was lost (same nonce) gets its own
// admission back; another run of the id (another nonce) is an unknown outcome.
func TestReserveNonceMakesRetriesIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 1, Window: time.Minute})
	o := reserveOpts()
	o.Nonce = "run-1"
	d1, _ := b.lim.Reserve(ctx, b.group, "x", o, lim)
	b.clock.Add(10 * time.Millisecond)
	d2, err := b.lim.Reserve(ctx, b.group, "x", o, lim)
	if err != nil || d1.Status != throttle.StatusAdmitted || d2.Status != throttle.StatusAdmitted || d2.Attempt != 1 || !d2.At.Equal(d1.At) {
		t.Fatalf("retry with the same nonce: %+v then %+v %v", d1, d2, err)
	}
	if n := b.client.ZCard(ctx, b.key(t, lim)).Val(); n != 1 {
		t.Fatalf("the retry counted again: %d entries", n)
	}
	o.Nonce = "run-2"
	o.Policy = throttle.AtMostOnce
	if d, _ := b.lim.Reserve(ctx, b.group, "x", o, lim); d.Status != throttle.StatusUnknown {
		t.Fatalf("another run: %+v", d)
	}
	o.Nonce = "a:b"
	if _, err := b.lim.Reserve(ctx, b.group, "y", o, lim); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Fatalf("bad nonce: %v", err)
	}
}

// A block key that exists stops the send in the same call: nothing is
// counted, a booking the id held is released, and the key's value comes back.
func TestReserveBlockKey(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 1, Window: time.Minute})
	block := b.lim.SubjectKey(b.group, "suppressed:sms", "+14155550100")
	o := reserveOpts()
	o.Block = block
	if d, _ := b.lim.Reserve(ctx, b.group, "a", o, lim); d.Status != throttle.StatusAdmitted {
		t.Fatalf("not blocked yet: %+v", d)
	}
	if d, _ := b.lim.Reserve(ctx, b.group, "c", o, lim); d.Status != throttle.StatusBooked {
		t.Fatalf("c books: %+v", d)
	}
	b.client.Set(ctx, block, "21211", time.Hour)
	d, err := b.lim.Reserve(ctx, b.group, "c", o, lim)
	if err != nil || d.Status != throttle.StatusBlocked || d.BlockValue != 21211 || d.Allowed {
		t.Fatalf("blocked: %+v %v", d, err)
	}
	if n := b.client.ZCard(ctx, b.key(t, lim)).Val(); n != 1 {
		t.Fatalf("the blocked id kept its booking: %d entries", n)
	}
	if _, err := b.lim.Allow(ctx, b.group, "x", lim); err != nil {
		t.Fatal(err)
	}
	if _, err := b.lim.Reserve(ctx, b.group, "y", throttle.ReserveOptions{Policy: throttle.AtLeastOnce, Block: block}, lim); err != nil {
		t.Fatal(err)
	}
}

// A send booked at one provider and then placed at another (its provider
// failed over) leaves its booking in the first provider's window; Forget
// takes it out — the place is free for the next send there — and leaves
// the send's record, which now holds its admission at the other provider.
// A bucketed rule is left as it is. Release, by contrast, rolls the record
// back.
func TestForgetFreesABookingElsewhereAndKeepsTheRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	at := func(p string) throttle.Limit {
		return throttle.Limit{Scope: "sms:provider", Subject: p, Rule: throttle.Rule{Limit: 1, Window: 10 * time.Second}}
	}
	primary, backup := at("primary"), at("backup")
	bucketed := throttle.Limit{Scope: "sms:sender", Subject: "primary", Rule: throttle.Rule{Limit: 5, Window: 10 * time.Second, Buckets: 10}}
	t0 := b.clock.Now()
	if d, err := b.lim.Reserve(ctx, b.group, "x", reserveOpts(), primary, bucketed); err != nil || d.Status != throttle.StatusAdmitted {
		t.Fatalf("x: %+v %v", d, err)
	}
	if d, err := b.lim.Reserve(ctx, b.group, "m", reserveOpts(), primary, bucketed); err != nil || d.Status != throttle.StatusBooked || !d.At.Equal(t0.Add(10001*time.Millisecond)) {
		t.Fatalf("m at the primary: %+v %v", d, err)
	}
	// m fails over: placed at the backup, admitted now.
	d, err := b.lim.Reserve(ctx, b.group, "m", reserveOpts(), backup)
	if err != nil || d.Status != throttle.StatusAdmitted || d.Attempt != 1 {
		t.Fatalf("m at the backup: %+v %v", d, err)
	}
	if u, _ := b.lim.Usage(ctx, b.group, 0, primary); u[0].Booked != 1 {
		t.Fatalf("before Forget the primary holds m's booking: %+v", u[0])
	}
	if n, err := b.lim.Forget(ctx, b.group, "m", d.Attempt, primary, bucketed); n != 1 || err != nil {
		t.Fatalf("forget: %d %v; want 1 (the log's entry; the bucketed rule is left)", n, err)
	}
	if u, _ := b.lim.Usage(ctx, b.group, 0, primary); u[0].Booked != 0 || u[0].Used != 1 {
		t.Fatalf("after Forget: %+v", u[0])
	}
	// The place m held at the primary is the next send's.
	if d, _ := b.lim.Reserve(ctx, b.group, "n", reserveOpts(), primary); d.Status != throttle.StatusBooked || !d.At.Equal(t0.Add(10001*time.Millisecond)) {
		t.Fatalf("n: %+v; want m's old place", d)
	}
	// m's record still holds its admission at the backup: asked again it is
	// an unknown outcome (at least once: attempt 2), not a first attempt.
	if d, _ := b.lim.Reserve(ctx, b.group, "m", reserveOpts(), backup); d.Attempt != 2 {
		t.Fatalf("m asked again: %+v; want attempt 2 (its record kept)", d)
	}
	if _, err := b.lim.Forget(ctx, b.group, "m#", 1, primary); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Fatalf("a member with '#': %v", err)
	}
}
