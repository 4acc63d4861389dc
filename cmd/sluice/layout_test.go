package main

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

// The README's Layout table names every top-level folder and every
// package under internal/, and no path that does not exist.
func TestDocsReadmeLayout(t *testing.T) {
	t.Parallel()
	for _, err := range checkReadmeLayout(os.DirFS("../..")) {
		t.Error(err)
	}
}

// The layout check catches a folder or an internal package the table
// leaves out and a path it names that is gone, and passes a tree it fits.
func TestDocsReadmeLayoutCatchesFaults(t *testing.T) {
	t.Parallel()
	readme := "# X\n\n## Layout\n\n| path | owns |\n|---|---|\n" +
		"| `tasks/` | the format; `tasks/testdata` |\n| `internal/a`, `internal/b` | utilities |\n| `README.md` | this |\n\n## Next\n\n| `gone/` | not the table |\n"
	good := fstest.MapFS{
		"README.md":             {Data: []byte(readme)},
		"tasks/task.go":         {Data: []byte("package tasks")},
		"tasks/testdata/x.json": {Data: []byte("{}")},
		"internal/a/a.go":       {Data: []byte("package a")},
		"internal/b/b.go":       {Data: []byte("package b")},
		"internal/notes/x.md":   {Data: []byte("not a package")},
		".git/HEAD":             {Data: []byte("ref")},
	}
	if errs := checkReadmeLayout(good); len(errs) != 0 {
		t.Errorf("a tree the table fits: %v", errs)
	}
	clone := func() fstest.MapFS {
		c := fstest.MapFS{}
		for k, v := range good {
			c[k] = v
		}
		return c
	}
	with := func(name, data string) fstest.MapFS {
		c := clone()
		c[name] = &fstest.MapFile{Data: []byte(data)}
		return c
	}
	without := func(name string) fstest.MapFS {
		c := clone()
		delete(c, name)
		return c
	}
	for name, tc := range map[string]struct {
		fsys fstest.MapFS
		want string
	}{
		"Folder":          {with("worker/w.go", "package worker"), "README.md's Layout table does not name worker/"},
		"InternalPackage": {with("internal/c/c.go", "package c"), "README.md's Layout table does not name internal/c"},
		"StalePath":       {without("internal/b/b.go"), "README.md's Layout table names internal/b, which does not exist"},
		"StaleInProse":    {without("tasks/testdata/x.json"), "README.md's Layout table names tasks/testdata, which does not exist"},
	} {
		errs := checkReadmeLayout(tc.fsys)
		if !slices.ContainsFunc(errs, func(err error) bool { return err.Error() == tc.want }) {
			t.Errorf("%s: got %v, want %q", name, errs, tc.want)
		}
	}
}

var codeSpanRe = regexp.MustCompile("`([^`]+)`")

// layoutTable returns the rows of README.md's table under "## Layout",
// each as its cells.
func layoutTable(readme string) [][]string {
	var rows [][]string
	in := false
	for _, line := range strings.Split(readme, "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## Layout"
		case in && strings.HasPrefix(line, "|") && !strings.HasPrefix(line, "|---"):
			rows = append(rows, strings.Split(strings.Trim(line, "|"), " | "))
		}
	}
	if len(rows) > 0 {
		rows = rows[1:] // the header
	}
	return rows
}

// checkReadmeLayout compares the Layout table with the tree: every
// top-level folder (but hidden ones) is a path of the first column or
// holds one; every folder under internal/ with Go files is one; and every
// path the table names in code — the first column's, and the second's
// that start with a top-level folder — exists.
func checkReadmeLayout(fsys fs.FS) []error {
	raw, err := fs.ReadFile(fsys, "README.md")
	if err != nil {
		return []error{err}
	}
	rows := layoutTable(string(raw))
	if len(rows) == 0 {
		return []error{fmt.Errorf("README.md has no table under ## Layout")}
	}
	top, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return []error{err}
	}
	isTop := func(p string) bool {
		first, _, _ := strings.Cut(p, "/")
		return slices.ContainsFunc(top, func(e fs.DirEntry) bool { return e.IsDir() && e.Name() == first })
	}
	var named, mentioned []string
	for _, row := range rows {
		for _, m := range codeSpanRe.FindAllStringSubmatch(row[0], -1) {
			named = append(named, strings.TrimSuffix(m[1], "/"))
		}
		for _, cell := range row[1:] {
			for _, m := range codeSpanRe.FindAllStringSubmatch(cell, -1) {
				if strings.Contains(m[1], "/") && isTop(m[1]) && !strings.ContainsAny(m[1], " {*") {
					mentioned = append(mentioned, strings.TrimSuffix(m[1], "/"))
				}
			}
		}
	}
	var errs []error
	for _, p := range append(slices.Clone(named), mentioned...) {
		if _, err := fs.Stat(fsys, p); err != nil {
			errs = append(errs, fmt.Errorf("README.md's Layout table names %s, which does not exist", p))
		}
	}
	for _, e := range top {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") &&
			!slices.ContainsFunc(named, func(p string) bool { return p == e.Name() || strings.HasPrefix(p, e.Name()+"/") }) {
			errs = append(errs, fmt.Errorf("README.md's Layout table does not name %s/", e.Name()))
		}
	}
	return append(errs, unnamedInternal(fsys, named)...)
}

// unnamedInternal reports each folder under internal/ with Go files that
// named leaves out.
func unnamedInternal(fsys fs.FS, named []string) []error {
	dirs, err := fs.ReadDir(fsys, "internal")
	if err != nil {
		return nil // no internal/: nothing to name
	}
	var errs []error
	for _, d := range dirs {
		p := path.Join("internal", d.Name())
		if !d.IsDir() || slices.Contains(named, p) {
			continue
		}
		if goFiles, _ := fs.Glob(fsys, p+"/*.go"); len(goFiles) > 0 {
			errs = append(errs, fmt.Errorf("README.md's Layout table does not name %s", p))
		}
	}
	return errs
}
