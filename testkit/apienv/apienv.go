// Package apienv runs the API process for tests as `sluice api` assembles
// it (app.NewAPI: the ingest API, the dashboard, the providers'
// callbacks and webhooks), on a private redis-server, with a fake SMS API
// for the workers a test may run, tokens for two tenants and the admin.
// The api and dashboard tests share it; each keeps its own extras.
package apienv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/worker"
)

const (
	// AdminToken is SLUICE_API_ADMIN_TOKEN.
	AdminToken = "admin-token-0123456789abcdef0123456789"
	// TokenKey is SLUICE_API_TOKEN_KEY, the HMAC key tokens are stored under.
	TokenKey = "token-key-0123456789abcdef0123456789"
	// SubjectSecret is SLUICE_SUBJECT_SECRET.
	SubjectSecret = "test-secret-0123456789"
)

// Env is an API process serving on a loopback address, over its own
// redis-server.
type Env struct {
	Redis *redistest.Server
	RDB   *redis.Client
	// SMS is the fake SMS API the workers' configuration sends to.
	SMS *fakes.SMSAPI
	API *api.Server
	// HTTP serves API.Handler().
	HTTP      *httptest.Server
	Inspector *asynq.Inspector
	// Keys is the key ring of SLUICE_PAYLOAD_KEYS, fresh for each Env.
	Keys *tasks.Keyring
	// Config is the API's configuration, WorkerConfig a worker's on the
	// same variables (for tests that run one, and for its layout).
	Config       api.Config
	WorkerConfig worker.Config
	// Vars is the environment both configurations were parsed from.
	Vars map[string]string
	// Tokens holds a token for each of the tenants acme and globex.
	Tokens map[string]string
	// CallbackURL is SLUICE_SMS_STATUS_CALLBACK_URL: HTTP's own address.
	CallbackURL string
}

// New starts a redis-server, the fake SMS API and the API process with
// SLUICE_RULES rules, and makes tokens for acme and globex. vars adds to or
// overrides the variables New sets; SMS ask for status callbacks at the
// API. Everything stops when the test ends.
func New(tb testing.TB, rules string, vars map[string]string) *Env {
	tb.Helper()
	srv, rdb := redistest.New(tb)
	e := &Env{Redis: srv, RDB: rdb, SMS: fakes.NewSMSAPI(tb), Tokens: map[string]string{}}
	// The listener first: its address is the callback URL in the config.
	e.HTTP = httptest.NewUnstartedServer(nil)
	tb.Cleanup(e.HTTP.Close) // if New fails before it serves
	e.CallbackURL = "http://" + e.HTTP.Listener.Addr().String()
	keys := tasks.NewKeySpec("apienv")
	e.Vars = map[string]string{
		"SLUICE_SMS_STATUS_CALLBACK_URL": e.CallbackURL,
		"SLUICE_REDIS_URL":               srv.URL(),
		"SLUICE_RULES":                   rules,
		"SLUICE_SUBJECT_SECRET":          SubjectSecret,
		"SLUICE_PAYLOAD_KEYS":            keys,
		"SLUICE_HTTP_ADDR":               "off",
		"SLUICE_SMS_SENDER":              "http",
		"SLUICE_SMS_BASE_URL":            e.SMS.URL,
		"SLUICE_SMS_ACCOUNT_SID":         e.SMS.AccountSID,
		"SLUICE_SMS_AUTH_TOKEN":          e.SMS.AuthToken,
		"SLUICE_SMS_FROM":                "+15005550006",
		"SLUICE_PLAN_CHECK_INTERVAL":     "200ms",
		"SLUICE_API_TOKEN_KEY":           TokenKey,
		"SLUICE_API_ADMIN_TOKEN":         AdminToken,
		"SLUICE_API_RATE":                "1000/1s",
	}
	maps.Copy(e.Vars, vars)
	var err error
	if e.WorkerConfig, err = worker.ParseConfig(e.Vars); err != nil {
		tb.Fatal(err)
	}
	if e.Config, err = api.ParseConfig(e.Vars); err != nil {
		tb.Fatal(err)
	}
	if e.Keys, err = tasks.ParseKeyring(keys); err != nil {
		tb.Fatal(err)
	}
	e.API = e.NewServer(tb, app.APIOptions{})
	e.HTTP.Config.Handler = e.API.Handler()
	e.HTTP.Start()
	tb.Cleanup(e.HTTP.Close) // before the server closes: no request is left to it
	e.Inspector = asynq.NewInspectorFromRedisClient(rdb)
	for _, tenant := range []string{"acme", "globex"} {
		tok, _, err := e.API.Tokens().Create(context.Background(), tenant, "test", "test")
		if err != nil {
			tb.Fatal(err)
		}
		e.Tokens[tenant] = tok
	}
	return e
}

// NewServer builds another API process on the Env's configuration, as
// New built API, watching tenant plans until the test ends, when it is
// closed. opts default to the Env's Redis client and a logger of errors
// to the test's output (the registry, as app's: one of its own).
func (e *Env) NewServer(tb testing.TB, opts app.APIOptions) *api.Server {
	tb.Helper()
	if opts.Redis == nil {
		opts.Redis = e.RDB
	}
	if opts.Logger == nil {
		opts.Logger = errorLog(tb)
	}
	srv, err := app.NewAPI(e.Config, e.Vars, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(srv.Close)
	// tb.Context ends before the cleanups run: the watcher stops first.
	if err := srv.WatchPlans(tb.Context()); err != nil {
		tb.Fatal(err)
	}
	return srv
}

// errorLog logs errors to the test's output (shown when it fails, or with
// -v): a page that answers 503 says why.
func errorLog(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tb.Output(), &slog.HandlerOptions{Level: slog.LevelError}))
}

// Another is a copy of the Env whose API is a second process (NewServer
// with opts) serving on its own loopback address; the rest — Redis, the
// tokens, the configuration — is shared.
func (e *Env) Another(tb testing.TB, opts app.APIOptions) *Env {
	tb.Helper()
	other := *e
	other.API = e.NewServer(tb, opts)
	other.HTTP = httptest.NewServer(other.API.Handler())
	tb.Cleanup(other.HTTP.Close)
	return &other
}

// RunWorker runs a worker on WorkerConfig until the test ends, when it
// fails the test if Run returned an error. opts default to the Env's Redis
// client and a logger of errors to the test's output (the registry, as
// app's: one of its own).
func (e *Env) RunWorker(tb testing.TB, opts app.WorkerOptions) {
	tb.Helper()
	if opts.Redis == nil {
		opts.Redis = e.RDB
	}
	if opts.Logger == nil {
		opts.Logger = errorLog(tb)
	}
	w, err := app.NewWorker(e.WorkerConfig, opts)
	if err != nil {
		tb.Fatal(err)
	}
	sluicetest.Background(tb, "worker.Run", w.Run)
}

// Do sends a request to the Env's API: Call with HTTP's address.
func (e *Env) Do(tb testing.TB, method, path, token string, body any, headers ...string) Reply {
	tb.Helper()
	return Call(tb, e.HTTP.URL, method, path, token, body, headers...)
}

// Queued lists every task Asynq holds, in any state, in the layout's
// queues, those in the tenants' waiting rooms (Asynq's groups) included.
func (e *Env) Queued(tb testing.TB) []*asynq.TaskInfo {
	tb.Helper()
	var all []*asynq.TaskInfo
	for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){
		e.Inspector.ListPendingTasks, e.Inspector.ListScheduledTasks, e.Inspector.ListRetryTasks,
		e.Inspector.ListActiveTasks, e.Inspector.ListArchivedTasks,
	} {
		for _, q := range e.Config.Layout().Queues() {
			ts, err := list(q, asynq.PageSize(1000))
			if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
				tb.Fatal(err)
			}
			all = append(all, ts...)
		}
	}
	return append(all, e.waiting(tb)...)
}

// waiting lists the tasks in every tenant's waiting room.
func (e *Env) waiting(tb testing.TB) []*asynq.TaskInfo {
	tb.Helper()
	var all []*asynq.TaskInfo
	for _, q := range e.Config.Layout().Queues() {
		groups, err := e.Inspector.Groups(q)
		if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
			tb.Fatal(err)
		}
		for _, g := range groups {
			ts, err := e.Inspector.ListAggregatingTasks(q, g.Group, asynq.PageSize(1000))
			if err != nil {
				tb.Fatal(err)
			}
			all = append(all, ts...)
		}
	}
	return all
}

// Task finds a notification's task in whichever queue of the layout holds
// it.
func (e *Env) Task(tb testing.TB, id string) (*asynq.TaskInfo, error) {
	tb.Helper()
	return e.Config.Layout().FindTask(e.Inspector, "", nil, id)
}

// NewSMS is the body of a request for an SMS notification.
func NewSMS(to, body string) map[string]any {
	return map[string]any{"channel": "sms", "to": to, "body": body}
}

// Reply is an answer of the API.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the answer's body into v, failing tb if it is not JSON.
func (r Reply) JSON(tb testing.TB, v any) {
	tb.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		tb.Fatalf("answer %d is not JSON: %v: %s", r.Status, err, r.Body)
	}
}

// Problem decodes the answer as an RFC 9457 problem document, failing tb
// unless it is one that matches the answer's status.
func (r Reply) Problem(tb testing.TB) api.Problem {
	tb.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		tb.Fatalf("answer %d has Content-Type %q, want application/problem+json: %s", r.Status, ct, r.Body)
	}
	var p api.Problem
	r.JSON(tb, &p)
	if p.Status != r.Status || !strings.HasPrefix(p.Type, api.ProblemBase) || p.Title == "" {
		tb.Fatalf("problem does not match its answer %d: %+v", r.Status, p)
	}
	return p
}

// Call sends one request to base+path with token (no Authorization if
// empty) and headers (name, value, …). body is nil, a string, a []byte, an
// io.Reader, or a value sent as JSON; a body is sent as application/json
// unless headers say otherwise.
func Call(tb testing.TB, base, method, path, token string, body any, headers ...string) Reply {
	tb.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(v)
	case []byte:
		rd = bytes.NewReader(v)
	case io.Reader:
		rd = v
	default:
		raw, err := json.Marshal(v)
		if err != nil {
			tb.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		tb.Fatal(err)
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
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: reading the answer: %v", method, path, err)
	}
	return Reply{resp.StatusCode, resp.Header, raw}
}
