package codecheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/keyspace"
)

const (
	keysBegin = "<!-- keys:begin (generated from keyspace/table.go by `SLUICE_UPDATE_DOCS=1 go test ./internal/codecheck -run TestKeysTableDoc`) -->"
	keysEnd   = "<!-- keys:end -->"
)

// docs/architecture.md shows the key table keyspace holds: the table
// between its markers is generated from keyspace.Table
// (SLUICE_UPDATE_DOCS=1 rewrites it), so the page and the keys the code
// builds, and the e2e scan checks, cannot disagree.
func TestKeysTableDoc(t *testing.T) {
	path := filepath.Join(repositoryRoot(t), "docs", "architecture.md")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(raw)
	i, j := strings.Index(page, keysBegin), strings.Index(page, keysEnd)
	if i < 0 || j < i {
		t.Fatalf("docs/architecture.md lacks the key table's markers %q … %q", keysBegin, keysEnd)
	}
	want := page[:i+len(keysBegin)] + "\n" + keyspace.Markdown() + page[j:]
	if want == page {
		return
	}
	if os.Getenv("SLUICE_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatal("docs/architecture.md's key table is not keyspace's; run: SLUICE_UPDATE_DOCS=1 go test ./internal/codecheck -run TestKeysTableDoc")
}
