package e2e

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/testkit/fakes"
)

// sms:provider:concurrency=3 over two workers of 8 tasks each, the provider
// answering each request after 300 ms: never more than 3 requests at once at
// the provider — also after one worker is killed -9 with a send in flight
// (its lease lapses within SLUICE_ORPHAN_AFTER and the survivor gets the
// slot back) — and every notification delivered, repeated only if it was in
// flight at the kill.
func TestInFlightCapAcrossWorkers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:tenant=100000/1h, sms:provider:concurrency=3")
	e.sms.SetLatency(300 * time.Millisecond)
	w0 := e.worker("w0", map[string]string{"SLUICE_SMS_FROM": "+15005550010"})
	e.worker("w1", map[string]string{"SLUICE_SMS_FROM": "+15005550011"})
	ids := e.enqueueSMS(60, recipients(10), []string{"acme"})
	e.sms.WaitFor(t, time.Minute, "a send of w0 in flight after 10 deliveries", func(ds []fakes.Delivery) bool {
		return len(ds) >= 10 && e.sms.InFlightFrom("+15005550010") > 0
	})
	inFlight := e.sms.InFlightFrom("+15005550010")
	killed := time.Now()
	w0.kill()
	ds := e.waitAllDelivered(ids, 2*time.Minute)
	seen := map[string]int{}
	var after []time.Time
	for _, d := range ds {
		seen[d.ID]++
		if d.At.After(killed) && d.From == "+15005550011" {
			after = append(after, d.At)
		}
	}
	// A send in flight at the kill reached the provider with no done record:
	// at-least-once sends it again (a real provider dedupes it by its
	// Idempotency-Key). Only those repeat: at most the cap's 3, each first
	// delivered by the killed worker around the kill.
	repeats := 0
	first := map[string]fakes.Delivery{}
	for _, d := range ds {
		if _, ok := first[d.ID]; !ok {
			first[d.ID] = d
		}
	}
	for id, k := range seen {
		if k == 1 {
			continue
		}
		repeats += k - 1
		if f := first[id]; f.From != "+15005550010" || f.At.Before(killed.Add(-time.Second)) {
			t.Fatalf("%s repeated, first sent by %s at %v before the kill", id, f.From, killed.Sub(f.At))
		}
	}
	if repeats > 3 || len(seen) != len(ids) {
		t.Fatalf("%d of %d delivered, %d repeats (%d of w0's sends in flight just before the kill)", len(seen), len(ids), repeats, inFlight)
	}
	if p := e.sms.PeakInFlight(); p > 3 || p < 2 {
		t.Fatalf("peak %d requests at once at the provider; the cap is 3 (and two workers reach it)", p)
	}
	if len(after) == 0 {
		t.Fatal("the surviving worker sent nothing after the kill")
	}
	t.Logf("peak %d in flight (cap 3), %d delivered (%d repeats of %d in flight at the kill), the survivor sent %d after the kill (last %v after it)",
		e.sms.PeakInFlight(), len(seen), repeats, inFlight, len(after), after[len(after)-1].Sub(killed).Round(time.Millisecond))
}

// At the default settings, two workers drain a paced backlog through a
// provider that takes 300 ms per request: the sends admitted for near slots
// wait in the workers (up to MAX_WAITERS) and wake together, and the
// provider still never has more of a worker's requests at once than its
// CONCURRENCY (10): 20 in all. Every notification is delivered once.
func TestProviderRequestsBoundedByConcurrency(t *testing.T) {
	// Not parallel: it runs alone, before the parallel tests start, so its
	// load (two workers each) does not starve the fault and soak tests'
	// audits, which allow no tolerance beyond the send slack (a run with it
	// beside them saw receipts 234 ms late), nor they its timing.
	const bound = 2 * 10 // two workers × SLUICE_CONCURRENCY's default
	e := newEnv(t, "sms:tenant=100/1s")
	e.sms.SetLatency(300 * time.Millisecond)
	e.worker("w0", nil)
	e.worker("w1", nil)
	ids := e.enqueueSMS(300, recipients(60), []string{"acme"})
	ds := e.waitAllDelivered(ids, 2*time.Minute)
	seen := map[string]int{}
	for _, d := range ds {
		seen[d.ID]++
	}
	peak := e.sms.PeakInFlight()
	t.Logf("peak %d requests at once at the provider (bound %d), %d delivered, %d receipts", peak, bound, len(seen), len(ds))
	if peak > bound {
		t.Errorf("peak %d requests at once at the provider; two workers at SLUICE_CONCURRENCY=10 may have %d", peak, bound)
	}
	if len(seen) != len(ids) || len(ds) != len(ids) {
		t.Errorf("%d of %d delivered, %d receipts", len(seen), len(ids), len(ds))
	}
}
