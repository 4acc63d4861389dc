package tasks_test

import (
	"os/exec"
	"strings"
	"testing"
)

// A producer importing tasks must not pull in the worker, the senders or metrics.
func TestProducerDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "github.com/sluicehq/sluice/tasks").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, forbidden := range []string{"sluice/worker", "sluice/throttle", "go-mail", "go-smtp", "prometheus", "miniredis", "cobra"} {
		for _, dep := range strings.Fields(string(out)) {
			if strings.Contains(dep, forbidden) {
				t.Errorf("tasks depends on %s", dep)
			}
		}
	}
}
