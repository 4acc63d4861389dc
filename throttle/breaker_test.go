package throttle_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/throttle"
)

// testBreakers: failures open a breaker only when enough fall in one
// window; open, more failures change nothing; after the cooldown it is
// half-open and exactly one of many callers wins the probe; a failed probe
// opens it again with since kept; a success closes it; ProviderStates reads
// breakers and holds in one call; bad input is an error.
func testBreakers(t *testing.T, c redis.UniversalClient) {
	clock := newManualClock()
	lim, err := throttle.New(c, throttle.Options{Secret: testSecret, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	key := lim.BreakerKey("sms", fmt.Sprintf("p%d", time.Now().UnixNano()))
	p := throttle.BreakerPolicy{Failures: 3, Window: 10 * time.Second, Cooldown: 5 * time.Second}
	fail := func(what string, wantOpen bool) throttle.Breaker {
		t.Helper()
		b, err := lim.ProviderFailed(ctx, key, p)
		if err != nil || b.Open != wantOpen {
			t.Fatalf("%s: %+v, %v; want open %v", what, b, err, wantOpen)
		}
		return b
	}
	// Two failures, then the window ends: the third starts a new count.
	fail("1st", false)
	clock.Add(time.Second)
	fail("2nd", false)
	clock.Add(10 * time.Second)
	if b := fail("1st of a new window", false); b.Fails != 1 {
		t.Fatalf("a failure after the window counted %d", b.Fails)
	}
	fail("2nd", false)
	opened := clock.Now()
	b := fail("3rd within the window", true)
	if !b.Since.Equal(opened) || !b.Until.Equal(opened.Add(p.Cooldown)) {
		t.Fatalf("opened: %+v; want since %v until %v", b, opened, opened.Add(p.Cooldown))
	}
	clock.Add(time.Second)
	if b := fail("while open", true); !b.Until.Equal(opened.Add(p.Cooldown)) || !b.Since.Equal(opened) {
		t.Fatalf("a failure while open moved it: %+v", b)
	}
	if won, err := lim.TryProbe(ctx, key, time.Second); err != nil || won {
		t.Fatalf("a probe while open: %v, %v", won, err)
	}
	// Half-open: one winner of many.
	clock.Set(opened.Add(p.Cooldown))
	bs, _, err := lim.ProviderStates(ctx, []string{key}, nil)
	if err != nil || bs[0].Open || !bs[0].HalfOpen || !bs[0].Since.Equal(opened) {
		t.Fatalf("after the cooldown: %+v, %v; want half-open since %v", bs, err, opened)
	}
	for trial := range 3 {
		var wins atomic.Int32
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				won, err := lim.TryProbe(ctx, key, time.Second)
				if err != nil {
					t.Error(err)
				}
				if won {
					wins.Add(1)
				}
			}()
		}
		wg.Wait()
		if wins.Load() != 1 {
			t.Fatalf("trial %d: %d of 20 won the probe; want exactly 1", trial, wins.Load())
		}
		clock.Add(time.Second) // the probe's lease lapses: the next may go
	}
	// A probe given back (its send was booked for later): the next caller
	// wins at once, and only that one.
	if won, err := lim.TryProbe(ctx, key, time.Second); err != nil || !won {
		t.Fatalf("a probe after the lease: %v, %v", won, err)
	}
	if err := lim.GiveBackProbe(ctx, key); err != nil {
		t.Fatal(err)
	}
	if won, err := lim.TryProbe(ctx, key, time.Second); err != nil || !won {
		t.Fatalf("a probe after one was given back: %v, %v", won, err)
	}
	if won, _ := lim.TryProbe(ctx, key, time.Second); won {
		t.Fatal("two probes live after one was given back")
	}
	clock.Add(time.Second)
	// A failed probe opens it again, since kept.
	b = fail("the probe's failure", true)
	if !b.Since.Equal(opened) || !b.Until.Equal(clock.Now().Add(p.Cooldown)) {
		t.Fatalf("re-opened: %+v; want since %v until %v", b, opened, clock.Now().Add(p.Cooldown))
	}
	// A success closes it.
	clock.Add(p.Cooldown)
	if won, err := lim.TryProbe(ctx, key, time.Second); err != nil || !won {
		t.Fatalf("the second probe: %v, %v", won, err)
	}
	if err := lim.ProviderRecovered(ctx, key); err != nil {
		t.Fatal(err)
	}
	hold, unheld := lim.HoldKey("sms:provider", key), lim.HoldKey("sms:provider", key+"-none")
	h, err := lim.Hold(ctx, hold, 0, 7*time.Second, time.Second, time.Minute, 429)
	if err != nil {
		t.Fatal(err)
	}
	bs, hs, err := lim.ProviderStates(ctx, []string{key, ""}, []string{hold, unheld})
	if err != nil || bs[0] != (throttle.Breaker{}) || bs[1] != (throttle.Breaker{}) {
		t.Fatalf("closed: %+v, %v", bs, err)
	}
	if !hs[0].Until.Equal(h.Until) || !hs[0].Since.Equal(clock.Now()) || !hs[1].Until.IsZero() {
		t.Fatalf("holds: %+v; want the first until %v since %v, the second none", hs, h.Until, clock.Now())
	}
	if won, _ := lim.TryProbe(ctx, key, time.Second); won {
		t.Fatal("a probe of a closed breaker")
	}
	if err := lim.GiveBackProbe(ctx, key); err != nil {
		t.Fatal(err)
	}
	if bs, _, err := lim.ProviderStates(ctx, []string{key}, nil); err != nil || bs[0] != (throttle.Breaker{}) {
		t.Fatalf("a closed breaker after a probe given back: %+v, %v", bs, err)
	}
	// Bad input.
	for _, bad := range []throttle.BreakerPolicy{{}, {Failures: 1, Window: time.Second}, {Failures: 1, Cooldown: time.Second}, {Failures: 1, Window: -time.Second, Cooldown: time.Second}} {
		if _, err := lim.ProviderFailed(ctx, key, bad); !errors.Is(err, throttle.ErrInvalidRule) {
			t.Errorf("policy %+v: %v", bad, err)
		}
	}
	if _, err := lim.ProviderFailed(ctx, hold, p); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Errorf("a hold key as a breaker: %v", err)
	}
	if _, _, err := lim.ProviderStates(ctx, []string{"x"}, nil); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Errorf("a foreign breaker key: %v", err)
	}
	if _, err := lim.TryProbe(ctx, key, 0); !errors.Is(err, throttle.ErrInvalidRule) {
		t.Errorf("a probe lease of 0: %v", err)
	}
}
