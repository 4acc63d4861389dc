package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
)

// Guard is the replay guard: the deliveries seen, by provider and
// ReplayID (the provider's own event id or signed nonce) across every
// tenant, each remembered for its ReplayTTL (SET NX PX): one key per
// delivery,
//
//	sluice:webhook-seen:<provider>:{<22 characters of SHA-256(ReplayID)>}
//
// so nothing of the delivery is stored, the keys vanish on their own and
// spread over a Cluster's slots — and a signed event posted to one
// tenant's route, then replayed to another's, is a duplicate there.
type Guard struct{ rdb redis.UniversalClient }

// NewGuard returns a guard over rdb.
func NewGuard(rdb redis.UniversalClient) *Guard { return &Guard{rdb: rdb} }

func seenKey(provider, id string) string {
	sum := sha256.Sum256([]byte(id))
	return keyspace.WebhookSeen(provider, base64.RawURLEncoding.EncodeToString(sum[:16]))
}

// First reports whether id is new for provider, whatever the tenant, and
// remembers it for ttl.
func (g *Guard) First(ctx context.Context, provider, id string, ttl time.Duration) (bool, error) {
	ok, err := g.rdb.SetNX(ctx, seenKey(provider, id), "1", max(ttl, time.Second)).Result()
	if err != nil {
		return false, fmt.Errorf("webhook: replay guard: %w", err)
	}
	return ok, nil
}

// Forget drops id, so the provider's retry of a delivery that could not be
// recorded is taken.
func (g *Guard) Forget(ctx context.Context, provider, id string) error {
	if err := g.rdb.Del(ctx, seenKey(provider, id)).Err(); err != nil {
		return fmt.Errorf("webhook: replay guard: %w", err)
	}
	return nil
}
