package main

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/worker"
)

// No Docker engine runs here: load docker-compose.yml with compose-go and
// check what `docker compose up` would need.
func TestComposeFile(t *testing.T) {
	opts, err := cli.NewProjectOptions([]string{"../../docker-compose.yml"},
		cli.WithWorkingDirectory("../.."), cli.WithName("sluice"), cli.WithEnv([]string{}))
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml does not load: %v", err)
	}
	for _, name := range []string{"redis", "worker", "api", "mailpit", "asynqmon", "sms-sink"} {
		if _, err := p.GetService(name); err != nil {
			t.Errorf("service %s: %v", name, err)
		}
	}
	redis, _ := p.GetService("redis")
	if !slices.Contains(redis.Command, "--appendonly") || redis.HealthCheck == nil || len(redis.Volumes) == 0 {
		t.Errorf("redis needs AOF, a healthcheck and a volume: %+v", redis)
	}
	if i := slices.Index(redis.Command, "--maxmemory-policy"); i < 0 || i+1 >= len(redis.Command) || redis.Command[i+1] != "noeviction" {
		t.Errorf("redis must set maxmemory-policy noeviction (workers refuse others): %v", redis.Command)
	}
	w, _ := p.GetService("worker")
	if w.Deploy == nil || w.Deploy.Replicas == nil || *w.Deploy.Replicas != 2 {
		t.Errorf("worker replicas: %+v", w.Deploy)
	}
	if dep, ok := w.DependsOn["redis"]; !ok || dep.Condition != types.ServiceConditionHealthy {
		t.Errorf("worker must wait for a healthy redis: %+v", w.DependsOn)
	}
	if w.HealthCheck == nil || !slices.Contains(w.HealthCheck.Test, "health") {
		t.Errorf("worker healthcheck: %+v", w.HealthCheck)
	}
	if w.Build == nil {
		t.Error("worker is not built from the Dockerfile")
	}
	if _, err := os.Stat("../../Dockerfile"); err != nil {
		t.Error(err)
	}

	// Every SLUICE_* variable compose sets is one the config reads, and the
	// config the worker gets from compose is valid.
	known := map[string]bool{}
	for _, v := range worker.ConfigVars() {
		known[v.Name] = true
	}
	env := map[string]string{}
	for k, v := range w.Environment {
		if !strings.HasPrefix(k, config.EnvPrefix) {
			continue
		}
		if !known[k] {
			t.Errorf("compose sets %s, which the config does not read", k)
		}
		if v != nil {
			env[k] = *v
		}
	}
	if _, err := worker.ParseConfig(env); err != nil {
		t.Errorf("the worker's compose environment does not validate: %v", err)
	}
	checkAPIService(t, p, env)
	mp, _ := p.GetService("mailpit")
	if env["SLUICE_SMTP_HOST"] != mp.Name || env["SLUICE_SMTP_PORT"] != "1025" {
		t.Errorf("email must go to mailpit:1025, got %s:%s", env["SLUICE_SMTP_HOST"], env["SLUICE_SMTP_PORT"])
	}
}

// The api service runs `sluice api` on the shared environment plus its
// own variables, all known and valid, waits for a healthy Redis, checks
// its own readiness and publishes its port.
func checkAPIService(t *testing.T, p *types.Project, workerEnv map[string]string) {
	t.Helper()
	a, err := p.GetService("api")
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Command) != 1 || a.Command[0] != "api" || a.Build == nil {
		t.Errorf("api must run the built image's `sluice api`: %v", a.Command)
	}
	if dep, ok := a.DependsOn["redis"]; !ok || dep.Condition != types.ServiceConditionHealthy {
		t.Errorf("api must wait for a healthy redis: %+v", a.DependsOn)
	}
	if a.HealthCheck == nil || !slices.Contains(a.HealthCheck.Test, "http://127.0.0.1:8081/readyz") {
		t.Errorf("api healthcheck: %+v", a.HealthCheck)
	}
	if len(a.Ports) != 1 || a.Ports[0].Target != 8081 {
		t.Errorf("api ports: %+v", a.Ports)
	}
	known := map[string]bool{}
	for _, n := range append(worker.KnownVariables(), api.KnownVariables()...) {
		known[n] = true
	}
	env := map[string]string{}
	for k, v := range a.Environment {
		if !strings.HasPrefix(k, config.EnvPrefix) {
			continue
		}
		if !known[k] {
			t.Errorf("compose sets %s for the api, which no config reads", k)
		}
		if v != nil {
			env[k] = *v
		}
	}
	for k, v := range workerEnv {
		if env[k] != v {
			t.Errorf("api and workers disagree on %s: %q vs %q", k, env[k], v)
		}
	}
	if _, err := worker.ParseConfig(env); err != nil {
		t.Errorf("the api's shared variables do not validate: %v", err)
	}
	if _, err := api.ParseConfig(env); err != nil {
		t.Errorf("the api's own variables do not validate: %v", err)
	}
}
