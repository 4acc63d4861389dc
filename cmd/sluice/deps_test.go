package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

func goListDeps(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list %v: %v\n%s", args, err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list %v found only %v", args, deps)
	}
	return deps
}

// The package graph the structure promises: the API links neither the
// worker nor any sender (the routes a sender owns are mounted by the
// command, internal/apiserver), and the production build (-tags nodev, as
// the Dockerfile builds it) links no in-process Redis.
func TestDependencies(t *testing.T) {
	t.Parallel()
	for _, dep := range goListDeps(t, "github.com/sluicehq/sluice/api/...") {
		for _, banned := range []string{"github.com/sluicehq/sluice/worker", "github.com/sluicehq/sluice/sender", "github.com/sluicehq/sluice/cmd"} {
			if dep == banned || strings.HasPrefix(dep, banned+"/") {
				t.Errorf("the api packages depend on %s", dep)
			}
		}
	}
	for _, dep := range goListDeps(t, "-tags", "nodev", "github.com/sluicehq/sluice/cmd/sluice") {
		for _, banned := range []string{"github.com/alicebob/miniredis", "github.com/yuin/gopher-lua"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("the production build of cmd/sluice (-tags nodev) links %s", dep)
			}
		}
	}
	if df, err := os.ReadFile("../../Dockerfile"); err != nil || !strings.Contains(string(df), "go build -tags nodev") {
		t.Errorf("the Dockerfile does not build with -tags nodev (%v): the image would carry the dev mode's in-process Redis", err)
	}
	// And the default build still has the dev mode the README's first
	// command runs.
	if deps := goListDeps(t, "github.com/sluicehq/sluice/cmd/sluice"); !strings.Contains(strings.Join(deps, " "), "github.com/alicebob/miniredis/v2 ") {
		t.Error("the default build of cmd/sluice lost miniredis: `go run ./cmd/sluice dev` needs it")
	}
}
