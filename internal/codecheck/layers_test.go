package codecheck

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// module is the root module's path; the layers name its packages relative to it.
const module = "github.com/sluicehq/sluice"

// layer is one row of the package graph: packages that do not import one
// another, each importing only packages of the layers below.
type layer struct {
	what     string
	packages []string
}

// layers are the root module's packages, top to bottom. A package may
// import only packages of a lower layer: never one of its own layer, never
// one above. This table is the one place the layers are written;
// docs/architecture.md shows it, generated from here (TestLayersDoc).
// A new package goes in the highest layer its importers allow and above
// every layer it imports: where its imports put it.
var layers = []layer{
	{"the binary, and the tests of the whole", []string{"cmd/sluice", "e2e", "internal/codecheck"}},
	{"where each process is built", []string{"app"}},
	{"the processes' parts", []string{"worker", "api", "dashboard"}},
	{"the provider registries", []string{"sender/providers", "webhook/providers"}},
	{"one package per provider; the unsubscribe links", []string{"sender/logsender", "sender/smtp", "sender/twilio",
		"sender/telnyx", "sender/whatsapp", "sender/providers/internal/webhooksms", "webhook/ses", "webhook/sendgrid", "webhook/postmark",
		"webhook/mailgun", "unsubscribe"}},
	{"what providers share; what every process shares", []string{"sender", "webhook", "services"}},
	{"settings; the quota read model; inbound replies; delivery records; digests; the fair dispatch; batched completions", []string{"config", "report", "sender/inbound",
		"delivery", "digest", "internal/fairq", "internal/completer"}},
	{"rules, plans, quiet hours", []string{"plans"}},
	{"suppressions and the consent ledger", []string{"consent"}},
	{"the task format; the limiter", []string{"tasks", "throttle"}},
	{"the Lua Redis runs", []string{"scripts"}},
	{"internal utilities, outside the domain", []string{"internal/connlimit", "internal/lifecycle", "internal/orphans",
		"internal/redisguard", "internal/telemetry"}},
	{"internal utilities they use", []string{"internal/problem", "internal/pollgate"}},
	{"every Redis key Sluice writes or reads, and their table", []string{"keyspace"}},
}

// harness are the test harness's packages, beside the layers: tests and
// other harness packages import them, nothing else does; they may import
// any package of the layers.
var harness = []string{"testkit/redistest", "testkit/tlstest", "testkit/fakes", "testkit/webhooktest",
	"testkit/sluicetest", "testkit/apienv"}

// No package of the root module imports one of its own layer or of a
// layer above, or the test harness; every package has its place.
func TestLayers(t *testing.T) {
	t.Parallel()
	graph, err := importGraph(repositoryRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(graph) < 20 {
		t.Fatalf("go list found only %d packages: %v", len(graph), graph)
	}
	for _, p := range checkLayers(graph, layers, harness) {
		t.Error(p)
	}
}

// The check catches what it is for: an arrow up, an arrow within a layer,
// a production package importing the harness, a package in no layer, and a
// layer naming a package that does not exist; and it passes a good graph.
func TestLayersCatchFaults(t *testing.T) {
	t.Parallel()
	table := []layer{{"top", []string{"cmd"}}, {"middle", []string{"a", "b"}}, {"bottom", []string{"c"}}}
	good := map[string][]string{"cmd": {"a", "c"}, "a": {"c"}, "b": nil, "c": nil, "h": {"a"}}
	if p := checkLayers(good, table, []string{"h"}); len(p) != 0 {
		t.Errorf("a good graph: %q", p)
	}
	with := func(pkg string, imports ...string) map[string][]string {
		bad := map[string][]string{}
		for k, v := range good {
			bad[k] = v
		}
		bad[pkg] = append(slices.Clone(bad[pkg]), imports...)
		return bad
	}
	for name, tc := range map[string]struct {
		graph map[string][]string
		want  string
	}{
		"Up":         {with("c", "a"), "c (layer 3, bottom) imports a (layer 2, middle): an arrow up"},
		"SameLayer":  {with("a", "b"), "a (layer 2, middle) imports b (layer 2, middle), of its own layer"},
		"Harness":    {with("a", "h"), "a imports h, a test harness package"},
		"NoLayer":    {with("d"), "d is in no layer: add it to layers in internal/codecheck/layers_test.go where its imports put it"},
		"MissingPkg": {func() map[string][]string { g := with("cmd"); delete(g, "b"); return g }(), "layers names b, which is not a package of the module"},
	} {
		got := checkLayers(tc.graph, table, []string{"h"})
		if !slices.Contains(got, tc.want) {
			t.Errorf("%s: got %q, want %q among them", name, got, tc.want)
		}
	}
}

// importGraph lists every package of the module at root with the
// module's packages it imports (not its tests'), both relative to the
// module path.
func importGraph(root string) (map[string][]string, error) {
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w (%s)", err, stderrOf(err))
	}
	graph := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		pkg, ok := relative(fields[0])
		if !ok {
			return nil, fmt.Errorf("go list: %s is outside %s", fields[0], module)
		}
		graph[pkg] = nil
		for _, imp := range fields[1:] {
			if rel, ok := relative(imp); ok {
				graph[pkg] = append(graph[pkg], rel)
			}
		}
	}
	return graph, nil
}

// relative is path relative to the module; ok is false outside it.
func relative(path string) (string, bool) {
	if path == module {
		return ".", true
	}
	return strings.CutPrefix(path, module+"/")
}

func stderrOf(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return strings.TrimSpace(string(ee.Stderr))
	}
	return ""
}

// checkLayers returns, sorted, every fault of graph (package → the
// module's packages it imports) against table and harness.
func checkLayers(graph map[string][]string, table []layer, harness []string) []string {
	rank := map[string]int{} // package → its layer, 1 at the top
	for i, l := range table {
		for _, p := range l.packages {
			rank[p] = i + 1
		}
	}
	var problems []string
	for p := range rank {
		if _, ok := graph[p]; !ok {
			problems = append(problems, fmt.Sprintf("layers names %s, which is not a package of the module", p))
		}
	}
	describe := func(p string) string { return fmt.Sprintf("%s (layer %d, %s)", p, rank[p], table[rank[p]-1].what) }
	for pkg, imports := range graph {
		if slices.Contains(harness, pkg) {
			continue // the harness may import any package of the layers
		}
		if rank[pkg] == 0 {
			problems = append(problems, fmt.Sprintf("%s is in no layer: add it to layers in internal/codecheck/layers_test.go where its imports put it", pkg))
			continue
		}
		for _, imp := range imports {
			switch {
			case slices.Contains(harness, imp):
				problems = append(problems, fmt.Sprintf("%s imports %s, a test harness package", pkg, imp))
			case rank[imp] == 0:
				// in no layer: reported once, as a package
			case rank[imp] < rank[pkg]:
				problems = append(problems, fmt.Sprintf("%s imports %s: an arrow up", describe(pkg), describe(imp)))
			case rank[imp] == rank[pkg]:
				problems = append(problems, fmt.Sprintf("%s imports %s, of its own layer", describe(pkg), describe(imp)))
			}
		}
	}
	slices.Sort(problems)
	return problems
}

const (
	layersBegin = "<!-- layers:begin (generated from internal/codecheck/layers_test.go by `SLUICE_UPDATE_DOCS=1 go test ./internal/codecheck -run TestLayersDoc`) -->"
	layersEnd   = "<!-- layers:end -->"
)

// layersTable renders the layers as docs/architecture.md shows them.
func layersTable(table []layer, harness []string) string {
	var b strings.Builder
	b.WriteString("| layer | packages | what they are |\n|---|---|---|\n")
	code := func(pkgs []string) string { return "`" + strings.Join(pkgs, "`, `") + "`" }
	for i, l := range table {
		fmt.Fprintf(&b, "| %d | %s | %s |\n", i+1, code(l.packages), l.what)
	}
	fmt.Fprintf(&b, "| beside | %s | the test harness: imported by tests and by each other only |\n", code(harness))
	return b.String()
}

// docs/architecture.md shows the layers this test checks: the table
// between its markers is generated from layers (SLUICE_UPDATE_DOCS=1
// rewrites it), so the page and the check cannot disagree.
func TestLayersDoc(t *testing.T) {
	path := filepath.Join(repositoryRoot(t), "docs", "architecture.md")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(raw)
	i, j := strings.Index(page, layersBegin), strings.Index(page, layersEnd)
	if i < 0 || j < i {
		t.Fatalf("docs/architecture.md lacks the layer table's markers %q … %q", layersBegin, layersEnd)
	}
	want := page[:i+len(layersBegin)] + "\n" + layersTable(layers, harness) + page[j:]
	if want == page {
		return
	}
	if os.Getenv("SLUICE_UPDATE_DOCS") == "1" {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatal("docs/architecture.md's layer table is not the one layers_test.go checks; run: SLUICE_UPDATE_DOCS=1 go test ./internal/codecheck -run TestLayersDoc")
}

// internal/ holds only utilities below the domain's processes: no package
// under it imports the processes' parts (api, worker, dashboard), a sender,
// the unsubscribe links, what builds or opens a process (app, services) or
// the harness; and of the production packages only the binary builds a
// process (imports app). Tests and the harness (testkit) may.
func TestInternalIsBelowTheProcesses(t *testing.T) {
	t.Parallel()
	graph, err := importGraph(repositoryRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	above := []string{"api", "worker", "dashboard", "sender", "unsubscribe", "app", "services", "testkit"}
	for pkg, imps := range graph {
		for _, imp := range imps {
			if strings.HasPrefix(pkg, "internal/") {
				for _, a := range above {
					if imp == a || strings.HasPrefix(imp, a+"/") {
						t.Errorf("%s imports %s: internal/ holds utilities below the processes", pkg, imp)
					}
				}
			}
			if imp == "app" && pkg != "cmd/sluice" && !strings.HasPrefix(pkg, "testkit/") {
				t.Errorf("%s imports app: only the binary (and the harness) build a process", pkg)
			}
		}
	}
}
