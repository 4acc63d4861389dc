package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/throttle"
)

// Two limiters (two workers' clients) and 32 goroutines check one distinct
// rule at once, on Redis TIME, beside a per-recipient log rule, booking what
// does not fit and asking again at the slot: no instant ever has more
// distinct recipients sent to in its window than the limit, a recipient's
// repeats never count twice, and every send goes in the end.
func TestDistinctConcurrent(t *testing.T) {
	sluicetest.Slow(t)
	b := setup(t, false)
	other, err := throttle.New(b.client, throttle.Options{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	lims := []*throttle.Limiter{b.lim, other}
	const limit, sends, recipients = 20, 300, 45
	window := 1500 * time.Millisecond
	// A booked send asks again lead before its slot, and the horizon admits it
	// for the slot itself, as the worker wakes a booked task (records.wakeTime):
	// asked after its slot, it would be placed anew behind the recipient's
	// later bookings 101 ms apart, and two such sends woken late each time
	// could take turns going to the back for minutes.
	const lead, horizon = 40 * time.Millisecond, 100 * time.Millisecond
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
					d, err := l.Reserve(context.Background(), b.group, id, throttle.ReserveOptions{Book: true, Horizon: horizon}, limits...)
					if err != nil {
						errs <- err
						return
					}
					if d.Booked {
						time.Sleep(time.Until(d.RetryAt.Add(-lead)))
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

// On a 3-master Cluster a distinct rule lives in its tenant's slot: checked
// beside a sender rule of another group (placed first, across slots), it
// stays exact under concurrent checks; a distinct rule kept in another
// group than the check's is refused.
func TestDistinctOnCluster(t *testing.T) {
	t.Parallel()
	_, cc := redistest.NewCluster(t, 3, 0)
	l, err := throttle.New(cc, throttle.Options{Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rule := throttle.Rule{Limit: 5, Window: time.Minute, Distinct: true}
	var mu sync.Mutex
	admitted := map[string]int{}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 4 {
				to := fmt.Sprintf("+1555%04d", (g*4+i)%12)
				d, err := l.Reserve(context.Background(), "acme", fmt.Sprintf("c%d-%d", g, i), throttle.ReserveOptions{Horizon: time.Second},
					throttle.Limit{Scope: "whatsapp:tenant", Distinct: to, Rule: rule},
					throttle.Limit{Scope: "whatsapp:sender", Subject: "106540352242922", Group: "~shared", Rule: throttle.Rule{Limit: 1000, Window: time.Second}})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					admitted[to]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(admitted) != 5 {
		t.Fatalf("%d distinct recipients admitted, want exactly 5: %v", len(admitted), admitted)
	}
	_, err = l.Reserve(context.Background(), "acme", "x", throttle.ReserveOptions{},
		throttle.Limit{Scope: "whatsapp:tenant", Distinct: "+15550000", Group: "portfolio", Rule: rule},
		throttle.Limit{Scope: "whatsapp:recipient", Subject: "+15550000", Rule: throttle.PerMinute(1)})
	if !errors.Is(err, throttle.ErrInvalidRule) {
		t.Fatalf("a distinct rule in another group on a Cluster: %v, want ErrInvalidRule", err)
	}
}
