package throttle_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// Allow answers a member already in any of its windows as a duplicate —
// whether the windows have room or not — also when the check's limits
// changed since (a plan change between a call and its retry), and counts it
// nowhere twice. (Kept from trying to answer duplicates from ZADD NX, which
// must then take back what it added: it did not lower Redis CPU, round 3.)
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
