package dashboard_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The dashboard depends on its Backend, not on the API: it imports neither
// the API, nor the worker, nor a sender, nor the command; and the API does
// not import the dashboard (internal/apiserver wires the two).
func TestDependencies(t *testing.T) {
	t.Parallel()
	for pkg, banned := range map[string][]string{
		"github.com/sluicehq/sluice/dashboard": {"github.com/sluicehq/sluice/api", "github.com/sluicehq/sluice/worker",
			"github.com/sluicehq/sluice/sender", "github.com/sluicehq/sluice/cmd"},
		"github.com/sluicehq/sluice/api": {"github.com/sluicehq/sluice/dashboard"},
	} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list %s: %v\n%s", pkg, err, out)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 2 {
			t.Fatalf("go list found %v: not the package?", deps)
		}
		for _, dep := range deps {
			for _, b := range banned {
				if dep == b || strings.HasPrefix(dep, b+"/") {
					t.Errorf("%s depends on %s", pkg, dep)
				}
			}
		}
	}
}
