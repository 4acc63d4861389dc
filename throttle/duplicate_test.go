package throttle_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// Allow answers a member already in any of its windows as a duplicate —
// whether the windows have room or not — also when the check's limits
// changed since (a plan change between a call and its retry), and counts it
// nowhere twice. An admission learns of a duplicate from its ZADD NX and
// takes back what it added; every other answer asks first.
func TestAllowDuplicateAcrossChangedLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	a := recipient(throttle.Rule{Limit: 5, Window: time.Minute})
	long := throttle.Limit{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 5, Window: time.Hour}}
	full := throttle.Limit{Scope: "sms:full", Rule: throttle.Rule{Limit: 1, Window: time.Minute}}
	check := func(m string, want throttle.Status, limits ...throttle.Limit) {
		t.Helper()
		d, err := b.lim.Allow(ctx, b.group, m, limits...)
		if err != nil {
			t.Fatal(err)
		}
		if d.Status != want {
			t.Fatalf("%s: %s, want %s", m, d.Status, want)
		}
	}
	holds := func(lim throttle.Limit, m string) bool {
		t.Helper()
		_, ok := snapshot(t, b.client, b.key(t, lim))[m]
		return ok
	}
	// In the shorter window only; asked again with a longer one added (first and last).
	check("m1", throttle.StatusAdmitted, a)
	check("m1", throttle.StatusDuplicate, long, a)
	check("m1", throttle.StatusDuplicate, a, long)
	if holds(long, "m1") {
		t.Fatal("a duplicate left an entry in the window it was not admitted to")
	}
	// In the longer window only.
	check("m2", throttle.StatusAdmitted, long)
	check("m2", throttle.StatusDuplicate, a, long)
	if holds(a, "m2") {
		t.Fatal("a duplicate's ZADD was not taken back")
	}
	// A full window: the duplicate is answered before the denial.
	check("m3", throttle.StatusAdmitted, full)
	check("m3", throttle.StatusDuplicate, full)
	check("m4", throttle.StatusDenied, full)
	check("m3", throttle.StatusDuplicate, a, full)
	if holds(a, "m3") {
		t.Fatal("a denied duplicate was added")
	}
	if n := len(snapshot(t, b.client, b.key(t, a))); n != 1 {
		t.Fatalf("window a holds %d entries, want 1 (m1)", n)
	}
}

// A duplicate answered by an admission's adds changes nothing: the windows it
// was added to before finding the member are as they were, TTLs included.
func TestAllowDuplicateChangesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	a := recipient(throttle.Rule{Limit: 5, Window: time.Minute})
	long := throttle.Limit{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 5, Window: time.Hour}}
	if d, err := b.lim.Allow(ctx, b.group, "other", a); err != nil || d.Status != throttle.StatusAdmitted {
		t.Fatalf("%v %v", d.Status, err)
	}
	if d, err := b.lim.Allow(ctx, b.group, "m", long); err != nil || d.Status != throttle.StatusAdmitted {
		t.Fatalf("%v %v", d.Status, err)
	}
	ka := b.key(t, a)
	before := snapshot(t, b.client, ka)
	// A TTL shorter than an admission sets: an add's PEXPIRE … GT would lengthen it.
	const short = 5 * time.Second
	if err := b.client.PExpire(ctx, ka, short).Err(); err != nil {
		t.Fatal(err)
	}
	d, err := b.lim.Allow(ctx, b.group, "m", a, long)
	if err != nil || d.Status != throttle.StatusDuplicate {
		t.Fatalf("%v %v, want duplicate", d.Status, err)
	}
	after := snapshot(t, b.client, ka)
	if len(after) != len(before) || after["other"] != before["other"] {
		t.Fatalf("window a changed: %v, was %v", after, before)
	}
	if got := b.client.PTTL(ctx, ka).Val(); got > short {
		t.Fatalf("a duplicate moved a's TTL on: %v, was %v", got, short)
	}
	// A member in neither window, in a check whose only log key is new: nothing left behind.
	fresh := throttle.Limit{Scope: "sms:fresh", Rule: throttle.Rule{Limit: 5, Window: time.Minute}}
	if d, err := b.lim.Allow(ctx, b.group, "m", fresh, long); err != nil || d.Status != throttle.StatusDuplicate {
		t.Fatalf("%v %v, want duplicate", d.Status, err)
	}
	if n := b.client.Exists(ctx, b.key(t, fresh)).Val(); n != 0 {
		t.Fatal("a duplicate left a new window key behind")
	}
}

// Two limits of one key in a check are the same window: the second add finds
// the member the first put there, and the check is admitted, not a duplicate.
func TestAllowSameKeyTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	a := recipient(throttle.Rule{Limit: 5, Window: time.Minute})
	d, err := b.lim.Allow(ctx, b.group, "m", a, a)
	if err != nil || d.Status != throttle.StatusAdmitted {
		t.Fatalf("%v %v, want admitted", d.Status, err)
	}
	if got := snapshot(t, b.client, b.key(t, a)); len(got) != 1 {
		t.Fatalf("window holds %v, want the one entry", got)
	}
	if d, err := b.lim.Allow(ctx, b.group, "m", a, a); err != nil || d.Status != throttle.StatusDuplicate {
		t.Fatalf("asked again: %v %v, want duplicate", d.Status, err)
	}
}
