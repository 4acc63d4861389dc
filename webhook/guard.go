package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Guard is the replay guard: the deliveries seen, by tenant, provider and
// ReplayID, each remembered for its ReplayTTL (SET NX PX): one key per
// delivery,
//
//	sluice:{<tenant>}:webhook-seen:<provider>:<22 characters of SHA-256(ReplayID)>
//
// so nothing of the delivery is stored, and the keys vanish on their own.
type Guard struct{ rdb redis.UniversalClient }

// NewGuard returns a guard over rdb.
func NewGuard(rdb redis.UniversalClient) *Guard { return &Guard{rdb: rdb} }

func seenKey(tenant, provider, id string) string {
	sum := sha256.Sum256([]byte(id))
	return "sluice:{" + tenant + "}:webhook-seen:" + provider + ":" + base64.RawURLEncoding.EncodeToString(sum[:16])
}

// First reports whether id is new for (tenant, provider) and remembers it
// for ttl.
func (g *Guard) First(ctx context.Context, tenant, provider, id string, ttl time.Duration) (bool, error) {
	ok, err := g.rdb.SetNX(ctx, seenKey(tenant, provider, id), "1", max(ttl, time.Second)).Result()
	if err != nil {
		return false, fmt.Errorf("webhook: replay guard: %w", err)
	}
	return ok, nil
}

// Forget drops id, so the provider's retry of a delivery that could not be
// recorded is taken.
func (g *Guard) Forget(ctx context.Context, tenant, provider, id string) error {
	if err := g.rdb.Del(ctx, seenKey(tenant, provider, id)).Err(); err != nil {
		return fmt.Errorf("webhook: replay guard: %w", err)
	}
	return nil
}
