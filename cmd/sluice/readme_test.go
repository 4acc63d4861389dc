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

// The config table of docs/configuration.md (linked from the README) is
// generated from the Config structs; this test fails when they drift (and
// rewrites it with SLUICE_UPDATE_README=1, the name from when the table was
// in the README).
func TestReadmeConfigTable(t *testing.T) {
	const path = "../../docs/configuration.md"
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(raw)
	i, j := strings.Index(page, tableBegin), strings.Index(page, tableEnd)
	if i < 0 || j < i {
		t.Fatalf("docs/configuration.md lacks the config table markers %q … %q", tableBegin, tableEnd)
	}
	want := page[:i+len(tableBegin)] + "\n" + configTable() + page[j:]
	if want == string(raw) {
		return
	}
	if os.Getenv("SLUICE_UPDATE_README") == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatal("docs/configuration.md's config table is out of date; run: SLUICE_UPDATE_README=1 go test ./cmd/sluice -run TestReadmeConfigTable")
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
