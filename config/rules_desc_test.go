package config_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/plans"
)

// kindExamples are one entry of every kind of the rule grammar, each with
// the word SLUICE_RULES' description must name for it.
var kindExamples = map[string]string{
	"sms:recipient=1/1m drop":          "drop",
	"sms:provider:concurrency=10":      "concurrency=",
	"sms.otp:exempt":                   ":exempt",
	"sms:quiet=tcpa":                   "quiet=",
	"sms:max-defer=1h":                 "max-defer=",
	"sms:rerun=at-most-once":           "rerun=",
	"tz=America/New_York":              "tz=",
	"email.news:bulk":                  ":bulk",
	"email:unsubscribe=hosted":         "unsubscribe=",
	"acme/shard=1":                     "shard=",
	"acme/weight=4":                    "weight=",
	"sms:providers=backup+default":     "providers=",
	"email.comment:digest=max:50":      "digest=",
	"*.marketing:user=required":        "user=required",
	"sms.otp:consent=exempt":           "consent=exempt",
	"sms:optout=category":              "optout=",
	"sms:reply-help=Reply STOP to end": "reply-",
	"sms:keywords-stop=BASTA":          "keywords-",
	"max-queued=10":                    "max-queued=",
	"max-queued-bytes=1000":            "max-queued-bytes=",
	"acme/sms:inbound=+14155550100|MG0123456789abcdef0123456789abcdef": "sms:inbound=",
}

// SLUICE_RULES' description (which docs/configuration.md is generated
// from) names every kind of entry the grammar has: it once named 6 of 16.
// The kinds are read from the plans package's source, so a new kind
// without an example here fails too.
func TestRulesDescriptionNamesEveryKind(t *testing.T) {
	t.Parallel()
	f, ok := reflect.TypeOf(config.Base{}).FieldByName("Rules")
	if !ok {
		t.Fatal("config.Base has no Rules field")
	}
	desc := f.Tag.Get("desc")
	seen := map[plans.Kind]bool{}
	for entry, word := range kindExamples {
		p, err := plans.Parse(entry)
		if err != nil || len(p.Entries()) != 1 {
			t.Fatalf("example %q: %v, %d entries", entry, err, len(p.Entries()))
		}
		seen[p.Entries()[0].Kind] = true
		if !strings.Contains(desc, word) {
			t.Errorf("SLUICE_RULES' description does not name %q (entries like %q)", word, entry)
		}
	}
	declared := kindConsts(t, filepath.Join("..", "plans"))
	if len(declared) < 10 || len(seen) != len(declared) {
		t.Errorf("the examples cover %d kinds; plans declares %d (%v): give each kind an example", len(seen), len(declared), declared)
	}
}

// kindConsts are the names of the constants of type Kind declared in the
// package at dir (iota runs included), tests aside.
func kindConsts(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			typ := ""
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if vs.Type != nil || len(vs.Values) > 0 { // a new expression; otherwise the run goes on
					typ = ""
					if id, ok := vs.Type.(*ast.Ident); ok {
						typ = id.Name
					}
				}
				if typ == "Kind" {
					for _, n := range vs.Names {
						names = append(names, n.Name)
					}
				}
			}
		}
	}
	return names
}
