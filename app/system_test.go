package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/webhook"
	"github.com/sluicehq/sluice/webhook/postmark"
	"github.com/sluicehq/sluice/worker"
)

const (
	systemRules = "sms:recipient=10/1m,email:recipient=10/1m,sms:reply-stop=You will get no more texts,acme/sms:inbound=+15005550006"
	smsTo       = "+14155550100"
)

// system is a worker and the API as `sluice worker` and `sluice api` run
// them (app), each with its own Redis client, against a fake SMS
// API and SMTP server.
type system struct {
	rdb   redis.UniversalClient
	vars  map[string]string
	sms   *fakes.SMSAPI
	smtp  *fakes.SMTPServer
	api   *api.Server
	base  string // the API's URL, and the status callbacks'
	stops []func() error
}

func startSystem(t *testing.T, redisVars map[string]string, rdb redis.UniversalClient) *system {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &system{rdb: rdb, sms: fakes.NewSMSAPI(t), smtp: fakes.NewSMTPServer(t), base: "http://" + ln.Addr().String()}
	s.vars = map[string]string{
		"SLUICE_RULES": systemRules, "SLUICE_SUBJECT_SECRET": "test-secret-0123456789",
		"SLUICE_PAYLOAD_KEYS": tasks.NewKeySpec("keys"), "SLUICE_QUEUE_SHARDS": "1", "SLUICE_HTTP_ADDR": "off",
		"SLUICE_EMAIL_SENDER": "smtp", "SLUICE_SMTP_HOST": s.smtp.Host, "SLUICE_SMTP_PORT": strconv.Itoa(s.smtp.Port), "SLUICE_SMTP_TLS": "none",
		"SLUICE_SMS_SENDER": "http", "SLUICE_SMS_BASE_URL": s.sms.URL, "SLUICE_SMS_ACCOUNT_SID": s.sms.AccountSID,
		"SLUICE_SMS_AUTH_TOKEN": s.sms.AuthToken, "SLUICE_SMS_FROM": "+15005550006", "SLUICE_SMS_STATUS_CALLBACK_URL": s.base,
		"SLUICE_API_TOKEN_KEY": "token-key-0123456789abcdef0123456789", "SLUICE_POLL_INTERVAL": "100ms",
		"SLUICE_PLAN_CHECK_INTERVAL": "200ms", "SLUICE_SHUTDOWN_TIMEOUT": "5s",
		// Rates of an hour, so that their windows are still there to scan.
		"SLUICE_API_RATE": "1000/1h", "SLUICE_API_NOTIFICATION_RATE": "1000/1h",
	}
	maps.Copy(s.vars, redisVars)
	wcfg, err := worker.ParseConfig(s.vars)
	if err != nil {
		t.Fatal(err)
	}
	acfg, err := api.ParseConfig(s.vars)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	w, err := app.NewWorker(wcfg, app.WorkerOptions{Logger: log, Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	if s.api, err = app.NewAPI(acfg, s.vars, app.APIOptions{Logger: log, Registry: prometheus.NewRegistry(), Listener: ln}); err != nil {
		t.Fatal(err)
	}
	s.run(t, w.Run)
	s.run(t, s.api.Run)
	return s
}

// run runs a process until stop (or the test's end).
func (s *system) run(t *testing.T, run func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		return <-done
	}
	s.stops = append(s.stops, stop)
	t.Cleanup(func() { _ = stop() })
}

// stop ends the processes (the API first), as SIGTERM would.
func (s *system) stop(t *testing.T) {
	t.Helper()
	for i := len(s.stops) - 1; i >= 0; i-- {
		if err := s.stops[i](); err != nil {
			t.Errorf("run: %v", err)
		}
	}
}

// exercise makes the run whose keys TestKeysExpire scans.
func (s *system) exercise(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	token, _, err := s.api.Tokens().Create(ctx, "acme", "keys", "test")
	if err != nil {
		t.Fatal(err)
	}
	defaults, _ := plans.Parse(systemRules)
	if _, err := plans.NewStore(s.rdb, defaults).Set(ctx, "acme", "sms:recipient=20/1m,sms:inbound=+15005550006", "test"); err != nil {
		t.Fatal(err)
	}
	keys, _ := tasks.ParseKeyring(s.vars["SLUICE_PAYLOAD_KEYS"])
	creds := webhook.Credentials{User: "postmark", Password: "0123456789abcdef0123"}
	if err := webhook.NewStore(s.rdb, keys).Set(ctx, "acme", postmark.Provider{}, creds); err != nil {
		t.Fatal(err)
	}
	s.sms.SetCallbacks(func(fakes.Delivery) []fakes.StatusUpdate { return []fakes.StatusUpdate{{Status: "delivered"}} })
	batch := map[string]any{"notifications": []map[string]any{
		{"channel": "sms", "to": smsTo, "body": "Your code is 123456"},
		{"channel": "email", "to": "ann@example.com", "subject": "Hello", "body": "Hello, Ann"},
	}}
	if code := s.post(t, "/v1/notifications", token, batch); code != http.StatusAccepted {
		t.Fatalf("enqueue: %d", code)
	}
	if code := s.post(t, "/v1/notifications", "sluice_nobody_wrong", batch); code != http.StatusUnauthorized {
		t.Fatalf("a wrong token: %d, want 401", code)
	}
	s.sms.WaitCount(t, 1, 20*time.Second)
	s.smtp.WaitCount(t, 1, 20*time.Second)
	s.sms.WaitCallbacks(t, 1, 20*time.Second)
	s.inbound(t, "STOP")
	s.sms.WaitCount(t, 2, 20*time.Second) // the confirmation, through the priority lane
	s.waitIdle(t)
}

// post sends body as JSON with an Idempotency-Key and returns the status.
func (s *system) post(t *testing.T, path, token string, body any) int {
	t.Helper()
	raw, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, s.base+path, bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"keys-run-1"`)
	res, err := sluicetest.Client(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// inbound texts body from the recipient to the tenant's number, signed as the provider signs.
func (s *system) inbound(t *testing.T, body string) {
	t.Helper()
	u := s.base + "/v1/inbound/sms/acme"
	params := url.Values{"From": {smsTo}, "To": {"+15005550006"}, "Body": {body}, "MessageSid": {"SM0123456789abcdef0123456789abcdef"}}
	code, err := s.sms.PostCallback(context.Background(), u, params, fakes.Sign(s.sms.AuthToken, u, params))
	if err != nil || code != http.StatusOK {
		t.Fatalf("inbound %s: %d %v", body, code, err)
	}
}

// waitIdle waits until Asynq holds no task waiting or running.
func (s *system) waitIdle(t *testing.T) {
	t.Helper()
	insp := asynq.NewInspectorFromRedisClient(s.rdb)
	sluicetest.EventuallyValueEvery(t, 20*time.Second, 100*time.Millisecond, "Asynq to hold no task waiting or running", func() (int, bool) {
		busy := 0
		queues, err := insp.Queues()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range queues {
			if qi, err := insp.GetQueueInfo(q); err == nil {
				busy += qi.Pending + qi.Active + qi.Scheduled + qi.Retry
			}
		}
		return busy, busy == 0
	})
}
