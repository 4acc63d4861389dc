package telemetry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/telemetry"
)

// childEnv makes the test binary act as a sluice command with tracing set
// up from its (real) environment: see TestMain.
const childEnv = "SLUICE_TELEMETRY_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		if err := child(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child sets tracing up as cmd/sluice does, makes one span and exits
// through the shutdown function, which must flush it.
func child() error {
	ctx := context.Background()
	shutdown, err := telemetry.Setup(ctx, telemetry.Options{ServiceName: "sluice-worker"})
	if err != nil {
		return err
	}
	_, span := otel.Tracer("test").Start(ctx, "child-span")
	span.End()
	return shutdown(ctx)
}

func env(vars map[string]string) func(string) string {
	return func(k string) string { return vars[k] }
}

// Tracing is off unless OTEL_TRACES_EXPORTER names an exporter, and
// OTEL_SDK_DISABLED=true turns it off whatever else is set.
func TestOffByDefault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		vars map[string]string
		want []string
	}{
		{nil, nil},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, nil},
		{map[string]string{"OTEL_TRACES_EXPORTER": "none"}, nil},
		{map[string]string{"OTEL_TRACES_EXPORTER": " None , "}, nil},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, nil},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "false"}, []string{"otlp"}},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp, console"}, []string{"otlp", "console"}},
	} {
		if got := telemetry.Exporters(env(tc.vars)); !slices.Equal(got, tc.want) {
			t.Errorf("%v: exporters %q, want %q", tc.vars, got, tc.want)
		}
		if tc.want != nil {
			continue
		}
		tp, err := telemetry.NewTracerProvider(context.Background(), telemetry.Options{Getenv: env(tc.vars)})
		if tp != nil || err != nil {
			t.Errorf("%v: provider %v, err %v; want none", tc.vars, tp, err)
		}
	}
}

// A value this build cannot honour is an error naming the variable, not a
// silent fallback.
func TestUnknownExporterOrProtocol(t *testing.T) {
	t.Parallel()
	for _, vars := range []map[string]string{
		{"OTEL_TRACES_EXPORTER": "zipkin"},
		{"OTEL_TRACES_EXPORTER": "console,jaeger"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
		{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"},
	} {
		tp, err := telemetry.NewTracerProvider(context.Background(), telemetry.Options{Getenv: env(vars), Stdout: io.Discard})
		if !errors.Is(err, telemetry.ErrConfig) || tp != nil || !strings.Contains(err.Error(), "OTEL_") {
			t.Errorf("%v: provider %v, err %v; want ErrConfig naming the variable", vars, tp, err)
		}
	}
}

// console writes each span as JSON, on shutdown at the latest.
func TestConsoleExporter(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	tp, err := telemetry.NewTracerProvider(context.Background(), telemetry.Options{
		ServiceName: "sluice-test", Getenv: env(map[string]string{"OTEL_TRACES_EXPORTER": "console"}), Stdout: &out})
	if err != nil || tp == nil {
		t.Fatalf("provider %v, err %v", tp, err)
	}
	_, span := tp.Tracer("test").Start(context.Background(), "console-span")
	span.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"Name":"console-span"`) || !strings.Contains(out.String(), "service.name") {
		t.Fatalf("console output lacks the span or its service:\n%s", out.String())
	}
}

// OTEL_TRACES_EXPORTER=otlp with the default protocol exports OTLP/HTTP
// (protobuf) to OTEL_EXPORTER_OTLP_ENDPOINT, with OTEL_SERVICE_NAME as the
// service, and the shutdown function flushes before the process exits. The
// command runs as a child process so that it reads a real environment.
func TestOTLPFromEnvironment(t *testing.T) {
	t.Parallel()
	got := make(chan *coltrace.ExportTraceServiceRequest, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil || r.Method != http.MethodPost || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("collector got %s %s (%s), err %v", r.Method, r.URL.Path, r.Header.Get("Content-Type"), err)
			http.Error(w, "unexpected", http.StatusBadRequest)
			return
		}
		req := &coltrace.ExportTraceServiceRequest{}
		if err := proto.Unmarshal(body, req); err != nil {
			t.Errorf("collector: %v", err)
		}
		got <- req
		w.Header().Set("Content-Type", "application/x-protobuf")
		resp, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		_, _ = w.Write(resp)
	}))
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1",
		"OTEL_TRACES_EXPORTER=otlp",
		"OTEL_EXPORTER_OTLP_ENDPOINT="+srv.URL,
		"OTEL_SERVICE_NAME=sluice-otlp-test",
		"OTEL_EXPORTER_OTLP_PROTOCOL=", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=", "OTEL_SDK_DISABLED=", "OTEL_TRACES_SAMPLER=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var names, services []string
	for len(got) > 0 {
		req := <-got
		for _, rs := range req.GetResourceSpans() {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.GetKey() == "service.name" {
					services = append(services, kv.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					names = append(names, s.GetName())
				}
			}
		}
	}
	if !slices.Equal(names, []string{"child-span"}) || !slices.Equal(services, []string{"sluice-otlp-test"}) {
		t.Fatalf("collector got spans %q from services %q; want child-span from sluice-otlp-test", names, services)
	}
}
