package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// DocsFile is the page with the chart's values table.
const DocsFile = "../docs/kubernetes.md"

const (
	tableBegin = "<!-- values-table:begin (generated from deploy/helm/sluice/values.yaml by `SLUICE_UPDATE_DEPLOY=1 go test -run TestValuesTable` in deploy/) -->"
	tableEnd   = "<!-- values-table:end -->"
)

// valueDoc is one documented value of values.yaml.
type valueDoc struct{ path, def, desc string }

// valueDocs walks values.yaml: every leaf (a scalar, a list, or a map whose
// comment documents it whole) with its "# --" comment.
func valueDocs(t *testing.T) []valueDoc {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal(readFile(t, chartDir+"/values.yaml"), &doc); err != nil {
		t.Fatal(err)
	}
	var out []valueDoc
	var walk func(n *yaml.Node, prefix string)
	walk = func(n *yaml.Node, prefix string) {
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			path := prefix + k.Value
			desc := ""
			if _, after, ok := strings.Cut(k.HeadComment, "# -- "); ok {
				for _, line := range strings.Split(after, "\n") {
					desc += " " + strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "#"))
				}
				desc = strings.TrimSpace(desc)
			}
			if v.Kind == yaml.MappingNode && len(v.Content) > 0 && desc == "" {
				walk(v, path+".")
				continue
			}
			if desc == "" {
				t.Errorf("values.yaml: %s has no \"# --\" comment", path)
			}
			var val any
			if err := v.Decode(&val); err != nil {
				t.Fatal(err)
			}
			def := v.Value
			if v.Kind != yaml.ScalarNode || v.Tag == "!!str" {
				b, _ := json.Marshal(val)
				def = string(b)
			}
			out = append(out, valueDoc{path, def, desc})
		}
	}
	walk(doc.Content[0], "")
	return out
}

func valuesTable(docs []valueDoc) string {
	var b strings.Builder
	b.WriteString("| Value | Default | Meaning |\n|---|---|---|\n")
	for _, d := range docs {
		fmt.Fprintf(&b, "| `%s` | `%s` | %s |\n", d.path, strings.ReplaceAll(d.def, "|", `\|`), strings.ReplaceAll(d.desc, "|", `\|`))
	}
	return b.String()
}

// docs/kubernetes.md's values table is values.yaml's, every value documented.
func TestValuesTable(t *testing.T) {
	table := valuesTable(valueDocs(t))
	page := string(readFile(t, DocsFile))
	begin, end := strings.Index(page, tableBegin), strings.Index(page, tableEnd)
	if begin < 0 || end < begin {
		t.Fatalf("%s has no values table markers", DocsFile)
	}
	got := page[begin+len(tableBegin)+1 : end]
	if got == table {
		return
	}
	if os.Getenv("SLUICE_UPDATE_DEPLOY") == "1" {
		page = page[:begin+len(tableBegin)+1] + table + page[end:]
		if err := os.WriteFile(DocsFile, []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's values table is not values.yaml's; run SLUICE_UPDATE_DEPLOY=1 go test -run TestValuesTable in deploy/", DocsFile)
}
