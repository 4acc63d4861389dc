package tasks_test

import (
	"go/parser"
	"go/token"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/tasks"
)

// The package doc's Enqueue call passes the arguments Enqueue takes (it
// once showed a call without the key ring).
func TestPackageDoc(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil || f.Doc == nil {
		t.Fatalf("doc.go has no package comment: %v", err)
	}
	m := regexp.MustCompile(`tasks\.Enqueue\((.*)\)`).FindStringSubmatch(f.Doc.Text())
	if m == nil {
		t.Fatal("the package doc shows no tasks.Enqueue call")
	}
	depth, args := 0, 1
	for _, r := range m[1] {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				args++
			}
		}
	}
	ft := reflect.TypeOf(tasks.Enqueue)
	fixed := ft.NumIn()
	if ft.IsVariadic() {
		fixed--
	}
	if args != fixed {
		t.Errorf("the package doc calls tasks.Enqueue with %d arguments (%s); it takes %d before its options", args, strings.TrimSpace(m[1]), fixed)
	}
}
