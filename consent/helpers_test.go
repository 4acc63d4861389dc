package consent_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

var testSecret = []byte("consent-test-secret-0123456789")

// manualClock is an explicit "now" for tests (consent.Options.Now).
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *manualClock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

type testBundle struct {
	srv    *redistest.Server
	rdb    *redis.Client
	lim    *throttle.Limiter
	store  *consent.Store
	clock  *manualClock // nil unless asked for
	tenant string       // random per test
}

// setup starts a private redis-server and a store over it; with a clock,
// the store uses it instead of Redis TIME.
func setup(t testing.TB, clock *manualClock, opts consent.Options) *testBundle {
	t.Helper()
	srv, rdb := redistest.New(t)
	lim, err := throttle.New(rdb, throttle.Options{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	if clock != nil {
		opts.Now = clock.Now
	}
	s, err := consent.NewStore(rdb, lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{srv: srv, rdb: rdb, lim: lim, store: s, clock: clock, tenant: "t-" + uuid.NewString()[:8]}
}

func newClock() *manualClock {
	return &manualClock{t: time.Date(2026, 4, 11, 12, 0, 0, 0, time.UTC)}
}

func (b *testBundle) record(t testing.TB, ch tasks.Channel, to string, e consent.Event) consent.Event {
	t.Helper()
	got, err := b.store.Record(context.Background(), b.tenant, ch, to, e)
	if err != nil {
		t.Fatalf("Record(%+v): %v", e, err)
	}
	return got
}

func (b *testBundle) check(t testing.TB, ch tasks.Channel, to, category string, exempt bool) consent.Reason {
	t.Helper()
	v, err := b.store.Check(context.Background(), b.tenant, ch, to, category, exempt)
	if err != nil {
		t.Fatalf("Check(%s, %q, exempt %v): %v", to, category, exempt, err)
	}
	if !v.Blocked() && v.Mark != nil {
		t.Fatalf("Check(%s, %q): reason %v with mark %+v", to, category, v.Reason, v.Mark)
	}
	return v.Reason
}

func (b *testBundle) state(t testing.TB, ch tasks.Channel, to string) consent.State {
	t.Helper()
	st, err := b.store.State(context.Background(), b.tenant, ch, to)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// fields lists what a State holds as the hash's field names.
func fields(st consent.State) []string {
	var out []string
	if st.Undeliverable != nil {
		out = append(out, "!")
	}
	if st.All != nil {
		out = append(out, "*")
	}
	for c := range st.OptedOut {
		out = append(out, "c:"+c)
	}
	for c := range st.OptedIn {
		out = append(out, "+:"+c)
	}
	slices.Sort(out)
	return out
}

// model is the suppression hash's fields as the package documentation
// says events leave them: an independent reading of record.lua.
type model map[string]bool

func (m model) apply(e consent.Event) {
	switch e.Action {
	case consent.OptOut:
		if e.Scope.All {
			m["*"] = true
			for f := range m {
				if strings.HasPrefix(f, "+:") {
					delete(m, f)
				}
			}
			return
		}
		for _, c := range e.Scope.Categories {
			m["c:"+c] = true
			delete(m, "+:"+c)
		}
	case consent.OptIn:
		if e.Scope.All {
			clear(m)
			return
		}
		for _, c := range e.Scope.Categories {
			delete(m, "c:"+c)
			if m["*"] {
				m["+:"+c] = true
			}
		}
	case consent.Undeliverable:
		m["!"] = true
	}
}

func (m model) fields() []string { return slices.Sorted(maps.Keys(m)) }

// redisClient is what the tests hand the stores: a single node or a Cluster.
type redisClient = redis.UniversalClient

// inParallel runs f(w, i) for i in 0..n-1 on each of workers goroutines
// (w the goroutine's number) and fails the test with the first error.
func inParallel(t testing.TB, workers, n int, f func(w, i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range n {
				if err := f(w, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}
