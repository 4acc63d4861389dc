package app_test

import (
	"fmt"
	"go/parser"
	"go/token"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/tasks"
)

// The endpoint lists of api/doc.go and dashboard/doc.go are the routes
// `sluice api` serves, as NewAPI builds it: no route left out, none listed
// that is not served. The dashboard's list holds the routes under /ui, the
// API's every other one.
func TestRoutesDoc(t *testing.T) {
	t.Parallel()
	cfg, err := api.ParseConfig(map[string]string{
		"SLUICE_REDIS_URL":      "redis://127.0.0.1:1", // never dialled: the server is built, not run
		"SLUICE_SUBJECT_SECRET": "test-secret-0123456789",
		"SLUICE_PAYLOAD_KEYS":   tasks.NewKeySpec("routes"),
		"SLUICE_API_TOKEN_KEY":  "token-key-0123456789abcdef0123456789",
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := app.NewAPI(cfg, map[string]string{}, app.APIOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	served := map[bool][]string{} // under /ui or not → patterns
	for _, p := range srv.Patterns() {
		p = foldWebhookRoute(p)
		if !slices.Contains(served[underUI(p)], p) {
			served[underUI(p)] = append(served[underUI(p)], p)
		}
	}
	for _, doc := range []struct {
		file string
		ui   bool
	}{{"../api/doc.go", false}, {"../dashboard/doc.go", true}} {
		text := packageDoc(t, doc.file)
		for _, err := range compareRoutes(doc.file, documentedRoutes(text), served[doc.ui]) {
			t.Error(err)
		}
		if !doc.ui {
			for _, name := range app.WebhookNames() {
				if !regexp.MustCompile(`\b` + name + `\b`).MatchString(text) {
					t.Errorf("%s does not name the webhook provider %s beside /v1/webhooks/{provider}/{tenant}", doc.file, name)
				}
			}
		}
	}
}

// The comparison catches a route served and not listed and a route listed
// and not served, reads method lists, path lists, queries and ANY, and
// skips prose and continuation lines.
func TestRoutesDocCatchesFaults(t *testing.T) {
	t.Parallel()
	doc := "Prose: GET /not/a/route.\n\n\tGET, POST /a, /b   two methods, two paths\n\t                  a continuation: GET /c\n" +
		"\tDELETE /d?x=1     a query\n\tANY  /e/          every method\n"
	want := []string{"GET /a", "GET /b", "POST /a", "POST /b", "DELETE /d", "/e/"}
	if got := documentedRoutes(doc); !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(slices.Values(want))) {
		t.Errorf("read %q, want %q", slices.Sorted(maps.Keys(got)), want)
	}
	if errs := compareRoutes("doc.go", documentedRoutes(doc), want); len(errs) != 0 {
		t.Errorf("equal lists: %v", errs)
	}
	errs := compareRoutes("doc.go", documentedRoutes(doc), append(want[1:], "PUT /f"))
	got := fmt.Sprint(errs)
	for _, w := range []string{`doc.go lists "GET /a", which sluice api does not serve`, `sluice api serves "PUT /f", which doc.go does not list`} {
		if !strings.Contains(got, w) {
			t.Errorf("got %v, want %q among them", errs, w)
		}
	}
}

// packageDoc is the package comment of the Go file at path.
func packageDoc(t *testing.T, path string) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil || f.Doc == nil {
		t.Fatalf("%s has no package comment: %v", path, err)
	}
	return f.Doc.Text()
}

// methods are the words that start a route line; ANY stands for a
// pattern without a method.
var methods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "ANY"}

// documentedRoutes reads the route lines of a package doc: indented lines
// (a code block) that start with methods and go on with paths, e.g.
// "GET, POST /ui/login   sign in". Each method and path make a pattern
// as net/http writes it ("GET /ui/login"; ANY: the path alone); a query
// written after a path is not part of it.
func documentedRoutes(doc string) map[string]bool {
	routes := map[string]bool{}
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(line, "\t") {
			continue
		}
		fields := strings.Fields(line)
		var ms []string
		for len(fields) > 0 && slices.Contains(methods, strings.TrimSuffix(fields[0], ",")) {
			ms, fields = append(ms, strings.TrimSuffix(fields[0], ",")), fields[1:]
		}
		for ; len(ms) > 0 && len(fields) > 0 && strings.HasPrefix(fields[0], "/"); fields = fields[1:] {
			path, _, _ := strings.Cut(strings.TrimSuffix(fields[0], ","), "?")
			for _, m := range ms {
				if m == "ANY" {
					routes[path] = true
				} else {
					routes[m+" "+path] = true
				}
			}
		}
	}
	return routes
}

// compareRoutes reports every pattern served and not documented in file,
// and every one documented and not served.
func compareRoutes(file string, documented map[string]bool, served []string) []error {
	var errs []error
	for _, p := range served {
		if !documented[p] {
			errs = append(errs, fmt.Errorf("sluice api serves %q, which %s does not list", p, file))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(documented)) {
		if !slices.Contains(served, p) {
			errs = append(errs, fmt.Errorf("%s lists %q, which sluice api does not serve", file, p))
		}
	}
	return errs
}

// foldWebhookRoute writes an email provider's webhook route as the API's
// doc lists them all, with {provider} for its name.
func foldWebhookRoute(pattern string) string {
	for _, name := range app.WebhookNames() {
		if pattern == "POST /v1/webhooks/"+name+"/{tenant}" {
			return "POST /v1/webhooks/{provider}/{tenant}"
		}
	}
	return pattern
}

// underUI reports whether a pattern is the dashboard's: its path is /ui or under it.
func underUI(pattern string) bool {
	_, path, ok := strings.Cut(pattern, " ")
	if !ok {
		path = pattern
	}
	return path == "/ui" || strings.HasPrefix(path, "/ui/")
}
