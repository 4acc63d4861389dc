package plans_test

import (
	"os/exec"
	"strings"
	"testing"
)

// plans sits below the worker and the API: it may use the task format and
// the limiter's types, never the worker, the API or the command.
func TestDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "github.com/sluicehq/sluice/plans").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 2 {
		t.Fatalf("go list found %v: not the package?", deps)
	}
	for _, dep := range deps {
		for _, banned := range []string{"github.com/sluicehq/sluice/worker", "github.com/sluicehq/sluice/api", "github.com/sluicehq/sluice/cmd"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("plans depends on %s", dep)
			}
		}
	}
}
