package api_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/config"
)

func TestConfigErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	cases := map[string]map[string]string{
		"SLUICE_API_TOKEN_KEY":       {"SLUICE_API_TOKEN_KEY": "short"},
		"SLUICE_API_ADMIN_TOKEN":     {"SLUICE_API_ADMIN_TOKEN": "guessable"},
		"SLUICE_API_RATE":            {"SLUICE_API_RATE": "50 per second"},
		"SLUICE_API_ADDR":            {"SLUICE_API_ADDR": "8081"},
		"SLUICE_API_MAX_BODY_BYTES":  {"SLUICE_API_MAX_BODY_BYTES": "10"},
		"SLUICE_API_IDEMPOTENCY_TTL": {"SLUICE_API_IDEMPOTENCY_TTL": "1h"},
		"SLUICE_API_READ_TIMEOUT":    {"SLUICE_API_READ_TIMEOUT": "1ms"},
	}
	for name, env := range cases {
		if _, ok := env["SLUICE_API_TOKEN_KEY"]; !ok {
			env["SLUICE_API_TOKEN_KEY"] = tokenKey
		}
		env["SLUICE_SUBJECT_SECRET"], env["SLUICE_PAYLOAD_KEYS"] = "test-secret-0123456789", testKeys
		_, err := api.ParseConfig(env)
		if !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: err = %v, want a config error naming %s", env, err, name)
		}
	}
	if _, err := api.ParseConfig(map[string]string{"SLUICE_API_TOKEN_KEY": tokenKey}); !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), "SLUICE_SUBJECT_SECRET") {
		t.Errorf("no subject secret: err = %v, want a config error naming SLUICE_SUBJECT_SECRET (the API hashes recipients as the workers do)", err)
	}
	cfg, err := api.ParseConfig(map[string]string{"SLUICE_API_TOKEN_KEY": tokenKey, "SLUICE_SUBJECT_SECRET": "test-secret-0123456789", "SLUICE_PAYLOAD_KEYS": testKeys})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != ":8081" || cfg.Rate != "50/1s" || cfg.IdempotencyTTL.Hours() != 24 {
		t.Fatalf("defaults: %+v", cfg)
	}
	for _, v := range api.ConfigVars() {
		if v.Description == "" || !strings.HasPrefix(v.Name, "SLUICE_API_") {
			t.Errorf("%s: no description, or not SLUICE_API_", v.Name)
		}
	}
	cfg.AdminToken = adminToken
	if all := strings.Join(cfg.Redacted(), " "); strings.Contains(all, tokenKey) || strings.Contains(all, adminToken) {
		t.Fatalf("Redacted leaks a secret: %s", all)
	}
}
