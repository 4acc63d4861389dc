package throttle_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

// At most Max holders at once; a renewal keeps a slot, Free returns it, a
// lapsed lease comes back by itself; all caps or none.
func TestInFlightCaps(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	prov := throttle.Cap{Scope: "sms:provider", Group: "shared", Max: 2}
	sndr := throttle.Cap{Scope: "sms:sender", Subject: "+15005550006", Group: "shared", Max: 3}
	ttl := 10 * time.Second
	for i := range 2 {
		if l, err := b.lim.Acquire(ctx, b.group, fmt.Sprint("h", i), ttl, prov, sndr); err != nil || !l.Granted {
			t.Fatalf("holder %d: %+v, %v", i, l, err)
		}
	}
	l, err := b.lim.Acquire(ctx, b.group, "h2", ttl, sndr, prov)
	if err != nil || l.Granted || l.Full != 1 || !l.Lapse.Equal(b.clock.Now().Add(ttl)) {
		t.Fatalf("third holder: %+v, %v", l, err)
	}
	// All or none: the sender cap took nothing for h2.
	if n := b.client.ZCard(ctx, mustCapKey(t, b, sndr)).Val(); n != 2 {
		t.Fatalf("sender cap holds %d leases", n)
	}
	b.clock.Add(5 * time.Second)
	if l, _ := b.lim.Acquire(ctx, b.group, "h0", ttl, prov, sndr); !l.Granted { // a renewal
		t.Fatalf("renewal refused: %+v", l)
	}
	if err := b.lim.Free(ctx, b.group, "h1", prov, sndr); err != nil {
		t.Fatal(err)
	}
	if l, _ := b.lim.Acquire(ctx, b.group, "h2", ttl, prov, sndr); !l.Granted {
		t.Fatalf("after a free: %+v", l)
	}
	// h0 and h2 hold the provider; h0's renewed lease lapses at +15 s, h2's at +15 s.
	b.clock.Add(ttl + time.Millisecond)
	for _, h := range []string{"h3", "h4"} {
		if l, _ := b.lim.Acquire(ctx, b.group, h, ttl, prov); !l.Granted {
			t.Fatalf("%s after the leases lapsed: %+v", h, l)
		}
	}
}

func mustCapKey(t *testing.T, b *testBundle, c throttle.Cap) string {
	t.Helper()
	k, err := b.lim.CapKey(b.group, c)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Many goroutines competing for a cap of 3: never more than 3 hold it.
func TestInFlightCapsConcurrent(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	c := throttle.Cap{Scope: "sms:provider", Group: "shared", Max: 3}
	var in, peak, done atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; done.Load() < 300; i++ {
				h := fmt.Sprintf("g%d-%d", g, i)
				l, err := b.lim.Acquire(ctx, b.group, h, 5*time.Second, c)
				if err != nil {
					t.Error(err)
					return
				}
				if !l.Granted {
					continue
				}
				n := in.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				in.Add(-1) // leave before freeing: the count never runs ahead of the leases
				if err := b.lim.Free(ctx, b.group, h, c); err != nil {
					t.Error(err)
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if p := peak.Load(); p > 3 || p < 1 {
		t.Fatalf("peak %d holders of a cap of 3", p)
	}
	t.Logf("300 leases, peak %d at once", peak.Load())
}

// On a Cluster, caps in several groups are taken one group at a time, all or none.
func TestInFlightCapsCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Cluster")
	}
	t.Parallel()
	_, cc := redistest.NewCluster(t, 3, 0)
	lim, err := throttle.New(cc, throttle.Options{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	shared := throttle.Cap{Scope: "sms:provider", Group: "shared", Max: 1}
	own := throttle.Cap{Scope: "sms:tenant", Max: 2}
	if l, err := lim.Acquire(ctx, "acme", "a", time.Minute, own, shared); err != nil || !l.Granted {
		t.Fatalf("first: %+v, %v", l, err)
	}
	l, err := lim.Acquire(ctx, "acme", "b", time.Minute, own, shared)
	if err != nil || l.Granted || l.Full != 1 {
		t.Fatalf("second: %+v, %v", l, err)
	}
	// b took nothing in acme's group either: a third holder still fits there alone.
	if l, _ := lim.Acquire(ctx, "acme", "c", time.Minute, own); !l.Granted {
		t.Fatalf("acme's cap kept b's slot: %+v", l)
	}
}
