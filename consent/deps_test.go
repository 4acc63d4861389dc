package consent_test

import (
	"os/exec"
	"strings"
	"testing"
)

// consent sits beside delivery, below the worker, the API and the command:
// they wire it in, it never reaches up to them.
func TestDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "github.com/sluicehq/sluice/consent").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 2 {
		t.Fatalf("go list found %v: not the package?", deps)
	}
	for _, dep := range deps {
		for _, banned := range []string{"github.com/sluicehq/sluice/worker", "github.com/sluicehq/sluice/api",
			"github.com/sluicehq/sluice/cmd", "github.com/sluicehq/sluice/delivery"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("consent depends on %s", dep)
			}
		}
	}
}
