package api

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// Failed authentication is limited per client: each bearer token or
// sign-in refused counts against the client's address (the peer, or the
// trusted proxy's header SLUICE_API_CLIENT_IP_HEADER), in Sluice's own
// limiter; a client past SLUICE_API_AUTH_FAILURES is answered 429
// auth-limited, without its credential being checked, until its oldest
// failure leaves the window. Only failures count, and only the client's
// own: a valid token from any other address is never refused.

// failures counts failed authentications per client.
type failures struct {
	lim    *throttle.Limiter
	rule   throttle.Rule
	header string // canonical header name; "" for the peer address
}

// client is the address r's failures are counted by: the last entry of
// the configured header (the one the trusted proxy appended), or the
// peer's host.
func (f *failures) client(r *http.Request) string {
	if f.header != "" {
		if vals := r.Header.Values(f.header); len(vals) > 0 {
			parts := strings.Split(vals[len(vals)-1], ",")
			if c := strings.TrimSpace(parts[len(parts)-1]); c != "" {
				return c
			}
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func (f *failures) limit() throttle.Limit {
	return throttle.Limit{Scope: "auth:failures", Rule: f.rule}
}

// group keys a client by a hash of its address (no address in clear).
func (f *failures) group(client string) string {
	sum := sha256.Sum256([]byte("sluice-auth-client\x00" + client))
	return "authfail/" + base64.RawURLEncoding.EncodeToString(sum[:12])
}

// locked reports whether client used up its failures, and until when.
func (f *failures) locked(ctx context.Context, client string) (time.Duration, bool, error) {
	us, err := f.lim.Usage(ctx, f.group(client), 0, f.limit())
	if err != nil {
		return 0, false, fmt.Errorf("api: failed-auth limit: %w", err)
	}
	if us[0].Remaining > 0 {
		return 0, false, nil
	}
	return max(time.Second, us[0].NextFree.Sub(us[0].Now)), true, nil
}

// failed counts one failed authentication of client.
func (f *failures) failed(ctx context.Context, client string) error {
	if _, err := f.lim.Allow(ctx, f.group(client), tasks.NewID(), f.limit()); err != nil {
		return fmt.Errorf("api: failed-auth limit: %w", err)
	}
	return nil
}

// retryAfter is a Retry-After value in whole seconds, rounded up.
func retryAfter(d time.Duration) string {
	return fmt.Sprint(max(1, int((d+time.Second-1)/time.Second)))
}

// Client is the address a request's failed sign-ins are counted by.
func (a *Auth) Client(r *http.Request) string { return a.fail.client(r) }

// Locked reports whether client failed authentication too often, and for
// how long more; a locked client's credentials are not checked.
func (a *Auth) Locked(ctx context.Context, client string) (time.Duration, bool, error) {
	return a.fail.locked(ctx, client)
}

// Failed counts a failed sign-in of client.
func (a *Auth) Failed(ctx context.Context, client string) error { return a.fail.failed(ctx, client) }
