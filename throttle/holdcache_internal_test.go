package throttle

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/testkit/redistest"
)

// standClock is a clock that moves only when told.
type standClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *standClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *standClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// The hold cache on a real 3-master Cluster, its clock standing still so
// that only what the cache is told can change what it serves: a watched
// read is served from memory (0 GETs reach the {hold} master); a hold
// written with its announcement (Hold) is seen at the message; one written
// behind its back (a bare SET) only after HoldCacheTTL, or at once when the
// subscription is cut and comes back; a read that began before an
// announcement is not kept; and a Cluster's Reserve books after a cached
// hold.
func TestHoldCacheCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Cluster")
	}
	t.Parallel()
	_, cc := redistest.NewCluster(t, 3, 0)
	l, err := New(cc, Options{Secret: []byte("test-secret-0123456789")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	clock := &standClock{t: time.Now()}
	done := make(chan struct{})
	go func() { defer close(done); l.watchHolds(ctx, clock.now) }()
	t.Cleanup(func() { cancel(); <-done })
	c := waitLive(t, l)
	key := l.HoldKey("sms:provider", "")
	master, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	gets := func() int64 { return cmdCalls(t, master, "get") }

	// Served from memory: one GET, then none.
	if u := heldUntil(t, l, key); !u.IsZero() {
		t.Fatalf("held until %v before any hold", u)
	}
	before := gets()
	for range 100 {
		heldUntil(t, l, key)
	}
	if n := gets() - before; n != 0 {
		t.Fatalf("%d GETs reached the {hold} master for 100 watched reads; want 0", n)
	}

	// Written behind the cache's back: unseen while the entry is fresh,
	// seen once it is HoldCacheTTL old.
	until := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if err := cc.Set(ctx, key, fmt.Sprintf("%d:0:429:%d", until.UnixMilli(), time.Now().UnixMilli()), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if u := heldUntil(t, l, key); !u.IsZero() {
		t.Fatalf("a fresh entry was read again from Redis (held until %v)", u)
	}
	clock.add(HoldCacheTTL)
	if u := heldUntil(t, l, key); !u.Equal(until) {
		t.Fatalf("an entry HoldCacheTTL old was served: held until %v, want %v", u, until)
	}

	// Announced with its write: seen at the message, the clock standing.
	other := l.HoldKey("sms:sender", "+15005550006")
	heldUntil(t, l, other)
	st, err := l.Hold(ctx, other, 0, 30*time.Second, time.Second, time.Minute, 429)
	if err != nil {
		t.Fatal(err)
	}
	waitHeld(t, l, other, st.Until, "a hold written by Hold (announced)")

	// A cut subscription: messages sent meanwhile are lost, so the cache
	// forgets when it is back.
	later := until.Add(time.Hour)
	heldUntil(t, l, key) // cached again after the announcement emptied the cache
	if err := cc.Set(ctx, key, fmt.Sprintf("%d:0:429:%d", later.UnixMilli(), time.Now().UnixMilli()), 2*time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if u := heldUntil(t, l, key); !u.Equal(until) {
		t.Fatalf("held until %v before the cut, want the cached %v", u, until)
	}
	err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		return m.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	waitHeld(t, l, key, later, "a hold written while the subscription was cut")

	// A read that began before an announcement is answered, not kept.
	_, gen, _ := c.cached([]string{key})
	c.forget(false)
	c.keep(gen, clock.now(), []string{key}, []*string{nil})
	if _, _, ok := c.cached([]string{key}); ok {
		t.Fatal("a read begun before an announcement was kept")
	}

	// A provider's breaker and hold, read together at a pick: from
	// memory, and a breaker opened (announced by its script) seen at the
	// message.
	testBreakerCache(t, l, master)

	// Reserve on the Cluster books after the cached hold, reading none.
	heldUntil(t, l, key)
	before = gets()
	d, err := l.Reserve(ctx, "t1", "n1", ReserveOptions{Book: true, Holds: []string{key}}, Limit{Scope: "sms:recipient", Subject: "+1", Rule: Rule{Limit: 1, Window: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	if d.Status != StatusBooked || d.Now.Add(d.Wait).Before(later) {
		t.Fatalf("Reserve under a cached hold until %v: %s at %v", later, d.Status, d.Now.Add(d.Wait))
	}
	if n := gets() - before; n != 0 {
		t.Fatalf("Reserve read the holds from Redis (%d GETs); want them from memory", n)
	}
}

func waitLive(t *testing.T, l *Limiter) *holdCache {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c := l.holds.Load(); c != nil {
			c.mu.Lock()
			live := c.live
			c.mu.Unlock()
			if live {
				return c
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the hold cache never subscribed")
	return nil
}

func heldUntil(t *testing.T, l *Limiter, key string) time.Time {
	t.Helper()
	u, err := l.HeldUntil(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// waitHeld polls until a watched read of key gives until (the cache's
// clock standing: only a forgotten entry can give it).
func waitHeld(t *testing.T, l *Limiter, key string, until time.Time, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		u := heldUntil(t, l, key)
		if u.Equal(until) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the cache still served %v after 30 s, want %v", what, u, until)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// cmdCalls is how many times m ran cmd (INFO commandstats).
func cmdCalls(t *testing.T, m *redis.Client, cmd string) int64 {
	t.Helper()
	info, err := m.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}

// testBreakerCache: ProviderStates from memory (0 GETs once read), and a
// breaker that opens seen at its script's announcement, the clock standing.
func testBreakerCache(t *testing.T, l *Limiter, master *redis.Client) {
	t.Helper()
	ctx := context.Background()
	bkey, hkey := l.BreakerKey("sms", "backup"), l.HoldKey("sms:provider", "")
	states := func() Breaker {
		t.Helper()
		bs, _, err := l.ProviderStates(ctx, []string{bkey, ""}, []string{hkey})
		if err != nil {
			t.Fatal(err)
		}
		return bs[0]
	}
	if b := states(); b.Open {
		t.Fatal("a breaker open before any failure")
	}
	before := cmdCalls(t, master, "get")
	for range 50 {
		states()
	}
	if n := cmdCalls(t, master, "get") - before; n != 0 {
		t.Fatalf("%d GETs for 50 watched provider-state reads; want 0", n)
	}
	other, err := New(l.client, Options{Secret: l.secret})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.ProviderFailed(ctx, bkey, BreakerPolicy{Failures: 1, Window: time.Minute, Cooldown: time.Hour}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !states().Open {
		if time.Now().After(deadline) {
			t.Fatal("a breaker opened by another limiter (announced) was still served closed after 30 s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
