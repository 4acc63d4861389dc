package api

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/tasks"
)

var (
	// ErrUnknownToken reports a bearer token that is not (or no longer) valid.
	ErrUnknownToken = errors.New("unknown or revoked token")
	// ErrNoToken reports a token id that a tenant does not have.
	ErrNoToken = errors.New("no such token")
)

// Token store keys: keyspace.Token (by the token's HMAC: its TokenInfo,
// JSON) and keyspace.Tokens (by tenant: a hash token id -> HMAC). They
// share the {api} hash tag: one Redis Cluster slot, so creating and
// revoking a token is one transaction.

// TokenInfo is what is stored about a token: never the token itself.
type TokenInfo struct {
	// ID names the token in lists and logs; it is also part of the token.
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	Name      string    `json:"name,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"`
}

// Tokens keeps tenant API tokens in Redis, each stored under its
// HMAC-SHA256 keyed with SLUICE_API_TOKEN_KEY: a token is printed once, at
// creation, and Redis holds only its keyed hash.
type Tokens struct {
	rdb redis.UniversalClient
	key []byte
}

// NewTokens returns the token store; key is SLUICE_API_TOKEN_KEY.
func NewTokens(rdb redis.UniversalClient, key string) (*Tokens, error) {
	if err := CheckTokenKey(key); err != nil {
		return nil, fmt.Errorf("%w: %sAPI_TOKEN_KEY %w", ErrConfig, "SLUICE_", err)
	}
	return &Tokens{rdb: rdb, key: []byte(key)}, nil
}

// mac is the keyed hash a token is stored under.
func (s *Tokens) mac(token string) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(token))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// Create makes a token for tenant and returns it (the only time it is
// shown) with what is stored about it.
func (s *Tokens) Create(ctx context.Context, tenant, name, by string) (string, TokenInfo, error) {
	if err := tasks.CheckTenant(tenant); err != nil {
		return "", TokenInfo{}, err
	}
	if len(name) > 128 || strings.ContainsAny(name, "\r\n") {
		return "", TokenInfo{}, errors.New("token name: at most 128 characters on one line")
	}
	var id [8]byte
	var secret [24]byte
	_, _ = rand.Read(id[:])
	_, _ = rand.Read(secret[:])
	info := TokenInfo{ID: hex.EncodeToString(id[:]), Tenant: tenant, Name: name, CreatedAt: time.Now().UTC().Truncate(time.Millisecond), CreatedBy: by}
	token := "sluice_" + info.ID + "_" + hex.EncodeToString(secret[:])
	body, _ := json.Marshal(info)
	mac := s.mac(token)
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, keyspace.Token(mac), body, 0)
		p.HSet(ctx, keyspace.Tokens(tenant), info.ID, mac)
		return nil
	})
	if err != nil {
		return "", TokenInfo{}, fmt.Errorf("api: create token: %w", err)
	}
	return token, info, nil
}

// Lookup returns what is stored about token, or ErrUnknownToken.
func (s *Tokens) Lookup(ctx context.Context, token string) (TokenInfo, error) {
	if token == "" || len(token) > 256 {
		return TokenInfo{}, ErrUnknownToken
	}
	raw, err := s.rdb.Get(ctx, keyspace.Token(s.mac(token))).Bytes()
	if errors.Is(err, redis.Nil) {
		return TokenInfo{}, ErrUnknownToken
	}
	if err != nil {
		return TokenInfo{}, fmt.Errorf("api: token lookup: %w", err)
	}
	var info TokenInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		return TokenInfo{}, fmt.Errorf("api: stored token does not read: %w", err)
	}
	return info, nil
}

// List returns tenant's tokens, oldest first.
func (s *Tokens) List(ctx context.Context, tenant string) ([]TokenInfo, error) {
	if err := tasks.CheckTenant(tenant); err != nil {
		return nil, err
	}
	macs, err := s.rdb.HGetAll(ctx, keyspace.Tokens(tenant)).Result()
	if err != nil {
		return nil, fmt.Errorf("api: list tokens: %w", err)
	}
	out := []TokenInfo{}
	for _, mac := range macs {
		raw, err := s.rdb.Get(ctx, keyspace.Token(mac)).Bytes()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("api: list tokens: %w", err)
		}
		var info TokenInfo
		if json.Unmarshal(raw, &info) == nil {
			out = append(out, info)
		}
	}
	slices.SortFunc(out, func(a, b TokenInfo) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// Has reports whether tenant holds the token id: false once it is revoked.
func (s *Tokens) Has(ctx context.Context, tenant, id string) (bool, error) {
	if err := tasks.CheckTenant(tenant); err != nil {
		return false, err
	}
	ok, err := s.rdb.HExists(ctx, keyspace.Tokens(tenant), id).Result()
	if err != nil {
		return false, fmt.Errorf("api: token of %s: %w", tenant, err)
	}
	return ok, nil
}

// tenantScanCalls is the SCAN calls (COUNT 1000) Auth.Tenants spends.
const tenantScanCalls = 200

// Tenants lists the tenants holding tokens, in no order. No index lists
// them, so it SCANs for their token hashes with a budget of calls (a
// keyspace of millions of windows is not walked for one page); more
// reports a scan that stopped at its budget.
func (s *Tokens) Tenants(ctx context.Context, calls int) (tenants []string, more bool, err error) {
	var mu sync.Mutex // ForEachMaster scans the masters at once
	seen := map[string]bool{}
	scan := func(ctx context.Context, c redis.UniversalClient) error {
		var cursor uint64
		for range calls {
			keys, next, err := c.Scan(ctx, cursor, keyspace.TokensPattern, 1000).Result()
			if err != nil {
				return err
			}
			mu.Lock()
			for _, k := range keys {
				if t, ok := keyspace.TenantOfTokens(k); ok && tasks.CheckTenant(t) == nil && !seen[t] {
					seen[t] = true
					tenants = append(tenants, t)
				}
			}
			mu.Unlock()
			if cursor = next; cursor == 0 {
				return nil
			}
		}
		mu.Lock()
		more = true
		mu.Unlock()
		return nil
	}
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		// The token keys share one hash slot: one master holds them all.
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, s.rdb)
	}
	if err != nil {
		return nil, false, fmt.Errorf("api: tenants with tokens: %w", err)
	}
	return tenants, more, nil
}

// Revoke deletes tenant's token id: requests with it are refused from now on.
func (s *Tokens) Revoke(ctx context.Context, tenant, id string) error {
	if err := tasks.CheckTenant(tenant); err != nil {
		return err
	}
	id = strings.TrimPrefix(id, "sluice_") // the token itself names its id too
	if i := strings.IndexByte(id, '_'); i >= 0 {
		id = id[:i]
	}
	mac, err := s.rdb.HGet(ctx, keyspace.Tokens(tenant), id).Result()
	if errors.Is(err, redis.Nil) {
		return fmt.Errorf("%w: tenant %s has no token %q (see sluice tenant token list %s)", ErrNoToken, tenant, id, tenant)
	}
	if err != nil {
		return fmt.Errorf("api: revoke token: %w", err)
	}
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, keyspace.Token(mac))
		p.HDel(ctx, keyspace.Tokens(tenant), id)
		return nil
	})
	if err != nil {
		return fmt.Errorf("api: revoke token: %w", err)
	}
	return nil
}

// sameSecret compares two secrets in time that depends on neither's
// content nor length (both are hashed first).
func sameSecret(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}
