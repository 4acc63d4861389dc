package throttle_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// packageDoc is the package comment of doc.go.
func packageDoc(t *testing.T) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil || f.Doc == nil {
		t.Fatalf("doc.go has no package comment: %v", err)
	}
	return f.Doc.Text()
}

// The package doc names files that exist — the script a check runs among
// them (it once named a scripts/allow.lua long gone).
func TestPackageDoc(t *testing.T) {
	doc := packageDoc(t)
	if !strings.Contains(doc, "scripts/limiter.lua") {
		t.Error("the package doc does not name scripts/limiter.lua, the script every check runs")
	}
	for _, m := range regexp.MustCompile(`[\w/]+\.(?:lua|go)\b`).FindAllString(doc, -1) {
		path := m
		if strings.HasPrefix(m, "scripts/") {
			path = filepath.Join("..", m)
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("the package doc names %s, which does not exist", m)
		}
	}
}

// The package doc lists every operation of the limiter library, by opcode
// and name as each scripts/op_*.lua declares itself (it once listed four
// of nine).
func TestPackageDocListsEveryOperation(t *testing.T) {
	doc := packageDoc(t)
	files, err := filepath.Glob("../scripts/op_*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no op_*.lua files: %v", err)
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`Opcode "(\w)", (\w+)`).FindStringSubmatch(string(src))
		if m == nil {
			t.Fatalf("%s declares no opcode", f)
		}
		if want := "- " + m[1] + " " + m[2]; !strings.Contains(doc, want) {
			t.Errorf("the package doc does not list %q (%s)", want, filepath.Base(f))
		}
	}
}
