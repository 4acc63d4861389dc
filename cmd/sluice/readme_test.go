package main

import (
	"os"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/worker"
)

const (
	tableBegin = "<!-- config-table:begin (generated from worker.Config and api.Config by `SLUICE_UPDATE_README=1 go test ./cmd/sluice -run TestReadmeConfigTable`) -->"
	tableEnd   = "<!-- config-table:end -->"
)

func configTable() string {
	var b strings.Builder
	b.WriteString("| Variable | Default | Meaning |\n|---|---|---|\n")
	for _, v := range append(worker.ConfigVars(), api.ConfigVars()...) {
		def := "`" + v.Default + "`"
		if v.Default == "" {
			def = "—"
		}
		desc := strings.ReplaceAll(v.Description, "|", "\\|")
		if v.Secret {
			desc += " *Secret: masked in logs.*"
		}
		b.WriteString("| `" + v.Name + "` | " + def + " | " + desc + " |\n")
	}
	return b.String()
}

// The README's config table is generated from the Config structs; this test
// fails when they drift (and rewrites it with SLUICE_UPDATE_README=1).
func TestReadmeConfigTable(t *testing.T) {
	const path = "../../README.md"
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	i, j := strings.Index(readme, tableBegin), strings.Index(readme, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md lacks the config table markers %q … %q", tableBegin, tableEnd)
	}
	want := readme[:i+len(tableBegin)] + "\n" + configTable() + readme[j:]
	if want == string(raw) {
		return
	}
	if os.Getenv("SLUICE_UPDATE_README") == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatal("README.md's config table is out of date; run: SLUICE_UPDATE_README=1 go test ./cmd/sluice -run TestReadmeConfigTable")
}

// The README's two quick-start commands are the ones that exist.
func TestReadmeCommands(t *testing.T) {
	raw, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"go run ./cmd/sluice dev", "./scripts/test.sh", "./scripts/bench.sh"} {
		if !strings.Contains(string(raw), cmd) {
			t.Errorf("README.md does not show %q", cmd)
		}
	}
	ci, err := os.ReadFile("../../.ci/run")
	if err != nil || !strings.Contains(string(ci), "./scripts/test.sh") {
		t.Errorf(".ci/run must call the README's test command ./scripts/test.sh")
	}
}
