package throttle_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

func testHolds(t *testing.T, c redis.UniversalClient) {
	clock := newManualClock()
	lim, err := throttle.New(c, throttle.Options{Secret: testSecret, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	group := fmt.Sprintf("h-%d", time.Now().UnixNano())
	key := lim.HoldKey("sms:provider", "")
	rate := throttle.Limit{Scope: "sms:recipient", Subject: "+14155550100", Rule: throttle.Rule{Limit: 100, Window: time.Minute}}
	o := throttle.ReserveOptions{Book: true, Holds: []string{key, lim.HoldKey("sms:sender", "+14155550999")}}
	if d, err := lim.Reserve(ctx, group, "a", o, rate); err != nil || d.Status != throttle.StatusAdmitted {
		t.Fatalf("before any hold: %v, %v", d.Status, err)
	}
	h, err := lim.Hold(ctx, key, 0, 5*time.Second, time.Second, time.Minute, 429)
	if err != nil || !h.Until.Equal(clock.Now().Add(5*time.Second)) || h.Extended {
		t.Fatalf("hold: %+v, %v", h, err)
	}
	// Every check, a rule or none, is booked for the hold's end.
	for i, limits := range [][]throttle.Limit{{rate}, nil} {
		d, err := lim.Reserve(ctx, group, fmt.Sprint("b", i), o, limits...)
		if err != nil || d.Status != throttle.StatusBooked || !d.At.Equal(h.Until) {
			t.Fatalf("during the hold: %v at %v, %v; want booked at %v", d.Status, d.At, err, h.Until)
		}
	}
	// An answer during the hold extends it, never shortens it.
	clock.Add(time.Second)
	if h2, err := lim.Hold(ctx, key, 0, 2*time.Second, time.Second, time.Minute, 429); err != nil || !h2.Extended || !h2.Until.Equal(h.Until) {
		t.Fatalf("second answer: %+v, %v", h2, err)
	}
	// An answer to a request sent before the hold began (in flight when it
	// began) leaves it as it is, even with a longer Retry-After ...
	if h3, err := lim.Hold(ctx, key, 1500*time.Millisecond, 30*time.Second, time.Second, time.Minute, 429); err != nil || h3.Extended || !h3.InFlight || !h3.Until.Equal(h.Until) {
		t.Fatalf("an answer in flight when the hold began: %+v, %v; want the hold unchanged (until %v)", h3, err, h.Until)
	}
	// ... and one to a request sent during it extends it.
	if h4, err := lim.Hold(ctx, key, 500*time.Millisecond, 30*time.Second, time.Second, time.Minute, 429); err != nil || !h4.Extended || h4.InFlight || !h4.Until.Equal(clock.Now().Add(30*time.Second)) {
		t.Fatalf("an answer to a request sent during the hold: %+v, %v; want until %v", h4, err, clock.Now().Add(30*time.Second))
	}
	h.Until = clock.Now().Add(30 * time.Second)
	// It lifts by itself.
	clock.Set(h.Until)
	if d, err := lim.Reserve(ctx, group, "c", o, rate); err != nil || d.Status != throttle.StatusAdmitted {
		t.Fatalf("after the hold: %v, %v", d.Status, err)
	}
	// Without a Retry-After, holds in a row double: 1 s, 2 s, 4 s; one during a hold does not.
	skey := lim.HoldKey("sms:sender", "+14155550999")
	for lvl, want := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second} {
		h, err := lim.Hold(ctx, skey, 0, 0, time.Second, 3*time.Second+500*time.Millisecond, 30001)
		want = min(want, 3*time.Second+500*time.Millisecond)
		if err != nil || h.Level != lvl || !h.Until.Equal(clock.Now().Add(want)) {
			t.Fatalf("hold %d: %+v, %v; want %v", lvl, h, err, want)
		}
		if again, _ := lim.Hold(ctx, skey, 0, 0, time.Second, time.Minute, 30001); again.Level != lvl || !again.Extended {
			t.Fatalf("during hold %d: %+v", lvl, again)
		}
		clock.Set(h.Until)
	}
	if _, err := lim.Hold(ctx, "sl1:{acme}:x", 0, 0, time.Second, time.Minute, 0); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Fatalf("a key that is no hold key: %v", err)
	}
}

// A hold set by one caller books every check that names it after its end,
// lifts by itself, and doubles when one follows another; a provider's
// breaker opens, probes and closes (testBreakers), on one node and a Cluster.
func TestHolds(t *testing.T) {
	t.Parallel()
	_, c := redistest.New(t)
	testHolds(t, c)
	testBreakers(t, c)
}

func TestHoldsCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Cluster")
	}
	t.Parallel()
	_, cc := redistest.NewCluster(t, 3, 0)
	testHolds(t, cc)
	testBreakers(t, cc)
}
