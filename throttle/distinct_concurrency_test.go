package throttle_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// Two limiters (two workers' clients) and 32 goroutines check one distinct
// rule at once, on Redis TIME, beside a per-recipient log rule, booking what
// does not fit and asking again at the slot: no instant ever has more
// distinct recipients sent to in its window than the limit, a recipient's
// repeats never count twice, and every send goes in the end.
func TestDistinctConcurrent(t *testing.T) {
	b := setup(t, false)
	other, err := throttle.New(b.client, throttle.Options{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	lims := []*throttle.Limiter{b.lim, other}
	const limit, sends, recipients = 20, 300, 45
	window := 1500 * time.Millisecond
	rule := throttle.Rule{Limit: limit, Window: window, Distinct: true}
	var mu sync.Mutex
	m := newDistinctModel(limit, window.Milliseconds())
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 32))
			l := lims[g%2]
			for i := g; i < sends; i += 32 {
				to := fmt.Sprintf("+1555%04d", rng.IntN(recipients))
				limits := []throttle.Limit{
					{Scope: "whatsapp:tenant", Distinct: to, Rule: rule},
					{Scope: "whatsapp:recipient", Subject: to, Rule: throttle.Rule{Limit: 1, Window: 100 * time.Millisecond}},
				}
				id := fmt.Sprint("n", i)
				for {
					d, err := l.Reserve(context.Background(), b.group, id, throttle.ReserveOptions{Book: true, Horizon: 50 * time.Millisecond}, limits...)
					if err != nil {
						errs <- err
						return
					}
					if d.Booked {
						time.Sleep(time.Until(d.RetryAt))
						continue
					}
					if !d.Allowed {
						errs <- fmt.Errorf("%s: status %v", id, d.Status)
						return
					}
					mu.Lock()
					m.sends[to] = append(m.sends[to], d.At.UnixMilli())
					mu.Unlock()
					if err := l.MarkDone(context.Background(), b.group, id, d.Attempt, time.Hour); err != nil {
						errs <- err
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	n := 0
	for _, v := range m.sends {
		n += len(v)
	}
	if n != sends {
		t.Fatalf("%d sends admitted, want %d", n, sends)
	}
	if at, most := m.worst(); most > limit {
		t.Fatalf("%d distinct recipients in the window ending %d, limit %d", most, at, limit)
	}
	if len(m.sends) <= limit {
		t.Fatalf("only %d recipients: the test never filled the window", len(m.sends))
	}
}
