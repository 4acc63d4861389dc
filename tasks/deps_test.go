package tasks_test

import (
	"os/exec"
	"strings"
	"testing"
)

// A producer importing tasks must not pull in the worker, the senders,
// metrics or the OpenTelemetry SDK and exporters (the API is fine).
func TestProducerDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/sluicehq/sluice/tasks").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, forbidden := range []string{"sluice/worker", "sluice/throttle", "go-mail", "go-smtp", "prometheus", "miniredis", "cobra",
		"go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/otel/exporters", "go.opentelemetry.io/contrib", "google.golang.org/grpc"} {
		for _, dep := range strings.Fields(string(out)) {
			if strings.Contains(dep, forbidden) {
				t.Errorf("tasks depends on %s", dep)
			}
		}
	}
}
