package worker_test

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/fakes"
	"github.com/sluicehq/sluice/tasks"
)

// digestModel is the brute-force answer for n items of one recipient that
// arrive together under limit L per window w (spans of w + slack, as the
// limiter counts them), folded by digests of at most m items: each message,
// in turn, at the first millisecond at which the window before it holds
// fewer than L messages; the first L go alone, every later one is a digest
// of the next m items (the last of the rest). It returns each message's
// time (ms from the first) and items.
func digestModel(n, l, m int, span int64) (at []int64, sizes []int) {
	fits := func(t int64) bool {
		c := 0
		for _, x := range at {
			if x >= t-span && x <= t {
				c++
			}
		}
		return c < l
	}
	left := n
	for left > 0 {
		t := int64(0)
		if len(at) > 0 {
			t = at[len(at)-1]
		}
		for !fits(t) {
			t++
		}
		size := 1
		if len(at) >= l {
			size = min(m, left)
		}
		at, sizes, left = append(at, t), append(sizes, size), left-size
	}
	return at, sizes
}

// Random bursts, limits and digest sizes against the brute-force model:
// the messages the fake provider receives, their items (each exactly once)
// and their times from the first (within 250 ms: wake-up, send and the
// race detector on a shared 2-core machine).
func TestDigestMatchesModel(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 37))
	t.Logf("seed %d", seed)
	for trial := 0; trial < 4; trial++ {
		l, m := 1+rng.IntN(3), 2+rng.IntN(5)
		n := l + 1 + rng.IntN(2*m*l)
		t.Run(fmt.Sprintf("L%d_M%d_n%d", l, m, n), func(t *testing.T) {
			t.Parallel()
			b := setup(t, fmt.Sprintf("sms:recipient=%d/1s,sms.alerts:digest=max:%d", l, m))
			b.start(t, b.cfg)
			for i := 0; i < n; i++ {
				x := tasks.NewSMS("acme", "+14155550123", fmt.Sprintf("alert-%d.", i))
				x.Category = "alerts"
				b.enqueue(t, x)
			}
			span := (time.Second + b.cfg.SendSlack).Milliseconds() + 1
			at, sizes := digestModel(n, l, m, span)
			ds := b.sms.WaitFor(t, 30*time.Second, fmt.Sprintf("%d messages", len(at)), func(ds []fakes.Delivery) bool { return len(ds) >= len(at) })
			item := regexp.MustCompile(`alert-\d+\.`)
			seen := map[string]int{}
			var got []int
			for _, d := range ds {
				found := item.FindAllString(d.Body, -1)
				got = append(got, len(found))
				for _, f := range found {
					seen[f]++
				}
			}
			// In time order; messages the model puts at one instant may come
			// in any order among themselves.
			group := func(xs []int) []int {
				out := slices.Clone(xs)
				for i := 0; i < len(out) && i < len(at); {
					j := i
					for j < len(at) && at[j] == at[i] {
						j++
					}
					slices.Sort(out[i:min(j, len(out))])
					i = j
				}
				return out
			}
			if g, w := group(got), group(sizes); !slices.Equal(g, w) {
				t.Errorf("items per message %v, model %v", g, w)
			}
			if len(seen) != n {
				t.Errorf("%d distinct items, want %d", len(seen), n)
			}
			for f, c := range seen {
				if c != 1 {
					t.Errorf("%s received %d times", f, c)
				}
			}
			var lines []string
			for i, d := range ds {
				off := d.At.Sub(ds[0].At).Milliseconds()
				lines = append(lines, fmt.Sprintf("+%d ms (model +%d): %d items", off, at[min(i, len(at)-1)], got[min(i, len(got)-1)]))
				if i < len(at) && (off < at[i]-50 || off > at[i]+250) {
					t.Errorf("message %d at +%d ms, the model's at +%d ms", i, off, at[i])
				}
			}
			t.Log(strings.Join(lines, "\n"))
		})
	}
}
