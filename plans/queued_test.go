package plans_test

import (
	"testing"

	"github.com/sluicehq/sluice/plans"
)

// max-queued and max-queued-bytes parse, print back, and a tenant's own
// entry (in SLUICE_RULES or its plan) wins over the default one.
func TestQueuedCaps(t *testing.T) {
	p, err := plans.Parse("sms:tenant=10/1m, max-queued-bytes=1000000, acme/max-queued=500")
	if err != nil {
		t.Fatal(err)
	}
	if n, b, sn, sb := p.QueuedCaps("acme"); n != 500 || b != 1000000 || !sn || !sb {
		t.Fatalf("acme: %d %d %v %v", n, b, sn, sb)
	}
	if n, _, sn, _ := p.QueuedCaps("globex"); sn || n != 0 {
		t.Fatalf("globex has no max-queued of its own or by default: %d %v", n, sn)
	}
	again, err := plans.Parse(p.String())
	if err != nil || again.String() != p.String() {
		t.Fatalf("round trip: %q → %q, %v", p.String(), again.String(), err)
	}
	own, err := plans.Parse("max-queued=7")
	if err != nil {
		t.Fatal(err)
	}
	live, err := p.With("globex", own)
	if err != nil {
		t.Fatal(err)
	}
	if n, b, sn, sb := live.QueuedCaps("globex"); n != 7 || !sn || b != 1000000 || !sb {
		t.Fatalf("globex's plan: %d %d %v %v", n, b, sn, sb)
	}
	for _, bad := range []string{"max-queued", "max-queued=-1", "max-queued=lots", "acme/max-queued-bytes=1.5", "max-queued=1,max-queued=2"} {
		if _, err := plans.Parse(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
