package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// windowAt is a provider window's entries (ms, Redis's clock) as a
// snapshot read them, and the instant Redis read them at.
type windowAt struct {
	at      time.Time
	entries []float64
}

// readProviderWindow reads the default provider's window of rule
// sms:provider (the deployment's own provider: its key has no subject
// after the window), by Redis's clock.
func readProviderWindow(ctx context.Context, rdb *redis.Client) (windowAt, error) {
	keys, err := rdb.Keys(ctx, "*{%7Eshared}:sms:provider:*").Result()
	if err != nil {
		return windowAt{}, err
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return windowAt{}, err
	}
	w := windowAt{at: now}
	for _, k := range keys {
		_, window, _ := strings.Cut(k, ":sms:provider:")
		if strings.Contains(window, ":") {
			continue // a named provider's window (its subject follows)
		}
		zs, err := rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
		if err != nil {
			return windowAt{}, err
		}
		for _, z := range zs {
			w.entries = append(w.entries, z.Score)
		}
	}
	slices.Sort(w.entries)
	return w, nil
}

// earliestFit is the first instant at or after from at which a sliding
// log holding entries (ms) takes one more entry under limit per span of
// wp ms (the rule's window plus the send slack, as the limiter spaces
// sends): no span of wp ms containing it holds limit entries. A run of
// limit entries within wp blocks [its last - wp, its first + wp]
// (scripts/limiter_log.lua); this walks every run, brute force.
func earliestFit(entries []float64, limit int, wp, from float64) float64 {
	t := from
	for moved := true; moved; {
		moved = false
		for i := 0; i+limit-1 < len(entries); i++ {
			first, last := entries[i], entries[i+limit-1]
			if last-first <= wp && t >= last-wp && t <= first+wp {
				t, moved = first+wp+1, true
			}
		}
	}
	return t
}

// firstAtOrAfter is the first entry at or after from (ms), or +Inf-like
// max when none.
func firstAtOrAfter(entries []float64, from float64) (float64, bool) {
	for _, e := range entries {
		if e >= from {
			return e, true
		}
	}
	return 0, false
}

func TestEarliestFit(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		entries []float64
		limit   int
		from    float64
		want    float64
	}{
		{"empty", nil, 2, 100, 100},
		{"room", []float64{0, 50}, 3, 100, 100},
		{"full behind", []float64{0, 50}, 2, 100, 1001},
		{"full ahead", []float64{200, 300}, 2, 100, 1201},
		{"runs back to back", []float64{200, 300, 1201, 1300}, 2, 100, 2202},
		{"a gap between runs", []float64{200, 300, 2500, 2600}, 2, 100, 1201},
		{"not a run: too far apart", []float64{0, 1500}, 2, 100, 100},
	} {
		if got := earliestFit(c.entries, c.limit, 1000, c.from); got != c.want {
			t.Errorf("%s: earliestFit(%v, %d, 1000, %v) = %v, want %v", c.name, c.entries, c.limit, c.from, got, c.want)
		}
	}
}
