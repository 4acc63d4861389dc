package providers_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/app"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sender/providers"
	"github.com/sluicehq/sluice/sender/providers/internal/webhooksms"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/worker"
)

// A third SMS provider is one package (internal/webhooksms) and one line
// of registration — the line below, which in the binary would sit in
// providers.All. With it alone the worker accepts SLUICE_SMS_SENDER=webhook,
// knows and validates the provider's variables, lists them in its
// configuration, and sends through it.
func TestAThirdProviderIsOnePackageAndOneLine(t *testing.T) {
	providers.All = append(providers.All, webhooksms.Provider) // the one line

	got := make(chan webhooksms.Message, 1)
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m webhooksms.Message
		if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		got <- m
		w.WriteHeader(http.StatusAccepted)
	}))
	defer hook.Close()
	srv, rdb := redistest.New(t)
	env := map[string]string{
		"SLUICE_REDIS_URL":       srv.URL(),
		"SLUICE_RULES":           "sms:recipient=5/1m",
		"SLUICE_SUBJECT_SECRET":  "test-secret-0123456789",
		"SLUICE_PAYLOAD_KEYS":    tasks.NewKeySpec("test"),
		"SLUICE_HTTP_ADDR":       "off",
		"SLUICE_SMS_SENDER":      "webhook",
		"SLUICE_SMS_FROM":        "+15005550006",
		"SLUICE_WEBHOOK_SMS_URL": hook.URL,
	}
	if !slices.ContainsFunc(worker.ConfigVars(), func(v config.Var) bool { return v.Name == "SLUICE_WEBHOOK_SMS_URL" && v.Description != "" }) {
		t.Error("the configuration does not list SLUICE_WEBHOOK_SMS_URL")
	}
	if err := config.UnknownVariables(env, worker.KnownVariables()); err != nil {
		t.Errorf("the provider's variables are unknown to the worker: %v", err)
	}
	bad := map[string]string{}
	for k, v := range env {
		bad[k] = v
	}
	bad["SLUICE_WEBHOOK_SMS_URL"] = "not a url"
	if _, err := worker.ParseConfig(bad); !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), "SLUICE_WEBHOOK_SMS_URL") {
		t.Errorf("a bad SLUICE_WEBHOOK_SMS_URL: err = %v, want a config error naming it", err)
	}
	cfg, err := worker.ParseConfig(env)
	if err != nil {
		t.Fatal(err)
	}
	w, err := app.NewWorker(cfg, app.WorkerOptions{Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	keys, err := tasks.ParseKeyring(env["SLUICE_PAYLOAD_KEYS"])
	if err != nil {
		t.Fatal(err)
	}
	n := tasks.NewSMS("acme", "+14155550100", "through the third provider")
	if _, err := tasks.Enqueue(ctx, asynq.NewClientFromRedisClient(rdb), keys, n, asynq.Queue(cfg.Layout().Route("acme", tasks.LaneStandard, nil))); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if m.ID != n.ID || m.To != n.To || m.From != "+15005550006" || m.Body != n.Body {
			t.Fatalf("the webhook received %+v", m)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("nothing reached the third provider")
	}
}
