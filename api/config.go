package api

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/throttle"
)

// ErrConfig reports an API configuration that cannot run; the message names
// the variable. It wraps config.ErrConfig, so one check covers both.
var ErrConfig = fmt.Errorf("api %w", config.ErrConfig)

// Config is the API's configuration: the shared settings (Redis, the
// queue layout, the rules, the subject secret, the payload keys: the same
// variables as the workers', so the two agree) and the API's own.
type Config struct {
	config.Base
	Settings
}

// Settings are the API's own SLUICE_API_* variables, with the tag
// conventions of config (env, envDefault, desc, secret).
type Settings struct {
	Addr              string        `env:"API_ADDR" envDefault:":8081" desc:"Listen address of sluice api: the /v1 API, the providers' callbacks and webhooks, the unsubscribe links, the dashboard (/ui), /openapi.yaml, /metrics, /healthz, /readyz (every route: docs/api.md)."`
	TokenKey          string        `env:"API_TOKEN_KEY" desc:"Required by sluice api and sluice tenant token. Key (≥ 32 bytes) of the HMAC-SHA256 that API tokens are stored under in Redis: Redis never holds a token, and a copy of Redis cannot be used to check guesses. Changing it revokes every token." secret:"true"`
	AdminToken        string        `env:"API_ADMIN_TOKEN" desc:"Bearer token (≥ 32 characters) that may read every tenant's notifications and quotas and enqueue for the tenant a request names (?tenant=); empty: no admin access. Compared in constant time." secret:"true"`
	Rate              string        `env:"API_RATE" envDefault:"50/1s" desc:"Requests per token, LIMIT/WINDOW, counted by Sluice's own limiter in Redis (exact across API replicas); past it: 429 with Retry-After."`
	NotificationRate  string        `env:"API_NOTIFICATION_RATE" envDefault:"1000/1s" desc:"Notifications per token, LIMIT/WINDOW: a batch counts each of its notifications (LIMIT at least 500, the largest batch), counted exactly across API replicas; past it: 429 rate-limited with Retry-After, nothing enqueued. API_RATE still bounds requests."`
	AuthFailures      string        `env:"API_AUTH_FAILURES" envDefault:"20/1m" desc:"Failed authentications per client address, LIMIT/WINDOW, /v1 bearer tokens and dashboard sign-ins together; past it the client gets 429 (problem auth-limited, Retry-After) without its credential being checked, until its oldest failure leaves the window. Only failures count, and only the client's own: a valid token from another address is never refused."`
	ClientIPHeader    string        `env:"API_CLIENT_IP_HEADER" desc:"Header a trusted reverse proxy puts the client's address in (X-Forwarded-For: its last entry, the one the proxy appended; X-Real-IP), by which failed authentications are counted; empty: the peer address. Set it only when every request comes through that proxy: a client reaching the API directly could set the header itself."`
	MaxConns          int           `env:"API_MAX_CONNS" envDefault:"1024" desc:"Most client connections the API holds open at once (keep-alive and streams included). When all are taken the one idle longest between requests is closed to make room; a newcomer waits in the listen backlog only while no connection is idle (a connection still sending its first request head holds its slot for 5 s at most). Each costs a goroutine, a file descriptor and up to MAX_HEADER_BYTES of buffer; keep it under the process's open-file limit. The dashboard's live streams take at most a quarter of it (docs/security.md)."`
	MaxConnsPerClient int           `env:"API_MAX_CONNS_PER_CLIENT" envDefault:"256" desc:"Most connections one peer address holds at once (at most MAX_CONNS in any case); past it the client's own idle connection is closed, or the new one answered 503 (Retry-After: 1). 0: no bound but MAX_CONNS. Behind a reverse proxy every connection comes from the proxy: set 0, or more than the proxy's pool."`
	IdleTimeout       time.Duration `env:"API_IDLE_TIMEOUT" envDefault:"30s" desc:"How long a keep-alive connection may stay idle between requests before the API closes it (sooner when its slot is needed: MAX_CONNS). Behind a load balancer set it above the balancer's own idle timeout. 1s-10m."`
	MaxHeaderBytes    int           `env:"API_MAX_HEADER_BYTES" envDefault:"32768" desc:"Largest request head in bytes: the request line, the header lines and the blank line that ends them, each with its CRLF; one byte more: 431, which the client reads before the connection closes. 8192-1048576."`
	MaxBodyBytes      int64         `env:"API_MAX_BODY_BYTES" envDefault:"4194304" desc:"Largest request body in bytes (a batch holds at most 500 notifications); larger: 413."`
	IdempotencyTTL    time.Duration `env:"API_IDEMPOTENCY_TTL" envDefault:"24h" desc:"How long the response to a request with an Idempotency-Key is kept and replayed to a retry with the same key and body (at least 24h)."`
	ReadTimeout       time.Duration `env:"API_READ_TIMEOUT" envDefault:"30s" desc:"How long a client may take to send a whole request; an Idempotency-Key is held as in flight at most this long plus 30s."`
	BodyTimeout       time.Duration `env:"API_UNAUTHENTICATED_BODY_TIMEOUT" envDefault:"5s" desc:"How long a request to a route no bearer token authenticates (a provider's webhook or callback, an unsubscribe link, the dashboard's forms) may take to send its body after its head; past it the body's read fails and the connection is closed. Such routes check what the head carries (the tenant's credentials, a signature header, a timestamp) before they read a body. 100ms up to READ_TIMEOUT."`
	ShutdownTimeout   time.Duration `env:"API_SHUTDOWN_TIMEOUT" envDefault:"10s" desc:"On SIGTERM, how long requests in flight may take to finish; new connections are refused and /readyz answers 503 meanwhile."`
}

// ReadConfig reads the API's variables from environ (nil: the process
// environment) without validating them.
func ReadConfig(environ map[string]string) (Config, error) {
	var cfg Config
	if err := config.Read(environ, &cfg); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return cfg, nil
}

// ParseConfig reads and validates the API's variables.
func ParseConfig(environ map[string]string) (Config, error) {
	cfg, err := ReadConfig(environ)
	if err != nil {
		return Config{}, err
	}
	return cfg, cfg.Validate()
}

// MinHeaderBytes is the smallest SLUICE_API_MAX_HEADER_BYTES: net/http
// reads a head up to its MaxHeaderBytes plus 4096 bytes of slack, so the
// server is given the setting less that slack (which must leave at least
// 4096 to count).
const MinHeaderBytes = 8192

// headerSlack is what net/http adds to Server.MaxHeaderBytes when it
// limits the bytes read for a request head (net/http's
// initialReadLimitSize): the API passes MAX_HEADER_BYTES less it, so a
// head of exactly MAX_HEADER_BYTES is read and one byte more is 431.
const headerSlack = 4096

// MinTokenKey is the shortest SLUICE_API_TOKEN_KEY accepted.
const MinTokenKey = 32

// Validate checks every field, the shared ones included; each error names
// the variable and the bound.
func (c Config) Validate() error {
	var p config.Problems
	c.Base.Validate(&p)
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %sAPI_%s %s", ErrConfig, config.EnvPrefix, name, fmt.Sprintf(format, args...)))
	}
	if c.Addr == "" {
		bad("ADDR", "must not be empty")
	} else if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		bad("ADDR", "must be host:port or :port, got %q", c.Addr)
	}
	if err := CheckTokenKey(c.TokenKey); err != nil {
		bad("TOKEN_KEY", "%v", err)
	}
	if c.AdminToken != "" && len(c.AdminToken) < 32 {
		bad("ADMIN_TOKEN", "must be empty (no admin) or at least 32 characters (e.g. `openssl rand -hex 32`), got %d", len(c.AdminToken))
	}
	if _, err := c.RateRule(); err != nil {
		bad("RATE", "%v", err)
	}
	if r, err := c.NotificationRule(); err != nil {
		bad("NOTIFICATION_RATE", "%v", err)
	} else if r.Limit < MaxBatch {
		bad("NOTIFICATION_RATE", "must allow at least %d notifications (the largest batch), got %q", MaxBatch, c.NotificationRate)
	}
	if r, err := throttle.ParseRule(c.AuthFailures); err != nil {
		bad("AUTH_FAILURES", "%v", err)
	} else if r.Limit < 1 {
		bad("AUTH_FAILURES", "must allow at least 1 failure, got %q", c.AuthFailures)
	}
	if c.ClientIPHeader != "" && strings.ContainsAny(c.ClientIPHeader, " :\r\n") {
		bad("CLIENT_IP_HEADER", "must be a header name, got %q", c.ClientIPHeader)
	}
	if c.MaxConns < 16 || c.MaxConns > 1<<20 {
		bad("MAX_CONNS", "must be between 16 and 1048576, got %d", c.MaxConns)
	}
	if c.MaxConnsPerClient < 0 {
		bad("MAX_CONNS_PER_CLIENT", "must be 0 (no bound of its own) or more, got %d", c.MaxConnsPerClient)
	}
	if c.IdleTimeout < time.Second || c.IdleTimeout > 10*time.Minute {
		bad("IDLE_TIMEOUT", "must be between 1s and 10m, got %v", c.IdleTimeout)
	}
	if c.MaxHeaderBytes < MinHeaderBytes || c.MaxHeaderBytes > 1<<20 {
		bad("MAX_HEADER_BYTES", "must be between %d and 1048576, got %d", MinHeaderBytes, c.MaxHeaderBytes)
	}
	if c.MaxBodyBytes < 64<<10 || c.MaxBodyBytes > 256<<20 {
		bad("MAX_BODY_BYTES", "must be between 65536 and 268435456, got %d", c.MaxBodyBytes)
	}
	if c.IdempotencyTTL < 24*time.Hour {
		bad("IDEMPOTENCY_TTL", "must be at least 24h (the Idempotency-Key draft's minimum), got %v", c.IdempotencyTTL)
	}
	if c.ReadTimeout < time.Second || c.ReadTimeout > 10*time.Minute {
		bad("READ_TIMEOUT", "must be between 1s and 10m, got %v", c.ReadTimeout)
	}
	if c.BodyTimeout < 100*time.Millisecond || c.BodyTimeout > c.ReadTimeout {
		bad("UNAUTHENTICATED_BODY_TIMEOUT", "must be between 100ms and READ_TIMEOUT (%v), got %v", c.ReadTimeout, c.BodyTimeout)
	}
	if c.ShutdownTimeout < 0 || c.ShutdownTimeout > 10*time.Minute {
		bad("SHUTDOWN_TIMEOUT", "must be between 0 and 10m, got %v", c.ShutdownTimeout)
	}
	return errors.Join(p.Err(), errors.Join(errs...))
}

// CheckTokenKey reports whether key can key the token HMAC.
func CheckTokenKey(key string) error {
	if len(key) < MinTokenKey {
		return fmt.Errorf("must be set to at least %d bytes (e.g. `openssl rand -hex 32`)", MinTokenKey)
	}
	return nil
}

// RateRule is the per-token request rule of SLUICE_API_RATE.
func (c Config) RateRule() (throttle.Rule, error) { return throttle.ParseRule(c.Rate) }

// failures is the failed-authentication limit of the configuration (validated).
func (c Config) failures(lim *throttle.Limiter) *failures {
	r, _ := throttle.ParseRule(c.AuthFailures)
	h := ""
	if c.ClientIPHeader != "" {
		h = http.CanonicalHeaderKey(c.ClientIPHeader)
	}
	return &failures{lim: lim, rule: r, header: h}
}

// lockTTL bounds how long an Idempotency-Key stays in flight after its
// holder vanished: the time to send the body plus the time to enqueue.
func (c Config) lockTTL() time.Duration { return c.ReadTimeout + 30*time.Second }

// ConfigVars lists the API's own variables, in declaration order (the
// shared ones are config.Base's).
func ConfigVars() []config.Var { return config.Vars(Settings{}) }

// KnownVariables are the names Config reads, the shared ones included.
func KnownVariables() []string { return config.Names(Config{}) }

// Redacted returns the configuration as NAME=value pairs, secrets masked.
func (c Config) Redacted() []string { return config.Redacted(c) }
