package scripts_test

import (
	"context"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/scripts"
	"github.com/sluicehq/sluice/testkit/redistest"
)

// maxLines bounds a Lua file: one that grows past it is split, so every
// part can be read on its own.
const maxLines = 250

func TestLuaFilesAreShort(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.lua")
	if err != nil || len(files) == 0 {
		t.Fatalf("no Lua files: %v", err)
	}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if n := strings.Count(string(src), "\n"); n > maxLines {
			t.Errorf("%s has %d lines, more than %d: split it", f, n, maxLines)
		}
	}
}

// limiter.lua, the index, includes every part of the limiter once, and
// the library holds each part whole, in the index's order.
func TestLimiterIndexIncludesEveryPart(t *testing.T) {
	t.Parallel()
	index, err := os.ReadFile("limiter.lua")
	if err != nil {
		t.Fatal(err)
	}
	included := regexp.MustCompile(`(?m)^--#include (\S+)`).FindAllStringSubmatch(string(index), -1)
	parts, _ := filepath.Glob("limiter_*.lua")
	ops, _ := filepath.Glob("op_*.lua")
	want := append(append(parts, ops...), "consent.lua")
	seen := map[string]int{}
	at := 0
	for _, m := range included {
		seen[m[1]]++
		src, err := os.ReadFile(m[1])
		if err != nil {
			t.Fatalf("limiter.lua includes %s: %v", m[1], err)
		}
		i := strings.Index(scripts.Limiter.Code[at:], string(src))
		if i < 0 {
			t.Fatalf("the library does not hold %s whole after the parts before it", m[1])
		}
		at += i + len(src)
	}
	for _, f := range want {
		if seen[f] != 1 {
			t.Errorf("limiter.lua includes %s %d times, want once", f, seen[f])
		}
	}
	if len(seen) != len(want) {
		t.Errorf("limiter.lua includes %d files, want the %d parts %v", len(seen), len(want), want)
	}
	if strings.Contains(scripts.Limiter.Code, "\n--#include") {
		t.Error("the library still holds an include line")
	}
}

// The joined code loads in a real Redis: as the function library, as the
// script, and the consent rule on its own; an empty batch answers the
// clock alone.
func TestJoinedCodeRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, c := redistest.New(t)
	if err := c.FunctionLoadReplace(ctx, scripts.Limiter.Code).Err(); err != nil {
		t.Fatalf("FUNCTION LOAD: %v", err)
	}
	for name, run := range map[string]func() *redis.Cmd{
		"function": func() *redis.Cmd { return c.FCall(ctx, scripts.Limiter.Name, nil, "1234", 0) },
		"script":   func() *redis.Cmd { return scripts.Limiter.Script.Run(ctx, c, nil, "1234", 0) },
	} {
		res, err := run().Slice()
		if err != nil || len(res) != 1 || res[0] != int64(1234) {
			t.Errorf("%s, no operation: %v, %v; want [1234]", name, res, err)
		}
	}
	c.HSet(ctx, "h", "c:news", "0:1:api:0")
	res, err := scripts.ConsentCheck.Run(ctx, c, []string{"h"}, "", "news", "0").Slice()
	if err != nil || len(res) != 2 || res[0] != int64(2) || res[1] != "0:1:api:0" {
		t.Errorf("consent check: %v, %v; want [2 0:1:api:0]", res, err)
	}
}

// The package doc lists every operation of the limiter, by opcode, name and
// file, as each op_*.lua declares itself.
func TestPackageDocListsEveryOperation(t *testing.T) {
	t.Parallel()
	f, err := parser.ParseFile(token.NewFileSet(), "scripts.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil || f.Doc == nil {
		t.Fatalf("scripts.go has no package comment: %v", err)
	}
	doc := f.Doc.Text()
	files, _ := filepath.Glob("op_*.lua")
	for _, name := range files {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`Opcode "(\w)", (\w+)`).FindStringSubmatch(string(src))
		if m == nil {
			t.Fatalf("%s declares no opcode", name)
		}
		if want := "- " + m[1] + " " + m[2] + " (" + name + ")"; !strings.Contains(doc, want) {
			t.Errorf("the package doc does not list %q", want)
		}
	}
}

// fuzz.sh names every fuzz target of the module, so a new parser's fuzz
// target is fuzzed with the others.
func TestFuzzTargetsListed(t *testing.T) {
	t.Parallel()
	script, err := os.ReadFile("fuzz.sh")
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, m := range regexp.MustCompile(`([a-z/]+):(Fuzz\w+)`).FindAllStringSubmatch(string(script), -1) {
		listed[m[1]+":"+m[2]] = true
	}
	decl := regexp.MustCompile(`(?m)^func (Fuzz\w+)\(\w+ \*testing\.F\)`)
	found := 0
	err = filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "deploy" || d.Name() == "bench" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != ".." {
			return filepath.SkipDir // other modules, fuzz corpora
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(strings.TrimPrefix(path, "../")))
		for _, m := range decl.FindAllStringSubmatch(string(src), -1) {
			found++
			if target := pkg + ":" + m[1]; !listed[target] {
				t.Errorf("%s declares %s; scripts/fuzz.sh does not list %s", path, m[1], target)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found == 0 {
		t.Fatal("found no fuzz targets in the module")
	}
	if found != len(listed) {
		t.Errorf("fuzz.sh lists %d targets, the module declares %d", len(listed), found)
	}
}
