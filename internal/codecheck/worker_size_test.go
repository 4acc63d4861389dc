package codecheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The send path lives in stages of their own types (worker/path.go
// composes them); Worker keeps the servers and the lifecycle. These bounds
// keep it that way: a field or method that belongs to a stage goes there.
const (
	maxWorkerFields  = 12
	maxWorkerMethods = 30
)

// Worker, in worker/, has at most maxWorkerFields fields and
// maxWorkerMethods methods (exported or not).
func TestWorkerStaysSmall(t *testing.T) {
	fields, methods, err := typeSize(filepath.Join(repositoryRoot(t), "worker"), "Worker")
	if err != nil {
		t.Fatal(err)
	}
	if fields < 0 {
		t.Fatal("worker.Worker not found: the check reads nothing")
	}
	if fields > maxWorkerFields {
		t.Errorf("worker.Worker has %d fields, want ≤ %d: move the send path's state into its stage", fields, maxWorkerFields)
	}
	if methods > maxWorkerMethods {
		t.Errorf("worker.Worker has %d methods, want ≤ %d: move the send path's steps into its stages", methods, maxWorkerMethods)
	}
	t.Logf("worker.Worker: %d fields (≤ %d), %d methods (≤ %d)", fields, maxWorkerFields, methods, maxWorkerMethods)
}

// The count sees what it claims to: a type with 13 fields and 31 methods.
func TestWorkerSizeCatchesFaults(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("package w\n\ntype Worker struct {\n\ta, b int\n")
	for i := range 11 {
		b.WriteString("\tf" + string(rune('a'+i)) + " string\n")
	}
	b.WriteString("}\n\nfunc (w Worker) M() {}\n")
	for i := range 30 {
		b.WriteString("func (w *Worker) m" + string(rune('a'+i%26)) + string(rune('a'+i/26)) + "() {}\n")
	}
	b.WriteString("func (o *Other) x() {}\n")
	if err := os.WriteFile(filepath.Join(dir, "w.go"), []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	fields, methods, err := typeSize(dir, "Worker")
	if err != nil {
		t.Fatal(err)
	}
	if fields != 13 || methods != 31 {
		t.Errorf("counted %d fields and %d methods, want 13 and 31", fields, methods)
	}
}

// typeSize counts the fields (each name one; an embedded type one) and
// methods of the struct type name declared in dir's non-test files; fields
// is -1 when dir declares no such struct.
func typeSize(dir, name string) (fields, methods int, err error) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, err
	}
	fields = -1
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			return 0, 0, err
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv != nil && len(d.Recv.List) == 1 && receiverType(d.Recv.List[0].Type) == name {
					methods++
				}
			case *ast.GenDecl:
				for _, s := range d.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok || ts.Name.Name != name {
						continue
					}
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						continue
					}
					fields = 0
					for _, fl := range st.Fields.List {
						fields += max(1, len(fl.Names))
					}
				}
			}
		}
	}
	return fields, methods, nil
}
