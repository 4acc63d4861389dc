package api_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// Auth checks tokens as the API does, for the routes mounted beside it: the
// admin token, a tenant's token until it is revoked, nothing else.
func TestAuthChecksTokensAsTheAPI(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	ctx := context.Background()
	auth := b.API.Auth()
	for _, c := range []struct {
		name, token, tenant, id string
		ok                      bool
	}{
		{"Admin", adminToken, "", api.AdminTokenID, true},
		{"Tenant", b.Tokens["acme"], "acme", strings.Split(b.Tokens["acme"], "_")[1], true},
		{"Unknown", "sluice_0000_wrong", "", "", false},
		{"Empty", "", "", "", false},
		{"AdminTokenPrefix", adminToken[:len(adminToken)-1], "", "", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tenant, id, ok, err := auth.Identify(ctx, c.token)
			if err != nil || ok != c.ok || tenant != c.tenant || id != c.id {
				t.Fatalf("Identify = %q %q %v %v, want %q %q %v", tenant, id, ok, err, c.tenant, c.id, c.ok)
			}
		})
	}
	_, id, _, _ := auth.Identify(ctx, b.Tokens["globex"])
	if ok, err := auth.Valid(ctx, "globex", id); err != nil || !ok {
		t.Fatalf("globex's token: valid %v %v", ok, err)
	}
	if ok, _ := auth.Valid(ctx, "acme", id); ok {
		t.Fatal("globex's token id is valid for acme")
	}
	if ok, _ := auth.Valid(ctx, "", api.AdminTokenID); !ok {
		t.Fatal("the admin is not valid")
	}
	if err := b.API.Tokens().Revoke(ctx, "globex", id); err != nil {
		t.Fatal(err)
	}
	if ok, err := auth.Valid(ctx, "globex", id); err != nil || ok {
		t.Fatalf("a revoked token: valid %v %v", ok, err)
	}
	// Every tenant with a token (globex has none left).
	got, more, err := auth.Tenants(ctx)
	if slices.Sort(got); err != nil || more || !slices.Equal(got, []string{"acme"}) {
		t.Fatalf("tenants with tokens: %v more %v %v", got, more, err)
	}
}

// The session key changes with the token key and with the admin token, so
// a change of either signs every browser out; without an admin token the
// admin is valid nowhere.
func TestAuthSessionKeyFollowsTheSecrets(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	key := func(cfg api.Config) []byte {
		t.Helper()
		srv, err := app.NewAPI(cfg, nil, app.APIOptions{Redis: b.RDB, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return srv.Auth().SessionKey("sluice ui session")
	}
	same := key(b.Config)
	if !bytes.Equal(same, b.API.Auth().SessionKey("sluice ui session")) || bytes.Equal(same, b.API.Auth().SessionKey("another purpose")) {
		t.Fatal("the session key is not one per configuration and purpose")
	}
	// The derivation the dashboard's cookies were signed with before it
	// left the api package: browsers stay signed in across the upgrade.
	m := hmac.New(sha256.New, []byte(tokenKey))
	m.Write([]byte("sluice ui session\x00" + adminToken))
	if !bytes.Equal(same, m.Sum(nil)) {
		t.Fatal("the session key changed its derivation: every browser would be signed out")
	}
	otherAdmin, otherKey, noAdmin := b.Config, b.Config, b.Config
	otherAdmin.AdminToken = strings.Repeat("b", 40)
	otherKey.TokenKey = strings.Repeat("k", 40)
	noAdmin.AdminToken = ""
	for name, cfg := range map[string]api.Config{"AdminToken": otherAdmin, "TokenKey": otherKey} {
		if bytes.Equal(key(cfg), same) {
			t.Errorf("changing the %s keeps the session key", name)
		}
	}
	srv, err := app.NewAPI(noAdmin, nil, app.APIOptions{Redis: b.RDB, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := srv.Auth().Valid(context.Background(), "", api.AdminTokenID); ok {
		t.Fatal("the admin is valid without an admin token")
	}
}

// A mounted route is logged and counted, naming the identity it sets; a
// bare one is neither.
func TestMountedRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t, rules, nil)
	var logs sluicetest.LogBuffer
	srv, err := app.NewAPI(b.Config, nil, app.APIOptions{Redis: b.RDB, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv.Mount("GET /mounted", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.(interface{ SetIdentity(tenant, tokenID string) }).SetIdentity("acme", "tok1")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("flush through the access log: %v", err)
		}
	}))
	srv.MountBare("GET /bare", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	for _, p := range []string{"/mounted", "/bare", "/metrics"} {
		resp, err := http.Get(hs.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		_, _ = body.ReadFrom(resp.Body)
		resp.Body.Close()
		if p != "/metrics" {
			continue
		}
		m := body.String()
		if !strings.Contains(m, `sluice_api_requests_total{code="200",route="GET /mounted"} 1`) || strings.Contains(m, "/bare") {
			t.Fatalf("metrics: %s", m)
		}
	}
	l := logs.String()
	if !strings.Contains(l, `"route":"GET /mounted"`) || !strings.Contains(l, `"tenant":"acme","token_id":"tok1"`) || strings.Contains(l, "/bare") {
		t.Fatalf("access log: %s", l)
	}
}
