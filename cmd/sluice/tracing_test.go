package main

import (
	"strings"
	"testing"
)

// The worker refuses, before it starts, an OTEL_* tracing setting it cannot
// honour (serial: t.Setenv).
func TestWorkerTracingConfig(t *testing.T) {
	env(t)
	t.Setenv("OTEL_TRACES_EXPORTER", "zipkin")
	if r := sluice(t, "", "worker"); r.code != 1 || !strings.Contains(r.stderr, "OTEL_TRACES_EXPORTER") {
		t.Fatalf("worker with OTEL_TRACES_EXPORTER=zipkin: %+v", r)
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
	if r := sluice(t, "", "worker"); r.code != 1 || !strings.Contains(r.stderr, "OTEL_EXPORTER_OTLP_PROTOCOL") {
		t.Fatalf("worker with OTEL_EXPORTER_OTLP_PROTOCOL=http/json: %+v", r)
	}
}
