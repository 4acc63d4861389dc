package e2e

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// windowAt is a provider window's entries (ms, Redis's clock) as a
// snapshot read them, and the instant Redis read them at.
type windowAt struct {
	at    time.Time
	slots []time.Time
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
			w.slots = append(w.slots, time.UnixMilli(int64(z.Score)))
		}
	}
	slices.SortFunc(w.slots, time.Time.Compare)
	return w, nil
}

// firstAtOrAfter is the first of slots at or after from.
func firstAtOrAfter(slots []time.Time, from time.Time) (time.Time, bool) {
	for _, s := range slots {
		if !s.Before(from) {
			return s, true
		}
	}
	return time.Time{}, false
}
