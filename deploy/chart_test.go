package deploy

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/tlstest"
	"github.com/sluicehq/sluice/worker"
)

// secrets is what an operator's Secrets hold, by Secret name and key:
// values the rendered manifests must never contain. Made once (TestMain).
var secrets map[string]map[string]string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-deploy-")
	if err != nil {
		panic(err)
	}
	certs, err := tlstest.Make(dir)
	if err != nil {
		panic(err)
	}
	ca, err := os.ReadFile(certs.CAFile)
	if err != nil {
		panic(err)
	}
	keys := map[string]string{
		"subject-secret":  "canary-subject-secret-5f0e2c8a9d",
		"payload-keys":    tasks.NewKeySpec("canary"),
		"api-token-key":   "canary-api-token-key-0123456789abcdef0123",
		"api-admin-token": "canary-api-admin-token-0123456789abcdef01",
		"redis-password":  "canary0redis0password0c6f1",
		"smtp-password":   "canary-smtp-password-7b2d",
		"sms-auth-token":  "canary-sms-auth-token-91ea",
	}
	secrets = map[string]map[string]string{"sluice": keys, "sluice-secrets": keys,
		"redis-ca": {"ca.crt": string(ca), "ca.pem": string(ca)}}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func testSecrets() map[string]map[string]string { return secrets }

// Every values file renders through Helm's install path, every manifest
// decodes strictly into its Kubernetes (or CRD) type, and the workloads are
// what Sluice needs.
func TestChartRendersEveryValuesFile(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	for _, file := range valuesFiles(t) {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".yaml"), func(t *testing.T) {
			vals := readValues(t, file)
			r := render(t, c, vals)
			w := one[appsv1.Deployment](t, r, "sluice-worker")
			checkPod(t, r, w.Spec.Template, "worker", "SLUICE_SHUTDOWN_TIMEOUT", "SLUICE_HTTP_ADDR")
			checkPDB(t, r, w)
			if w.Spec.Template.Spec.Containers[0].Resources.Limits.Cpu().Sign() != 0 {
				t.Error("the worker has a CPU limit: CFS throttling wakes sends late for their slot")
			}
			wenv := podEnv(t, w.Spec.Template.Spec, w.Spec.Template.Spec.Containers[0])
			if _, err := worker.ParseConfig(wenv); err != nil {
				t.Errorf("the worker's environment does not validate: %v", err)
			}
			checkNoSecrets(t, r)
			apiEnabled := r.has("Deployment", "sluice-api")
			if apiEnabled {
				a := one[appsv1.Deployment](t, r, "sluice-api")
				checkPod(t, r, a.Spec.Template, "api", "SLUICE_API_SHUTDOWN_TIMEOUT", "SLUICE_API_ADDR")
				checkPDB(t, r, a)
				checkAPIService(t, r, a)
				aenv := podEnv(t, a.Spec.Template.Spec, a.Spec.Template.Spec.Containers[0])
				if _, err := worker.ParseConfig(aenv); err != nil {
					t.Errorf("the API's shared environment does not validate: %v", err)
				}
				if _, err := api.ParseConfig(aenv); err != nil {
					t.Errorf("the API's environment does not validate: %v", err)
				}
				checkSameShared(t, w, a, wenv, aenv)
			}
			if len(find[scaledObject](r)) > 0 {
				checkKEDA(t, c, vals, r, w, wenv)
			} else if w.Spec.Replicas == nil {
				t.Error("no ScaledObject and no replicas")
			}
			if r.has("StatefulSet", "sluice-redis") {
				checkTrialRedis(t, r, wenv)
			}
			for _, pr := range find[prometheusRule](r) {
				checkRuleGroups(t, pr)
			}
			for _, cm := range find[corev1.ConfigMap](r) {
				if got, want := cm.Data["sluice.json"], string(readFile(t, DashboardFile)); strings.TrimSpace(got) != strings.TrimSpace(want) {
					t.Errorf("ConfigMap %s does not carry %s", cm.Name, DashboardFile)
				}
			}
		})
	}
}

// resolveEnv is the environment Kubernetes gives the container: values,
// Secret keys (a missing one is an error, as the kubelet makes it), and
// $(VAR) references to variables defined before.
func resolveEnv(t *testing.T, c corev1.Container, secrets map[string]map[string]string) map[string]string {
	t.Helper()
	if len(c.EnvFrom) > 0 {
		t.Errorf("%s: envFrom is not resolved by the tests", c.Name)
	}
	env := map[string]string{}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range c.Env {
		if _, dup := env[e.Name]; dup {
			t.Errorf("%s: %s is set twice", c.Name, e.Name)
		}
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = ref.ReplaceAllStringFunc(e.Value, func(m string) string {
				if v, ok := env[m[2:len(m)-1]]; ok {
					return v
				}
				return m
			})
		case e.ValueFrom.SecretKeyRef != nil:
			s := e.ValueFrom.SecretKeyRef
			v, ok := secrets[s.Name][s.Key]
			if !ok {
				t.Errorf("%s: %s reads key %q of Secret %q, which the test's Secret lacks", c.Name, e.Name, s.Key, s.Name)
			}
			env[e.Name] = v
		default:
			t.Errorf("%s: %s: only values and Secret keys are resolved by the tests", c.Name, e.Name)
		}
	}
	return env
}

// podEnv is the container's environment as the process sees it: resolveEnv,
// with paths into Secret volumes pointing at the Secret's files, written to
// a directory of the test's own.
func podEnv(t *testing.T, pod corev1.PodSpec, c corev1.Container) map[string]string {
	t.Helper()
	env := resolveEnv(t, c, testSecrets())
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 || pod.Volumes[i].Secret == nil {
			t.Fatalf("%s: mount %s is not a Secret volume of the pod", c.Name, m.Name)
		}
		name := pod.Volumes[i].Secret.SecretName
		if _, ok := testSecrets()[name]; !ok {
			t.Fatalf("%s: mounts Secret %q, which the test does not have", c.Name, name)
		}
		dir := filepath.Join(t.TempDir(), m.MountPath)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		for k, v := range testSecrets()[name] {
			if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		for k, v := range env {
			if rest, ok := strings.CutPrefix(v, m.MountPath+"/"); ok {
				env[k] = filepath.Join(dir, rest)
			}
		}
	}
	return env
}

// serviceLinks are the variables the kubelet adds to a pod for every Service
// of its namespace unless enableServiceLinks is false.
func serviceLinks(svcs []*corev1.Service) map[string]string {
	out := map[string]string{}
	for _, s := range svcs {
		n := strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
		out[n+"_SERVICE_HOST"] = "10.0.0.1"
		for i, p := range s.Spec.Ports {
			port := strconv.Itoa(int(p.Port))
			if i == 0 {
				out[n+"_SERVICE_PORT"], out[n+"_PORT"] = port, "tcp://10.0.0.1:"+port
			}
			if p.Name != "" {
				out[n+"_SERVICE_PORT_"+strings.ToUpper(strings.ReplaceAll(p.Name, "-", "_"))] = port
			}
			pre := n + "_PORT_" + port + "_TCP"
			out[pre], out[pre+"_PROTO"], out[pre+"_PORT"], out[pre+"_ADDR"] = "tcp://10.0.0.1:"+port, "tcp", port, "10.0.0.1"
		}
	}
	return out
}

func knownVariables() []string { return append(worker.KnownVariables(), api.KnownVariables()...) }

// checkPod checks what a Sluice pod needs: graceful shutdown within the
// grace period, liveness on /healthz and readiness on /readyz of the port
// the process listens on, requests, no service links, non-root.
func checkPod(t *testing.T, r rendered, pod corev1.PodTemplateSpec, container, shutdownVar, addrVar string) {
	t.Helper()
	spec := pod.Spec
	if len(spec.Containers) != 1 || spec.Containers[0].Name != container {
		t.Fatalf("%s: containers %v", container, spec.Containers)
	}
	c := spec.Containers[0]
	env := podEnv(t, spec, c)
	shutdown, err := time.ParseDuration(env[shutdownVar])
	if err != nil {
		t.Fatalf("%s: %s=%q: %v", container, shutdownVar, env[shutdownVar], err)
	}
	preStop := time.Duration(0)
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < preStop+shutdown+5*time.Second {
		t.Errorf("%s: terminationGracePeriodSeconds %v does not cover the preStop %s, %s=%s and a margin", container, g, preStop, shutdownVar, shutdown)
	}
	_, port, _ := strings.Cut(env[addrVar], ":")
	named := map[string]string{}
	for _, p := range c.Ports {
		named[p.Name] = strconv.Itoa(int(p.ContainerPort))
	}
	for what, probe := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != what || named[probe.HTTPGet.Port.String()] != port {
			t.Errorf("%s: want an HTTP probe of %s on the port %s listens on (%s); got %+v", container, what, addrVar, env[addrVar], probe)
		}
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("%s: no CPU or memory request", container)
	}
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		t.Errorf("%s: enableServiceLinks must be false", container)
	}
	// What the process would see in the namespace: no SLUICE_* name it refuses.
	seen := map[string]string{}
	for k, v := range env {
		seen[k] = v
	}
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		for k, v := range serviceLinks(find[corev1.Service](r)) {
			seen[k] = v
		}
	}
	if err := config.UnknownVariables(seen, knownVariables()); err != nil {
		t.Errorf("%s would refuse to start: %v", container, err)
	}
	sc := spec.SecurityContext
	if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s: want non-root and no service account token", container)
	}
	if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("%s: want a read-only root file system", container)
	}
}

func selects(t *testing.T, sel *metav1.LabelSelector, l map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	return !s.Empty() && s.Matches(labels.Set(l))
}

func checkPDB(t *testing.T, r rendered, d *appsv1.Deployment) {
	t.Helper()
	if !selects(t, d.Spec.Selector, d.Spec.Template.Labels) {
		t.Errorf("%s: its selector does not pick its own pods", d.Name)
	}
	for _, p := range find[policyv1.PodDisruptionBudget](r) {
		if p.Name == d.Name {
			if !selects(t, p.Spec.Selector, d.Spec.Template.Labels) || p.Spec.MaxUnavailable == nil {
				t.Errorf("PDB %s does not cover %s's pods with a maxUnavailable", p.Name, d.Name)
			}
			for _, other := range find[appsv1.Deployment](r) {
				if other.Name != d.Name && selects(t, p.Spec.Selector, other.Spec.Template.Labels) {
					t.Errorf("PDB %s also picks %s's pods", p.Name, other.Name)
				}
			}
			return
		}
	}
	t.Errorf("no PodDisruptionBudget for %s", d.Name)
}

func checkAPIService(t *testing.T, r rendered, a *appsv1.Deployment) {
	t.Helper()
	svc := one[corev1.Service](t, r, a.Name)
	if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, a.Spec.Template.Labels) {
		t.Errorf("Service %s does not pick the API pods", svc.Name)
	}
	ports := map[string]bool{}
	for _, p := range a.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = true
	}
	for _, p := range svc.Spec.Ports {
		if !ports[p.TargetPort.String()] {
			t.Errorf("Service %s targets port %s, which the API container does not name", svc.Name, p.TargetPort.String())
		}
	}
	for _, ing := range find[networkingv1.Ingress](r) {
		for _, rule := range ing.Spec.Rules {
			for _, p := range rule.HTTP.Paths {
				if p.Backend.Service == nil || p.Backend.Service.Name != svc.Name || p.Backend.Service.Port.Name != svc.Spec.Ports[0].Name {
					t.Errorf("Ingress %s routes to %+v, not the API Service", ing.Name, p.Backend)
				}
			}
		}
	}
}

// checkSameShared: the workers and the API agree on every variable of
// config.Base (Redis, the queue layout, the rules, ...), and take the
// subject secret and the payload keys from the same Secret key.
func checkSameShared(t *testing.T, w, a *appsv1.Deployment, wenv, aenv map[string]string) {
	t.Helper()
	for _, v := range config.Vars(config.Base{}) {
		if wenv[v.Name] != aenv[v.Name] {
			t.Errorf("workers and API disagree on %s", v.Name)
		}
	}
	refs := func(d *appsv1.Deployment) map[string]corev1.SecretKeySelector {
		out := map[string]corev1.SecretKeySelector{}
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				out[e.Name] = *e.ValueFrom.SecretKeyRef
			}
		}
		return out
	}
	wr, ar := refs(w), refs(a)
	for _, name := range []string{"SLUICE_SUBJECT_SECRET", "SLUICE_PAYLOAD_KEYS"} {
		if _, ok := wr[name]; !ok || wr[name] != ar[name] {
			t.Errorf("%s: workers read %+v, the API %+v: they must read the same Secret key", name, wr[name], ar[name])
		}
	}
}

// secretVars are the variables Sluice masks in its logs.
func secretVars() []string {
	var out []string
	for _, v := range append(worker.ConfigVars(), api.ConfigVars()...) {
		if v.Secret {
			out = append(out, v.Name)
		}
	}
	return out
}

// checkNoSecrets: no secret value is in any manifest; every secret variable
// comes from a Secret; Redis URLs carry no password.
func checkNoSecrets(t *testing.T, r rendered) {
	t.Helper()
	for _, keys := range testSecrets() {
		for k, v := range keys {
			if strings.Contains(r.manifest, v) {
				t.Errorf("the value of Secret key %s is in the rendered manifests", k)
			}
		}
	}
	var pods []corev1.PodSpec
	for _, d := range find[appsv1.Deployment](r) {
		pods = append(pods, d.Spec.Template.Spec)
	}
	for _, s := range find[appsv1.StatefulSet](r) {
		pods = append(pods, s.Spec.Template.Spec)
	}
	for _, p := range pods {
		for _, c := range p.Containers {
			for _, e := range c.Env {
				if slices.Contains(secretVars(), e.Name) && e.Name != "SLUICE_REDIS_URL" && (e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
					t.Errorf("%s: %s is not read from a Secret", c.Name, e.Name)
				}
				if e.Name == "SLUICE_REDIS_URL" {
					u, err := url.Parse(e.Value)
					if err != nil {
						t.Fatalf("%s: SLUICE_REDIS_URL %q: %v", c.Name, e.Value, err)
					}
					if pw, set := u.User.Password(); set && pw != "$(REDIS_PASSWORD)" {
						t.Errorf("%s: SLUICE_REDIS_URL carries a password", c.Name)
					}
				}
			}
		}
	}
}

// Putting a secret into values is refused, wherever it is put, and so is a
// password in redis.url; the error says where the secret belongs.
func TestChartRefusesSecretsInValues(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	base := readValues(t, filepath.Join(chartDir, "ci", "single-redis.yaml"))
	for _, name := range secretVars() {
		for _, where := range []string{"config.env", "worker.env", "api.env"} {
			vals := withValues(t, base, map[string]any{where + "." + name: "canary-in-values"})
			_, err := install(c, vals, "v1.31.0")
			if err == nil || !strings.Contains(err.Error(), "is a secret") {
				t.Errorf("%s.%s: want a refusal naming it a secret, got %v", where, name, err)
			}
		}
	}
	vals := withValues(t, base, map[string]any{"redis.url": "redis://:hunter2@redis:6379/0"})
	if _, err := install(c, vals, "v1.31.0"); err == nil || !strings.Contains(err.Error(), "put it in the Secret") {
		t.Errorf("a password in redis.url: got %v", err)
	}
	vals = withValues(t, base, map[string]any{"worker.env.SLUICE_RULES": "sms:recipient=1/1m"})
	if _, err := install(c, vals, "v1.31.0"); err == nil || !strings.Contains(err.Error(), "must agree") {
		t.Errorf("rules for the workers only: got %v", err)
	}
	vals = withValues(t, base, map[string]any{"redis.url": ""})
	if _, err := install(c, vals, "v1.31.0"); err == nil || !strings.Contains(err.Error(), "redis.url is required") {
		t.Errorf("no Redis: got %v", err)
	}
	vals = withValues(t, base, map[string]any{"autoscaling.enabled": true, "autoscaling.minReplicas": 0})
	if _, err := install(c, vals, "v1.31.0"); err == nil || !strings.Contains(err.Error(), "at least 1") {
		t.Errorf("scale to zero: got %v", err)
	}
	// The API's preStop sleep needs Kubernetes 1.30.
	if _, err := install(c, base, "v1.29.4"); err == nil {
		t.Error("the chart installs on Kubernetes 1.29, which has no preStop sleep")
	}
}

// Service links are why enableServiceLinks is false: with them, the API's
// Service alone gives the pods SLUICE_API_PORT and friends, and a worker
// refuses to start.
func TestServiceLinksWouldStopTheWorker(t *testing.T) {
	t.Parallel()
	r := render(t, loadChart(t), readValues(t, filepath.Join(chartDir, "ci", "single-redis.yaml")))
	err := config.UnknownVariables(serviceLinks(find[corev1.Service](r)), knownVariables())
	if !errors.Is(err, config.ErrConfig) || !strings.Contains(err.Error(), "SLUICE_API_PORT") {
		t.Fatalf("want the worker to refuse SLUICE_API_PORT, got %v", err)
	}
}

func mapsEqual(a, b map[string]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// checkTrialRedis: the trial Redis is what the workers dial, and a real
// redis-server started with its arguments has the settings Sluice needs.
func checkTrialRedis(t *testing.T, r rendered, wenv map[string]string) {
	t.Helper()
	sts := one[appsv1.StatefulSet](t, r, "sluice-redis")
	svc := one[corev1.Service](t, r, "sluice-redis")
	u, _ := url.Parse(wenv["SLUICE_REDIS_URL"])
	if u.Host != fmt.Sprintf("%s:%d", svc.Name, svc.Spec.Ports[0].Port) {
		t.Errorf("the workers dial %s, the trial Redis is %s:%d", u.Host, svc.Name, svc.Spec.Ports[0].Port)
	}
	c := sts.Spec.Template.Spec.Containers[0]
	env := resolveEnv(t, c, testSecrets())
	if pw, _ := u.User.Password(); pw != env["REDIS_PASSWORD"] {
		t.Error("the workers' Redis password is not the trial Redis's")
	}
	var args []string
	for i := 1; i < len(c.Args); i++ { // c.Args[0] is redis-server
		switch c.Args[i] {
		case "--dir", "--requirepass": // the test's own data directory; no password for the probe
			i++
			continue
		}
		args = append(args, c.Args[i])
	}
	if c.Args[0] != "redis-server" || !slices.Contains(c.Args, "--requirepass") {
		t.Errorf("trial Redis args %v: want redis-server with --requirepass", c.Args)
	}
	srv := redistest.Start(t, args...)
	got, err := srv.Client(t).ConfigGet(t.Context(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction"} {
		if got[k] != v {
			t.Errorf("trial Redis %s = %q, want %q", k, got[k], v)
		}
	}
	// Windows of recipient and sender rules exist per subject (millions):
	// they must stay compact listpacks. Tenant and provider windows are a few
	// keys, where a skiplist costs nothing that matters.
	cfg, err := worker.ParseConfig(wenv)
	if err != nil {
		t.Fatal(err)
	}
	policy, err := plans.Parse(cfg.Rules)
	if err != nil {
		t.Fatal(err)
	}
	listpack, _ := strconv.Atoi(got["zset-max-listpack-entries"])
	for _, e := range policy.Entries() {
		if e.Kind == plans.KindRate && (e.Scope == "recipient" || e.Scope == "sender") && e.Rule.Limit > listpack {
			t.Errorf("trial Redis zset-max-listpack-entries %d is below the limit of %s", listpack, e)
		}
	}
}
