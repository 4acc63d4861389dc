package api

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
)

// What the server offers the routes mounted beside its own (the dashboard,
// a provider's callbacks): a place on its mux, its token checks, its
// shutdown state. A mounted handler's ResponseWriter is the access log's:
// it has SetIdentity, to name who the request acted for in the log, and
// Unwrap, so http.ResponseController reaches the connection (flushes,
// deadlines).

// MountBare adds a route served as is: no access log line, no metrics (the
// dashboard's static files).
func (s *Server) MountBare(pattern string, h http.Handler) {
	s.routes = append(s.routes, Route{Pattern: pattern, Handler: h, Bare: true})
}

// Stopping reports that the server is shutting down: /readyz answers 503,
// and long answers (the dashboard's live streams) should end.
func (s *Server) Stopping() bool { return s.stopping.Load() }

// Auth returns the server's token checks, for routes that sign people in
// with API tokens (the dashboard).
func (s *Server) Auth() *Auth {
	return &Auth{tokens: s.tokens, admin: s.cfg.AdminToken, key: s.cfg.TokenKey, fail: s.fail, rdb: s.rdb, rate: s.tokenRate}
}

// Auth checks bearer tokens as the API does: the admin token
// (SLUICE_API_ADMIN_TOKEN, compared in constant time) or a tenant's token
// from the token store. The admin is named by the tenant "" and the token
// id "admin".
type Auth struct {
	tokens *Tokens
	admin  string
	key    string
	fail   *failures
	rdb    redis.UniversalClient
	rate   func(ctx context.Context, tokenID string) (time.Duration, bool, error)
}

// Allow counts one request of tokenID against SLUICE_API_RATE, the budget
// its API requests share: ok is false past it, with the wait.
func (a *Auth) Allow(ctx context.Context, tokenID string) (wait time.Duration, ok bool, err error) {
	return a.rate(ctx, tokenID)
}

// AdminTokenID is the token id the admin token is logged and signed in as.
const AdminTokenID = "admin"

// Identify resolves token: the admin token (tenant "", id AdminTokenID),
// or a tenant's token (its tenant and id). ok is false for a token that is
// unknown or revoked; err reports Redis trouble.
func (a *Auth) Identify(ctx context.Context, token string) (tenant, tokenID string, ok bool, err error) {
	if token == "" {
		return "", "", false, nil
	}
	if a.admin != "" && sameSecret(token, a.admin) {
		return "", AdminTokenID, true, nil
	}
	info, err := a.tokens.Lookup(ctx, token)
	switch {
	case errors.Is(err, ErrUnknownToken):
		return "", "", false, nil
	case err != nil:
		return "", "", false, err
	}
	return info.Tenant, info.ID, true, nil
}

// Valid reports whether a token Identify resolved is valid still: for the
// admin (tenant ""), that an admin token is configured (a changed one
// changes SessionKey); for a tenant, that the token was not revoked.
func (a *Auth) Valid(ctx context.Context, tenant, tokenID string) (bool, error) {
	if tenant == "" {
		return a.admin != "" && tokenID == AdminTokenID, nil
	}
	return a.tokens.Has(ctx, tenant, tokenID)
}

// Tenants lists the tenants holding tokens, as far as a bounded scan gets
// (more reports that it stopped before the end).
func (a *Auth) Tenants(ctx context.Context) (tenants []string, more bool, err error) {
	return a.tokens.Tenants(ctx, tenantScanCalls)
}

// SessionKey derives a signing key for purpose from SLUICE_API_TOKEN_KEY
// and the admin token: changing either changes the key, so what was signed
// with the old one (a browser's session) stops being valid.
func (a *Auth) SessionKey(purpose string) []byte {
	m := hmac.New(sha256.New, []byte(a.key))
	m.Write([]byte(purpose + "\x00" + a.admin))
	return m.Sum(nil)
}

// Unwrap lets http.ResponseController reach the connection under the
// access log's recorder (the dashboard's live streams flush through it).
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// SetIdentity names who a request of a mounted route acts for, in the
// access log (tenant "" for the admin).
func (r *recorder) SetIdentity(tenant, tokenID string) {
	r.id = identity{Tenant: tenant, TokenID: tokenID, Admin: tenant == "" && tokenID == AdminTokenID}
}

// endedKey is the key that marks the dashboard session of nonce signed out.
func endedKey(nonce string) string {
	sum := sha256.Sum256([]byte(nonce))
	return keyspace.EndedSession(base64.RawURLEncoding.EncodeToString(sum[:12]))
}

// EndSession records that the session named by nonce was signed out; it
// is refused from now on, until expires (when its cookie would lapse anyway).
func (a *Auth) EndSession(ctx context.Context, nonce string, expires time.Time) error {
	ttl := time.Until(expires)
	if ttl <= 0 {
		return nil
	}
	if err := a.rdb.Set(ctx, endedKey(nonce), "1", ttl+time.Second).Err(); err != nil {
		return fmt.Errorf("api: end session: %w", err)
	}
	return nil
}

// Ended reports whether the session named by nonce was signed out.
func (a *Auth) Ended(ctx context.Context, nonce string) (bool, error) {
	n, err := a.rdb.Exists(ctx, endedKey(nonce)).Result()
	if err != nil {
		return false, fmt.Errorf("api: session: %w", err)
	}
	return n > 0, nil
}
