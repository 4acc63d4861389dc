package plans_test

import (
	"go/parser"
	"go/token"
	"os/exec"
	"strings"
	"testing"
)

// The package doc lists what plans depends on beyond the standard library;
// it once listed fewer than the package imports.
func TestPackageDoc(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil || f.Doc == nil {
		t.Fatalf("doc.go has no package comment: %v", err)
	}
	doc := f.Doc.Text()
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, "github.com/sluicehq/sluice/plans").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, imp := range strings.Fields(string(out)) {
		first, _, _ := strings.Cut(imp, "/")
		if !strings.Contains(first, ".") {
			continue // the standard library
		}
		name := imp
		if rest, ok := strings.CutPrefix(imp, "github.com/sluicehq/sluice/"); ok {
			name = rest // Sluice's own packages are named by their short name
		}
		if !strings.Contains(doc, name) {
			t.Errorf("plans imports %s, which its package doc does not name", imp)
		}
	}
}
