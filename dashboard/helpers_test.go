package dashboard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/internal/app"
	"github.com/sluicehq/sluice/internal/fakes"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/worker"
)

var testKeys = tasks.NewKeySpec("dashtest")

const (
	adminToken = "admin-token-0123456789abcdef0123456789"
	tokenKey   = "token-key-0123456789abcdef0123456789"
)

// bundle is the API server with the dashboard mounted on it, as `sluice
// api` runs them, on a private redis-server.
type bundle struct {
	rdb    *redis.Client
	srv    *api.Server
	http   *httptest.Server
	insp   *asynq.Inspector
	keys   *tasks.Keyring
	cfg    api.Config
	wcfg   worker.Config // for the browser test's worker
	vars   map[string]string
	tokens map[string]string
}

// setup starts a redis-server, a fake SMS API (for a worker the test may
// run), the API with the dashboard, tokens for acme and globex, and an
// admin token. env adds or overrides variables.
func setup(t *testing.T, rules string, env map[string]string) *bundle {
	t.Helper()
	srv, rdb := redistest.New(t)
	sms := fakes.NewSMSAPI(t)
	b := &bundle{rdb: rdb, tokens: map[string]string{}}
	vars := map[string]string{
		"SLUICE_REDIS_URL":           srv.URL(),
		"SLUICE_RULES":               rules,
		"SLUICE_SUBJECT_SECRET":      "test-secret-0123456789",
		"SLUICE_PAYLOAD_KEYS":        testKeys,
		"SLUICE_HTTP_ADDR":           "off",
		"SLUICE_SMS_SENDER":          "http",
		"SLUICE_SMS_BASE_URL":        sms.URL,
		"SLUICE_SMS_ACCOUNT_SID":     sms.AccountSID,
		"SLUICE_SMS_AUTH_TOKEN":      sms.AuthToken,
		"SLUICE_SMS_FROM":            "+15005550006",
		"SLUICE_PLAN_CHECK_INTERVAL": "200ms",
		"SLUICE_API_TOKEN_KEY":       tokenKey,
		"SLUICE_API_ADMIN_TOKEN":     adminToken,
		"SLUICE_API_RATE":            "1000/1s",
	}
	for k, v := range env {
		vars[k] = v
	}
	var err error
	if b.wcfg, err = worker.ParseConfig(vars); err != nil {
		t.Fatal(err)
	}
	if b.cfg, err = api.ParseConfig(vars); err != nil {
		t.Fatal(err)
	}
	b.keys, _ = tasks.ParseKeyring(testKeys)
	b.vars = vars
	b.srv = b.newServer(t, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := b.srv.WatchPlans(ctx); err != nil {
		t.Fatal(err)
	}
	b.http = httptest.NewServer(b.srv.Handler())
	t.Cleanup(b.http.Close)
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

// newServer builds the API process with the dashboard, as `sluice api`
// does (internal/apiserver), logging to log.
func (b *bundle) newServer(t *testing.T, log *slog.Logger) *api.Server {
	t.Helper()
	srv, err := app.NewAPI(b.cfg, b.vars, app.APIOptions{Redis: b.rdb, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// reply is an answer of the API.
type reply struct {
	status int
	body   []byte
}

func (r reply) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("answer %d is not JSON: %v: %s", r.status, err, r.body)
	}
}

// do sends an API request with token.
func (b *bundle) do(t *testing.T, method, path, token string, body any) reply {
	t.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
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
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, raw}
}

// queued lists every task Asynq holds in the layout's queues.
func (b *bundle) queued(t *testing.T) []*asynq.TaskInfo {
	t.Helper()
	var all []*asynq.TaskInfo
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		b.insp.ListPendingTasks, b.insp.ListScheduledTasks, b.insp.ListRetryTasks, b.insp.ListActiveTasks, b.insp.ListArchivedTasks,
	} {
		for _, q := range b.cfg.Layout().Queues() {
			ts, err := list(q, asynq.PageSize(1000))
			if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
				t.Fatal(err)
			}
			all = append(all, ts...)
		}
	}
	return all
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
