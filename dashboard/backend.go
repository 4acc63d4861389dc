package dashboard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/digest"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/services"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// ErrBackend reports a Backend that lacks a part the dashboard needs.
var ErrBackend = errors.New("dashboard: incomplete backend")

// Backend is everything the dashboard reads and changes besides its own
// cookies. It holds no Redis client: windows come through the limiter,
// tasks through Asynq's inspector, plans through their store, tokens
// through Auth.
type Backend struct {
	// Settings are the deployment's shared settings: the queue layout, the
	// planner (zones, SLUICE_SEND_SLACK), the senders' default origins and
	// whether plaintext payloads are accepted.
	Settings config.Base
	// Log receives the dashboard's own lines (sign-ins, resets, Redis trouble).
	Log *slog.Logger
	// Limiter reads the windows (report.Quotas, Series), resets one,
	// hashes a recipient as it is keyed, and limits sign-in attempts.
	Limiter *throttle.Limiter
	// Plans are the rules in force.
	Plans *plans.Live
	// PlanStore reads a tenant's plan while Plans is not following the
	// store, and the history of plan changes.
	PlanStore *plans.Store
	// Keys open the payloads of the tasks listed (SLUICE_PAYLOAD_KEYS);
	// nil: sealed ones are counted as unreadable.
	Keys *tasks.Keyring
	// Queues lists the tasks Asynq holds and the queues' depths.
	Queues Inspector
	// Auth checks the API tokens browsers sign in with.
	Auth Auth
	// Queued reads each tenant's queued work against its caps
	// (SLUICE_TENANT_MAX_QUEUED*); nil: not shown.
	Queued *tasks.QueueQuota
	// Stopping reports that the server is shutting down: live streams end.
	// Nil: never.
	Stopping func() bool
	// Consent reads a recipient's suppressions and ledger for the
	// recipient page; nil: the page says consent is not shown.
	Consent *consent.Store
	// Digests reads the digests open for a recipient for the recipient
	// page; nil: not shown.
	Digests *digest.Store
	// MaxConns is the server's SLUICE_API_MAX_CONNS: the live streams'
	// caps are derived from it (StreamCaps); 0: the caps of 1024.
	MaxConns int
}

// Inspector is what the dashboard reads of Asynq: an *asynq.Inspector.
type Inspector interface {
	Queues() ([]string, error)
	GetQueueInfo(queue string) (*asynq.QueueInfo, error)
	Groups(queue string) ([]*asynq.GroupInfo, error)
	ListAggregatingTasks(queue, group string, opts ...asynq.ListOption) ([]*asynq.TaskInfo, error)
	ListPendingTasks(queue string, opts ...asynq.ListOption) ([]*asynq.TaskInfo, error)
	ListRetryTasks(queue string, opts ...asynq.ListOption) ([]*asynq.TaskInfo, error)
	ListScheduledTasks(queue string, opts ...asynq.ListOption) ([]*asynq.TaskInfo, error)
	ListArchivedTasks(queue string, opts ...asynq.ListOption) ([]*asynq.TaskInfo, error)
}

var _ Inspector = (*asynq.Inspector)(nil)

// Auth checks API tokens as the API does (*api.Auth is one). The admin is
// the tenant "".
type Auth interface {
	// Identify resolves a token: the admin's (tenant "") or a tenant's,
	// with the id it is logged as. ok is false for a token unknown or
	// revoked; err reports Redis trouble.
	Identify(ctx context.Context, token string) (tenant, tokenID string, ok bool, err error)
	// Valid reports whether a token Identify resolved is valid still (not
	// revoked; for the admin, an admin token still configured).
	Valid(ctx context.Context, tenant, tokenID string) (bool, error)
	// Tenants lists the tenants holding tokens, as far as a bounded scan
	// gets (more: it stopped before the end).
	Tenants(ctx context.Context) (tenants []string, more bool, err error)
	// SessionKey is a key for purpose that changes whenever a token
	// secret does (the token key, the admin token), signing every browser out.
	SessionKey(purpose string) []byte
	// Client is the address failed sign-ins of r are counted by (the
	// peer, or a trusted proxy's header).
	Client(r *http.Request) string
	// Locked reports whether client failed too often, and for how long more.
	Locked(ctx context.Context, client string) (wait time.Duration, locked bool, err error)
	// Failed counts one failed sign-in of client.
	Failed(ctx context.Context, client string) error
	// EndSession signs out the session named by nonce until expires.
	EndSession(ctx context.Context, nonce string, expires time.Time) error
	// Ended reports whether the session named by nonce was signed out.
	Ended(ctx context.Context, nonce string) (bool, error)
	// Allow counts one request of tokenID against the per-token rate the
	// API's requests count against too; ok is false past it.
	Allow(ctx context.Context, tokenID string) (wait time.Duration, ok bool, err error)
}

// Mounter is the server the dashboard's routes are mounted on (*api.Server
// is one). Mount puts a handler behind the server's access log and
// metrics; MountBare serves it as is (static files). The ResponseWriter a
// mounted handler gets may have SetIdentity(tenant, tokenID string), to
// name the signed-in token in the access log, and Unwrap, for
// http.ResponseController.
type Mounter interface {
	Mount(pattern string, h http.Handler)
	MountBare(pattern string, h http.Handler)
}

// NewBackend fills a Backend from the services of the process the
// dashboard is mounted in (services), with its server's token
// checks and shutdown state.
func NewBackend(base config.Base, deps *services.Set, auth Auth, stopping func() bool, maxConns int) Backend {
	return Backend{MaxConns: maxConns, Settings: base, Log: deps.Log, Limiter: deps.Limiter, Plans: deps.Plans,
		PlanStore: plans.NewStore(deps.Redis, deps.Plans.Defaults()), Keys: deps.Keys,
		Queues: asynq.NewInspectorFromRedisClient(deps.Redis), Auth: auth, Stopping: stopping, Consent: deps.Consent, Queued: deps.Queued,
		Digests: digest.New(deps.Redis, deps.Limiter)}
}

func (b Backend) check() error {
	var missing []string
	for _, p := range []struct {
		name string
		nil_ bool
	}{{"Log", b.Log == nil}, {"Limiter", b.Limiter == nil}, {"Plans", b.Plans == nil}, {"PlanStore", b.PlanStore == nil},
		{"Queues", b.Queues == nil}, {"Auth", b.Auth == nil}} {
		if p.nil_ {
			missing = append(missing, p.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: no %s", ErrBackend, strings.Join(missing, ", "))
	}
	return nil
}
