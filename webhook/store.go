package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/tasks"
)

// ErrNotConfigured reports a tenant without credentials for a provider.
var ErrNotConfigured = errors.New("webhook: not configured for this tenant")

// Store keeps each tenant's webhook credentials in Redis: one hash per
// tenant, in its hash slot,
//
//	key    sluice:{<tenant>}:webhooks
//	field  <provider>
//	value  the Credentials as JSON, sealed with SLUICE_PAYLOAD_KEYS
//	       (tasks.Keyring, AES-256-GCM) and bound to tenant and provider
//
// so a copy of Redis holds no key or password in clear, and a value moved
// to another tenant or provider does not open.
type Store struct {
	rdb  redis.UniversalClient
	keys *tasks.Keyring
}

// NewStore returns a store over rdb sealing with keys.
func NewStore(rdb redis.UniversalClient, keys *tasks.Keyring) *Store {
	return &Store{rdb: rdb, keys: keys}
}

// Key is the Redis key of tenant's credentials.
func Key(tenant string) string { return keyspace.Webhooks(tenant) }

// sealedAs binds a sealed value to its tenant and provider (the AEAD's
// additional data).
func sealedAs(provider string) string { return "webhook:" + provider }

// Set stores c as tenant's credentials for p, after p.Check.
func (s *Store) Set(ctx context.Context, tenant string, p Provider, c Credentials) error {
	if err := tasks.CheckTenant(tenant); err != nil {
		return fmt.Errorf("%w: %w", ErrCredentials, err)
	}
	if err := p.Check(c); err != nil {
		return err
	}
	plain, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("webhook: %w", err)
	}
	sealed := s.keys.Seal(tenant, sealedAs(p.Name()), plain)
	if err := s.rdb.HSet(ctx, Key(tenant), p.Name(), sealed).Err(); err != nil {
		return fmt.Errorf("webhook: store credentials: %w", err)
	}
	return nil
}

// Get returns tenant's credentials for the provider named name; the error
// wraps ErrNotConfigured when there are none, tasks.ErrSealed when they do
// not open with the key ring.
func (s *Store) Get(ctx context.Context, tenant, name string) (Credentials, error) {
	raw, err := s.rdb.HGet(ctx, Key(tenant), name).Bytes()
	if errors.Is(err, redis.Nil) {
		return Credentials{}, ErrNotConfigured
	}
	if err != nil {
		return Credentials{}, fmt.Errorf("webhook: read credentials: %w", err)
	}
	plain, err := s.keys.Open(tenant, sealedAs(name), raw)
	if err != nil {
		return Credentials{}, fmt.Errorf("webhook: credentials of %s for %s: %w", name, tenant, err)
	}
	var c Credentials
	if err := json.Unmarshal(plain, &c); err != nil {
		return Credentials{}, fmt.Errorf("webhook: credentials of %s for %s: %w", name, tenant, err)
	}
	return c, nil
}

// Delete removes tenant's credentials for the provider named name; it
// reports whether there were any.
func (s *Store) Delete(ctx context.Context, tenant, name string) (bool, error) {
	n, err := s.rdb.HDel(ctx, Key(tenant), name).Result()
	if err != nil {
		return false, fmt.Errorf("webhook: delete credentials: %w", err)
	}
	return n > 0, nil
}

// Providers lists the providers tenant has credentials for, sorted.
func (s *Store) Providers(ctx context.Context, tenant string) ([]string, error) {
	names, err := s.rdb.HKeys(ctx, Key(tenant)).Result()
	if err != nil {
		return nil, fmt.Errorf("webhook: list credentials: %w", err)
	}
	slices.Sort(names)
	return names, nil
}
