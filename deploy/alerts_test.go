package deploy

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// AlertsFile is the alert rules the chart's PrometheusRule carries.
const AlertsFile = "helm/sluice/files/sluice-alerts.yaml"

var promql = parser.NewParser(parser.Options{})

// parseRules reads a rule file as `promtool check rules` does: strict YAML,
// every expression parsed, every template in labels and annotations parsed,
// names valid, no duplicate groups.
func parseRules(t *testing.T, content []byte) *rulefmt.RuleGroups {
	t.Helper()
	groups, errs := rulefmt.Parse(content, false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("alert rules: %v", err)
	}
	if groups == nil {
		t.FailNow()
	}
	return groups
}

// The alerts, each with a severity, a summary and a description.
func TestAlertRules(t *testing.T) {
	groups := parseRules(t, readFile(t, AlertsFile))
	var names []string
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: want a severity label, a summary and a description", r.Alert)
			}
		}
	}
	for _, want := range []string{"SluiceRedisUnreachable", "SluiceDoneRecordsLost", "SluiceOrphansRequeued",
		"SluiceSendsFailingPermanently", "SluiceSendsLateForSlot", "SluicePriorityLaneSlow",
		"SluiceRedisEvictedKeys", "SluiceRedisNotCrashSafe", "SluiceRedisMemoryHigh", "SluiceProviderDown"} {
		if !slices.Contains(names, want) {
			t.Errorf("no alert %s", want)
		}
	}
	// A broken expression is caught, so the check above can fail.
	if _, errs := rulefmt.Parse([]byte("groups:\n- name: x\n  rules:\n  - alert: X\n    expr: sum(rate(x[5m])\n"), false, model.UTF8Validation, promql, slog.New(slog.DiscardHandler)); len(errs) == 0 {
		t.Error("rulefmt accepted a broken expression")
	}
}

// checkRuleGroups: the chart's PrometheusRule holds the rule file's groups.
func checkRuleGroups(t *testing.T, pr *prometheusRule) {
	t.Helper()
	spec, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	got := parseRules(t, spec)
	want := parseRules(t, readFile(t, AlertsFile))
	if len(got.Groups) != len(want.Groups) {
		t.Fatalf("PrometheusRule has %d groups, %s %d", len(got.Groups), AlertsFile, len(want.Groups))
	}
	for i := range want.Groups {
		if len(got.Groups[i].Rules) != len(want.Groups[i].Rules) {
			t.Errorf("group %s: %d rules, want %d", want.Groups[i].Name, len(got.Groups[i].Rules), len(want.Groups[i].Rules))
			continue
		}
		for j, r := range want.Groups[i].Rules {
			g := got.Groups[i].Rules[j]
			if g.Alert != r.Alert || g.Expr != r.Expr || g.For != r.For || g.Annotations["description"] != r.Annotations["description"] {
				t.Errorf("PrometheusRule rule %s differs from %s", r.Alert, AlertsFile)
			}
		}
	}
}

// The dashboard JSON in the chart is what Dashboard() builds.
// SLUICE_UPDATE_DEPLOY=1 writes it.
func TestDashboardIsGenerated(t *testing.T) {
	got, err := Dashboard()
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("SLUICE_UPDATE_DEPLOY") == "1" {
		if err := os.WriteFile(DashboardFile, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if want, _ := os.ReadFile(DashboardFile); !bytes.Equal(got, want) {
		t.Fatalf("%s is not what deploy/dashboard.go builds; run SLUICE_UPDATE_DEPLOY=1 go test ./... -run TestDashboardIsGenerated in deploy/", DashboardFile)
	}
	var d struct {
		Panels []struct {
			Type  string `json:"type"`
			Title string `json:"title"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(got, &d); err != nil {
		t.Fatal(err)
	}
	var titles []string
	for _, p := range d.Panels {
		titles = append(titles, p.Title)
	}
	for _, want := range []string{"Sends by result and channel", "Throttled vs failed", "New waits by reason", "Slot lateness",
		"Provider back-pressure and in-flight caps", "Limiter errors /s", "Orphans requeued (1h)", "Done records lost (1h)", "Per-tenant usage", "Oldest waiting priority task", "Waiting for a worker by lane"} {
		if !slices.Contains(titles, want) {
			t.Errorf("the dashboard has no panel %q", want)
		}
	}
}

// dashboardQueries returns every PromQL expression of the dashboard.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	var d struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(readFile(t, DashboardFile), &d); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			out = append(out, q.Expr)
		}
	}
	if len(out) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return out
}

// metricNames parses a PromQL expression and returns the metric families it
// reads (a histogram's _bucket, _sum and _count are its family's).
func metricNames(t *testing.T, expr string) []string {
	t.Helper()
	// Grafana replaces its interval variables before Prometheus sees the query.
	e, err := promql.ParseExpr(strings.ReplaceAll(expr, "$__rate_interval", "5m"))
	if err != nil {
		t.Errorf("%s: %v", expr, err)
		return nil
	}
	var out []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			name := vs.Name
			for _, m := range vs.LabelMatchers {
				if m.Name == model.MetricNameLabel {
					name = m.Value
				}
			}
			out = append(out, name)
		}
		return nil
	})
	if len(out) == 0 {
		t.Errorf("%s reads no metric", expr)
	}
	return out
}
