package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/api"
)

func TestTenantTokenCommands(t *testing.T) {
	srv := env(t)
	if r := sluice(t, "", "tenant", "token", "create", "acme"); r.code != 1 || !strings.Contains(r.stderr, "SLUICE_API_TOKEN_KEY") {
		t.Fatalf("create without SLUICE_API_TOKEN_KEY: %+v", r)
	}
	const key = "cli-token-key-0123456789abcdef0123456789"
	t.Setenv("SLUICE_API_TOKEN_KEY", key)
	r := sluice(t, "", "tenant", "token", "create", "acme", "--name", "checkout", "--by", "ann")
	tok := strings.TrimSpace(r.stdout)
	if r.code != 0 || !strings.HasPrefix(tok, "sluice_") || !strings.Contains(r.stderr, "shown only now") {
		t.Fatalf("create: %+v", r)
	}
	store, err := api.NewTokens(srv.Client(t), key)
	if err != nil {
		t.Fatal(err)
	}
	info, err := store.Lookup(context.Background(), tok)
	if err != nil || info.Tenant != "acme" || info.Name != "checkout" || info.CreatedBy != "ann" {
		t.Fatalf("lookup of the printed token: %+v %v", info, err)
	}
	r = sluice(t, "", "tenant", "token", "list", "acme")
	if r.code != 0 || !strings.Contains(r.stdout, info.ID) || !strings.Contains(r.stdout, "checkout") || strings.Contains(r.stdout, tok) {
		t.Fatalf("list: %+v", r)
	}
	if r := sluice(t, "", "tenant", "token", "revoke", "globex", info.ID); r.code != 1 {
		t.Fatalf("revoking acme's token as globex's: %+v", r)
	}
	if r := sluice(t, "", "tenant", "token", "revoke", "acme", info.ID); r.code != 0 {
		t.Fatalf("revoke: %+v", r)
	}
	if _, err := store.Lookup(context.Background(), tok); !errors.Is(err, api.ErrUnknownToken) {
		t.Fatalf("a revoked token still looks up: %v", err)
	}
	if r := sluice(t, "", "tenant", "token", "create", "no/such"); r.code != 2 {
		t.Fatalf("bad tenant: %+v", r)
	}
}
