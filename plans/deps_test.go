package plans_test

import (
	"os/exec"
	"strings"
	"testing"
)

// plans depends on the standard library and phonenumbers (with what that
// pulls in) only: not on the worker, the limiter or the task format.
func TestDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}",
		"github.com/sluicehq/sluice/plans").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := []string{"github.com/sluicehq/sluice/plans", "github.com/nyaruka/phonenumbers",
		"golang.org/x/text/", "google.golang.org/protobuf/"}
	deps := strings.Fields(string(out))
	if len(deps) < 2 {
		t.Fatalf("go list found %v: not the package?", deps)
	}
	for _, dep := range deps {
		ok := false
		for _, prefix := range allowed {
			ok = ok || strings.HasPrefix(dep, prefix)
		}
		if !ok {
			t.Errorf("plans depends on %s", dep)
		}
	}
}
