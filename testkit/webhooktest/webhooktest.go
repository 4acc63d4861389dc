// Package webhooktest runs one provider's webhook route for its tests:
// a real redis-server, the consent store and the route on a loopback
// HTTP server, as `sluice api` mounts it.
package webhooktest

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/webhook"
)

// Bundle is a running route.
type Bundle struct {
	RDB     *redis.Client
	Consent *consent.Store
	Store   *webhook.Store
	Server  *httptest.Server
	p       webhook.Provider
}

// New starts p's route; now (nil: time.Now) is its clock.
func New(t *testing.T, p webhook.Provider, now func() time.Time) *Bundle {
	t.Helper()
	return NewLogged(t, p, now, slog.New(slog.DiscardHandler))
}

// NewLogged is New with the route's log going to log.
func NewLogged(t *testing.T, p webhook.Provider, now func() time.Time, log *slog.Logger) *Bundle {
	t.Helper()
	_, rdb := redistest.New(t)
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte("webhook-test-secret-0123")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	cs, err := consent.NewStore(rdb, lim, consent.Options{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := tasks.ParseKeyring(tasks.NewKeySpec("webhooktest"))
	if err != nil {
		t.Fatal(err)
	}
	b := &Bundle{RDB: rdb, Consent: cs, Store: webhook.NewStore(rdb, keys), p: p}
	m, err := webhook.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h := webhook.NewHandler(p, webhook.Config{Consent: cs, Store: b.Store, Guard: webhook.NewGuard(rdb),
		Log: log, UndeliverableFor: 720 * time.Hour, Now: now}, m)
	mux := http.NewServeMux()
	mux.Handle(webhook.Route(p), h)
	b.Server = httptest.NewServer(mux)
	t.Cleanup(b.Server.Close)
	return b
}

// Set stores tenant's credentials.
func (b *Bundle) Set(t *testing.T, tenant string, c webhook.Credentials) {
	t.Helper()
	if err := b.Store.Set(context.Background(), tenant, b.p, c); err != nil {
		t.Fatal(err)
	}
}

// URL is the route's URL for tenant.
func (b *Bundle) URL(tenant string) string { return b.Server.URL + webhook.Path(b.p.Name(), tenant) }

// Reply is an answer of the route.
type Reply struct {
	Status int
	Body   []byte
	Answer webhook.Answer
}

// Post sends body to tenant's route with headers (name, value, ...).
func (b *Bundle) Post(t *testing.T, tenant string, body []byte, headers ...string) Reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.URL(tenant), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return b.Do(t, req)
}

// Do sends req and reads the answer.
func (b *Bundle) Do(t *testing.T, req *http.Request) Reply {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := Reply{Status: resp.StatusCode, Body: raw}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw, &r.Answer); err != nil {
			t.Fatalf("answer %s: %v", raw, err)
		}
	}
	return r
}

// Ledger is the email ledger of (tenant, addr).
func (b *Bundle) Ledger(t *testing.T, tenant, addr string) []consent.Event {
	t.Helper()
	l, err := b.Consent.Ledger(context.Background(), tenant, tasks.Email, addr)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// NothingRecorded fails unless no ledger of tenant holds anything: no
// consent key exists.
func (b *Bundle) NothingRecorded(t *testing.T, what string) {
	t.Helper()
	keys, err := b.RDB.Keys(context.Background(), "*consent*").Result()
	if err != nil {
		t.Fatal(err)
	}
	ledgers, _ := b.RDB.Keys(context.Background(), "*ledger*").Result()
	if len(keys)+len(ledgers) > 0 {
		t.Fatalf("%s recorded something: %v %v", what, keys, ledgers)
	}
}
