package throttle_test

import (
	"crypto/sha256"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

var testSecret = []byte("test-secret-0123456789abcdef")

// manualClock is an explicit "now" for tests: decisions use it instead of
// Redis TIME (throttle.Options.Now).
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func newManualClock() *manualClock {
	return &manualClock{t: time.UnixMilli(1_716_873_600_000)} // the textbook example's instant
}

func (c *manualClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *manualClock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }
func (c *manualClock) Set(t time.Time)     { c.mu.Lock(); c.t = t; c.mu.Unlock() }

type testBundle struct {
	client *redis.Client
	server *redistest.Server
	lim    *throttle.Limiter
	clock  *manualClock // nil unless setup asked for a manual clock
	group  string       // a random group per test
}

// setup starts a private redis-server. With manual=true the limiter uses a
// manual clock; otherwise Redis TIME.
func setup(t testing.TB, manual bool) *testBundle {
	t.Helper()
	srv, c := redistest.New(t)
	b := &testBundle{client: c, server: srv, group: "t-" + uuid.NewString()[:8]}
	opts := throttle.Options{Secret: testSecret}
	if manual {
		b.clock = newManualClock()
		opts.Now = b.clock.Now
	}
	l, err := throttle.New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	b.lim = l
	return b
}

func (b *testBundle) key(t testing.TB, lim throttle.Limit) string {
	t.Helper()
	k, err := b.lim.Key(b.group, lim)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func member() string { return uuid.NewString() }

// setupRedis starts a private redis-server for tests that build their own limiters.
func setupRedis(t testing.TB) (*redistest.Server, *redis.Client) {
	t.Helper()
	return redistest.New(t)
}

// compactMember is how Options.CompactMembers stores a member: 6 bytes of its SHA-256.
func compactMember(m string) string {
	sum := sha256.Sum256([]byte(m))
	return string(sum[:6])
}
