package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/internal/app"
	"github.com/sluicehq/sluice/internal/fakes"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

var testKeys = tasks.NewKeySpec("apitest")

const (
	adminToken = "admin-token-0123456789abcdef0123456789"
	tokenKey   = "token-key-0123456789abcdef0123456789"
)

type bundle struct {
	redis  *redistest.Server
	rdb    *redis.Client
	sms    *fakes.SMSAPI
	srv    *api.Server
	http   *httptest.Server
	insp   *asynq.Inspector
	keys   *tasks.Keyring
	cfg    api.Config
	wcfg   worker.Config
	tokens map[string]string // tenant → token
	// callbackURL is SLUICE_SMS_STATUS_CALLBACK_URL: the API's own address.
	callbackURL string
	vars        map[string]string // the environment the servers read
}

// setup starts a redis-server, a fake SMS API, the API with tokens for
// acme and globex, and an admin token. SMS ask for status callbacks at the
// API. env adds or overrides variables.
func setup(t *testing.T, rules string, env map[string]string) *bundle {
	t.Helper()
	srv, rdb := redistest.New(t)
	b := &bundle{redis: srv, rdb: rdb, sms: fakes.NewSMSAPI(t), tokens: map[string]string{}}
	// The listener first: its address is the callback URL in the config.
	b.http = httptest.NewUnstartedServer(nil)
	t.Cleanup(b.http.Close)
	b.callbackURL = "http://" + b.http.Listener.Addr().String()
	vars := map[string]string{
		"SLUICE_SMS_STATUS_CALLBACK_URL": b.callbackURL,
		"SLUICE_REDIS_URL":               srv.URL(),
		"SLUICE_RULES":                   rules,
		"SLUICE_SUBJECT_SECRET":          "test-secret-0123456789",
		"SLUICE_PAYLOAD_KEYS":            testKeys,
		"SLUICE_HTTP_ADDR":               "off",
		"SLUICE_SMS_SENDER":              "http",
		"SLUICE_SMS_BASE_URL":            b.sms.URL,
		"SLUICE_SMS_ACCOUNT_SID":         b.sms.AccountSID,
		"SLUICE_SMS_AUTH_TOKEN":          b.sms.AuthToken,
		"SLUICE_SMS_FROM":                "+15005550006",
		"SLUICE_PLAN_CHECK_INTERVAL":     "200ms",
		"SLUICE_API_TOKEN_KEY":           tokenKey,
		"SLUICE_API_ADMIN_TOKEN":         adminToken,
		"SLUICE_API_RATE":                "1000/1s",
	}
	for k, v := range env {
		vars[k] = v
	}
	b.vars = vars
	var err error
	if b.wcfg, err = worker.ParseConfig(vars); err != nil {
		t.Fatal(err)
	}
	if b.cfg, err = api.ParseConfig(vars); err != nil {
		t.Fatal(err)
	}
	b.keys, _ = tasks.ParseKeyring(testKeys)
	// As sluice api assembles it: the status callbacks, inbound SMS and the
	// one-click unsubscribe links mounted beside the API.
	b.srv, err = app.NewAPI(b.cfg, vars, app.APIOptions{Redis: rdb, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := b.srv.WatchPlans(ctx); err != nil {
		t.Fatal(err)
	}
	b.http.Config.Handler = b.srv.Handler()
	b.http.Start()
	b.insp = asynq.NewInspectorFromRedisClient(rdb)
	for _, tenant := range []string{"acme", "globex"} {
		tok, _, err := b.srv.Tokens().Create(context.Background(), tenant, "test", "test")
		if err != nil {
			t.Fatal(err)
		}
		b.tokens[tenant] = tok
	}
	return b
}

// reply is an answer of the API.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("answer %d is not JSON: %v: %s", r.status, err, r.body)
	}
}

func (r reply) problem(t *testing.T) api.Problem {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("answer %d has Content-Type %q, want application/problem+json: %s", r.status, ct, r.body)
	}
	var p api.Problem
	r.json(t, &p)
	if p.Status != r.status || !strings.HasPrefix(p.Type, api.ProblemBase) || p.Title == "" {
		t.Fatalf("problem does not match its answer %d: %+v", r.status, p)
	}
	return p
}

// do sends a request with token (none if empty) and extra headers.
func (b *bundle) do(t *testing.T, method, path, token string, body any, headers ...string) reply {
	t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(v)
	case []byte:
		rd = bytes.NewReader(v)
	default:
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, b.http.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, raw}
}

func (b *bundle) queued(t *testing.T) []*asynq.TaskInfo {
	t.Helper()
	var all []*asynq.TaskInfo
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		b.insp.ListPendingTasks, b.insp.ListScheduledTasks, b.insp.ListRetryTasks, b.insp.ListActiveTasks, b.insp.ListArchivedTasks,
	} {
		for _, q := range b.wcfg.Layout().Queues() {
			ts, err := list(q, asynq.PageSize(1000))
			if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
				t.Fatal(err)
			}
			all = append(all, ts...)
		}
	}
	return append(all, waiting(t, b.insp, b.wcfg.Layout())...)
}

// waiting lists the tasks in every tenant's waiting room (Asynq's groups).
func waiting(t *testing.T, insp *asynq.Inspector, layout tasks.Layout) []*asynq.TaskInfo {
	t.Helper()
	var all []*asynq.TaskInfo
	for _, q := range layout.Queues() {
		groups, err := insp.Groups(q)
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			t.Fatal(err)
		}
		for _, g := range groups {
			ts, err := insp.ListAggregatingTasks(q, g.Group, asynq.PageSize(1000))
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, ts...)
		}
	}
	return all
}

// task finds a notification's task in whichever queue holds it.
func (b *bundle) task(t *testing.T, id string) (*asynq.TaskInfo, error) {
	t.Helper()
	return b.wcfg.Layout().FindTask(b.insp, "", nil, id)
}

func sms(to, body string) map[string]any {
	return map[string]any{"channel": "sms", "to": to, "body": body}
}

// eventually polls cond every 20 ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// markSent writes the limiter's done record of a notification, as a worker
// does after the provider took it.
func markSent(t *testing.T, b *bundle, tenant, id string) {
	t.Helper()
	lim, err := throttle.New(b.rdb, throttle.Options{Secret: []byte(b.wcfg.SubjectSecret), CompactMembers: b.wcfg.CompactMembers})
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	rec := fmt.Sprintf("d1:%d", time.Now().UnixMilli())
	if err := b.rdb.Set(context.Background(), lim.StateKey(tenant, id), rec, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
}

// another starts a second API server on the bundle's configuration (and
// its Redis unless opts names another), serving on its own loopback
// address, for tests that need other Options; its tokens are the bundle's.
func (b *bundle) another(t *testing.T, ctx context.Context, opts app.APIOptions) *bundle {
	t.Helper()
	if opts.Redis == nil {
		opts.Redis = b.rdb
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	srv, err := app.NewAPI(b.cfg, b.vars, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	if err := srv.WatchPlans(ctx); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	other := *b
	other.srv, other.http = srv, hs
	return &other
}
