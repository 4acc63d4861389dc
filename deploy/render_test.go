package deploy

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const chartDir = "helm/sluice"

// testNamespace and testRelease are what the chart is rendered into.
const (
	testNamespace = "notify"
	testRelease   = "sluice"
)

// rendered is one install of the chart, every manifest decoded.
type rendered struct {
	manifest string // the whole rendered text
	objects  []object
}

type object struct {
	source string // the template that made it
	kind   string
	name   string
	obj    any // a pointer to the typed object
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load the chart: %v", err)
	}
	return c
}

// valuesFiles are the chart's example values (ci/*.yaml, the chart-testing
// convention): every one is rendered and checked.
func valuesFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values files in %s/ci: %v", chartDir, err)
	}
	return files
}

func readValues(t *testing.T, file string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(file)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return v
}

// install renders the chart as `helm install --dry-run --client-only`
// does without a cluster, against Kubernetes kubeVersion: the chart's
// dependencies and kubeVersion constraint, its values checked against
// values.schema.json, the templates rendered by Helm's engine, NOTES.txt
// left out and the manifests in Helm's install order (a hook, which
// action would set apart from the manifest, is refused: the chart has
// none). It calls Helm's packages below pkg/action, whose Kubernetes
// clients, kustomize, OCI registry and SQL storage (430 of the 1,166
// packages this module's tests built) took a cold build 157 s more CPU
// (557 s against 400 s) for nothing a client-only render uses.
func install(c *chart.Chart, vals map[string]any, kubeVersion string) (string, error) {
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return "", err
	}
	if err := chartutil.ProcessDependenciesWithMerge(c, vals); err != nil {
		return "", err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	opts := chartutil.ReleaseOptions{Name: testRelease, Namespace: testNamespace, Revision: 1, IsInstall: true}
	top, err := chartutil.ToRenderValuesWithSchemaValidation(c, vals, opts, caps, false)
	if err != nil {
		return "", err
	}
	// After the values, as action checks it.
	if want := c.Metadata.KubeVersion; want != "" && !chartutil.IsCompatibleRange(want, kv.String()) {
		return "", fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", want, kv)
	}
	files, err := engine.Render(c, top)
	if err != nil {
		return "", err
	}
	for name := range files {
		if strings.HasSuffix(name, "NOTES.txt") {
			delete(files, name)
		}
	}
	hooks, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return "", err
	}
	if len(hooks) != 0 {
		return "", fmt.Errorf("the chart has %d hooks; install renders no hooks", len(hooks))
	}
	var b strings.Builder
	for _, m := range manifests {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	return b.String(), nil
}

// render installs the chart with vals and decodes every manifest strictly.
func render(t *testing.T, c *chart.Chart, vals map[string]any) rendered {
	t.Helper()
	manifest, err := install(c, vals, "v1.31.0")
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	r := rendered{manifest: manifest}
	docs := releaseutil.SplitManifests(manifest)
	keys := make([]string, 0, len(docs))
	for k := range docs {
		keys = append(keys, k)
	}
	sort.Sort(releaseutil.BySplitManifestsOrder(keys))
	for _, k := range keys {
		doc := docs[k]
		if strings.TrimSpace(doc) == "" {
			continue
		}
		o, err := decode(doc)
		if err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		r.objects = append(r.objects, o)
	}
	return r
}

// decode reads one manifest into the Go type of its apiVersion and kind, as
// strictly as the API server does: an unknown field, a field in the wrong
// case or a duplicate field is an error.
func decode(doc string) (object, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	js, err := yaml.YAMLToJSONStrict([]byte(doc))
	if err != nil {
		return object{}, fmt.Errorf("not YAML: %w", err)
	}
	if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
		return object{}, err
	}
	source := ""
	if _, after, ok := strings.Cut(doc, "# Source: "); ok {
		source, _, _ = strings.Cut(after, "\n")
	}
	var obj any
	switch head.APIVersion + " " + head.Kind {
	case "apps/v1 Deployment":
		obj = &appsv1.Deployment{}
	case "apps/v1 StatefulSet":
		obj = &appsv1.StatefulSet{}
	case "v1 Service":
		obj = &corev1.Service{}
	case "v1 ConfigMap":
		obj = &corev1.ConfigMap{}
	case "policy/v1 PodDisruptionBudget":
		obj = &policyv1.PodDisruptionBudget{}
	case "networking.k8s.io/v1 Ingress":
		obj = &networkingv1.Ingress{}
	case "keda.sh/v1alpha1 ScaledObject":
		obj = &scaledObject{}
	case "monitoring.coreos.com/v1 PodMonitor":
		obj = &podMonitor{}
	case "monitoring.coreos.com/v1 PrometheusRule":
		obj = &prometheusRule{}
	default:
		return object{}, fmt.Errorf("%s: %s %s is a kind the tests do not know: add its Go type to decode", source, head.APIVersion, head.Kind)
	}
	strict, err := sigsjson.UnmarshalStrict(js, obj, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return object{}, fmt.Errorf("%s: %s %s: %w", source, head.Kind, head.Metadata.Name, err)
	}
	if len(strict) > 0 {
		return object{}, fmt.Errorf("%s: %s %s: %v", source, head.Kind, head.Metadata.Name, strict)
	}
	return object{source: source, kind: head.Kind, name: head.Metadata.Name, obj: obj}, nil
}

// find returns the objects of one Go type.
func find[T any](r rendered) []*T {
	var out []*T
	for _, o := range r.objects {
		if v, ok := o.obj.(*T); ok {
			out = append(out, v)
		}
	}
	return out
}

// one returns the object of type T named name.
func one[T any](t *testing.T, r rendered, name string) *T {
	t.Helper()
	for _, o := range r.objects {
		if v, ok := o.obj.(*T); ok && o.name == name {
			return v
		}
	}
	var names []string
	for _, o := range r.objects {
		names = append(names, o.kind+"/"+o.name)
	}
	t.Fatalf("no %T named %s; rendered: %s", new(T), name, strings.Join(names, ", "))
	return nil
}

// has reports whether an object of kind named name was rendered.
func (r rendered) has(kind, name string) bool {
	return slices.ContainsFunc(r.objects, func(o object) bool { return o.kind == kind && o.name == name })
}

// withValues returns a deep copy of vals with path (dotted) set to v.
func withValues(t *testing.T, vals map[string]any, set map[string]any) map[string]any {
	t.Helper()
	b, err := yaml.Marshal(vals)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	if err := yaml.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	for path, v := range set {
		m := out
		parts := strings.Split(path, ".")
		for _, p := range parts[:len(parts)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[parts[len(parts)-1]] = v
	}
	return out
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
