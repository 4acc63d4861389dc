package deploy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	// The versions KEDA 2.12, the oldest the chart supports, evaluates
	// scalingModifiers and reads a metrics-api JSON answer with.
	"github.com/antonmedv/expr"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/tidwall/gjson"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/worker"
)

// kedaTriggers are the ScaledObject's triggers, by name (the formula's
// variables), with the field of the workers' GET /queue-depth each reads
// (worker.Depth).
var kedaTriggers = map[string]string{"waiting": "waiting", "priority": "priority"}

// checkKEDA: the ScaledObject scales the worker Deployment on the workers'
// own GET /queue-depth — the two metrics-api triggers, through the worker
// Service, on the port the workers listen on — never below one worker, and
// its formula, as KEDA evaluates it, asks for the workers the values say.
func checkKEDA(t *testing.T, c *chart.Chart, vals map[string]any, r rendered, w *appsv1.Deployment, wenv map[string]string) {
	t.Helper()
	sos := find[scaledObject](r)
	if len(sos) != 1 {
		t.Fatalf("%d ScaledObjects, want 1", len(sos))
	}
	so := sos[0]
	if ref := so.Spec.ScaleTargetRef; ref.Name != w.Name || (ref.Kind != "" && ref.Kind != "Deployment") {
		t.Errorf("ScaledObject scales %s %q, not the Deployment %s", ref.Kind, ref.Name, w.Name)
	}
	if w.Spec.Replicas != nil {
		t.Error("with KEDA the worker Deployment must leave replicas to the HPA")
	}
	if m := so.Spec.MinReplicaCount; m == nil || *m < 1 {
		t.Error("minReplicaCount below 1: with no worker nothing serves /queue-depth or dispatches the waiting rooms")
	}
	svc, port := checkWorkerService(t, r, w, wenv)
	want := url.URL{Scheme: "http", Host: net.JoinHostPort(svc+"."+testNamespace+".svc", strconv.Itoa(int(port))), Path: "/queue-depth"}
	names := map[string]bool{}
	for _, tr := range so.Spec.Triggers {
		names[tr.Name] = true
		loc, known := kedaTriggers[tr.Name]
		switch {
		case !known || tr.Type != "metrics-api":
			t.Errorf("trigger %s: a %s trigger; want only the metrics-api triggers %v", tr.Name, tr.Type, keys(boolSet(kedaTriggers)))
		case tr.Metadata["url"] != want.String():
			t.Errorf("trigger %s reads %s, want %s: the worker Service, its namespace, the port the workers listen on (%s)", tr.Name, tr.Metadata["url"], want.String(), wenv["SLUICE_HTTP_ADDR"])
		case tr.Metadata["valueLocation"] != loc || tr.Metadata["format"] != "json":
			t.Errorf("trigger %s reads %q of a %q answer, want %q of /queue-depth's JSON", tr.Name, tr.Metadata["valueLocation"], tr.Metadata["format"], loc)
		}
	}
	if !mapsEqual(names, boolSet(kedaTriggers)) {
		t.Errorf("the triggers are %v, want %v", keys(names), keys(boolSet(kedaTriggers)))
	}
	checkFormula(t, c, vals, so)
}

// checkWorkerService: the Service KEDA reads through picks the worker pods
// (and no others) and forwards a port to the one the workers listen on
// (SLUICE_HTTP_ADDR). It returns the Service's name and that port.
func checkWorkerService(t *testing.T, r rendered, w *appsv1.Deployment, wenv map[string]string) (string, int32) {
	t.Helper()
	svc := one[corev1.Service](t, r, w.Name)
	if typ := svc.Spec.Type; (typ != "" && typ != corev1.ServiceTypeClusterIP) || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		t.Errorf("Service %s is %s %s, want a ClusterIP Service: KEDA needs one address for any worker", svc.Name, typ, svc.Spec.ClusterIP)
	}
	sel := &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}
	if !selects(t, sel, w.Spec.Template.Labels) {
		t.Errorf("Service %s does not pick the worker pods", svc.Name)
	}
	for _, d := range find[appsv1.Deployment](r) {
		if d.Name != w.Name && selects(t, sel, d.Spec.Template.Labels) {
			t.Errorf("Service %s also picks %s's pods, which serve no /queue-depth", svc.Name, d.Name)
		}
	}
	_, listen, err := net.SplitHostPort(wenv["SLUICE_HTTP_ADDR"])
	if err != nil {
		t.Fatalf("SLUICE_HTTP_ADDR %q: %v", wenv["SLUICE_HTTP_ADDR"], err)
	}
	for _, p := range svc.Spec.Ports {
		target := p.TargetPort.String()
		for _, cp := range w.Spec.Template.Spec.Containers[0].Ports {
			if cp.Name == target || strconv.Itoa(int(cp.ContainerPort)) == target {
				target = strconv.Itoa(int(cp.ContainerPort))
			}
		}
		if target == listen {
			return svc.Name, p.Port
		}
	}
	t.Fatalf("Service %s forwards no port to the workers' %s (SLUICE_HTTP_ADDR): %+v", svc.Name, listen, svc.Spec.Ports)
	return "", 0
}

// checkFormula: scalingModifiers make one metric of the triggers, the
// workers needed (a target of 1 each): the formula reads exactly the
// triggers, KEDA's evaluator accepts it, and it gives max(waiting /
// (sendsPerWorker × drainSeconds), priority / (prioritySendsPerWorker ×
// priorityDrainSeconds)) workers. Each trigger's own targetValue (which
// KEDA requires, and the formula replaces) is its term's divisor.
func checkFormula(t *testing.T, c *chart.Chart, vals map[string]any, so *scaledObject) {
	t.Helper()
	mod := so.Spec.Advanced
	if mod == nil || mod.ScalingModifiers.Target != "1" || mod.ScalingModifiers.MetricType != "AverageValue" {
		t.Fatalf("scalingModifiers %+v: want a formula with target 1, AverageValue", mod)
	}
	formula := mod.ScalingModifiers.Formula
	used := map[string]bool{}
	for _, id := range regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`).FindAllString(formula, -1) {
		if id != "max" {
			used[id] = true
		}
	}
	if !mapsEqual(used, boolSet(kedaTriggers)) {
		t.Errorf("the formula %q reads %v, the triggers are %v", formula, keys(used), keys(boolSet(kedaTriggers)))
	}
	as := autoscalingValues(t, c, vals)
	per := map[string]float64{"waiting": as["sendsPerWorker"] * as["drainSeconds"], "priority": as["prioritySendsPerWorker"] * as["priorityDrainSeconds"]}
	for _, tr := range so.Spec.Triggers {
		if v, err := strconv.ParseFloat(tr.Metadata["targetValue"], 64); err != nil || v != per[tr.Name] {
			t.Errorf("trigger %s: targetValue %q, want one worker's share, %g", tr.Name, tr.Metadata["targetValue"], per[tr.Name])
		}
	}
	for _, m := range []map[string]float64{
		{"waiting": 0, "priority": 0}, {"waiting": 2.5 * per["waiting"], "priority": 0},
		{"waiting": 0, "priority": 3 * per["priority"]}, {"waiting": 7 * per["waiting"], "priority": 4 * per["priority"]},
	} {
		want := max(m["waiting"]/per["waiting"], m["priority"]/per["priority"])
		if got, err := kedaFormula(formula, m); err != nil || got != want {
			t.Errorf("the formula %q at %v gives %v (%v), want %v workers", formula, m, got, err, want)
		}
	}
}

// autoscalingValues are the chart's autoscaling values with vals over its
// defaults, as Helm merges them.
func autoscalingValues(t *testing.T, c *chart.Chart, vals map[string]any) map[string]float64 {
	t.Helper()
	merged, err := chartutil.CoalesceValues(c, vals)
	if err != nil {
		t.Fatal(err)
	}
	as, err := merged.Table("autoscaling")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, k := range []string{"sendsPerWorker", "drainSeconds", "prioritySendsPerWorker", "priorityDrainSeconds"} {
		switch v := as[k].(type) { // numbers, as Helm reads YAML
		case float64:
			out[k] = v
		case int64:
			out[k] = float64(v)
		case int:
			out[k] = float64(v)
		default:
			t.Fatalf("autoscaling.%s = %v (%T): not a number", k, as[k], as[k])
		}
	}
	return out
}

// kedaFormula evaluates a scalingModifiers formula as KEDA does: its
// webhook wraps it in float(), compiles it against the trigger names and
// runs it once with dummy values (validateScalingModifiersFormula); its
// scaler runs it with the triggers' metrics.
func kedaFormula(formula string, metrics map[string]float64) (float64, error) {
	if !strings.HasPrefix(formula, "float(") {
		formula = "float(" + formula + ")"
	}
	dummy := map[string]float64{}
	for name := range metrics {
		dummy[name] = -1
	}
	prog, err := expr.Compile(formula, expr.Env(dummy), expr.AsFloat64())
	if err != nil {
		return 0, err
	}
	if _, err := expr.Run(prog, dummy); err != nil {
		return 0, err
	}
	out, err := expr.Run(prog, metrics)
	if err != nil {
		return 0, err
	}
	f, ok := out.(float64)
	if !ok {
		return 0, errors.New("the formula's value is not a number")
	}
	return f, nil
}

// The evaluator above is KEDA 2.12's own, not a lenient stand-in: a
// trigger named "all" (expr's built-in all()) fails there, as it does in
// KEDA 2.12 and 2.13, which is why the chart's trigger is "waiting".
func TestKEDAFormulaEvaluatorRefusesBuiltins(t *testing.T) {
	t.Parallel()
	if _, err := kedaFormula("max(all / 3000, priority / 200)", map[string]float64{"all": 1, "priority": 1}); err == nil {
		t.Error("KEDA 2.12's evaluator accepted a trigger named after expr's all()")
	}
	if got, err := kedaFormula("max(waiting / 3000, priority / 200)", map[string]float64{"waiting": 9000, "priority": 100}); err != nil || got != 3 {
		t.Errorf("max(waiting / 3000, priority / 200) at 9000, 100: %v, %v; want 3", got, err)
	}
}

func boolSet(m map[string]string) map[string]bool {
	out := map[string]bool{}
	for k := range m {
		out[k] = true
	}
	return out
}

// noSend is the depth test's sender: its worker is not started, so nothing
// is ever sent.
type noSend struct{}

func (noSend) Send(context.Context, tasks.Notification) error {
	return errors.New("the queue-depth test sends nothing")
}

// KEDA reads, at each trigger's valueLocation of the URL the chart gives
// it, exactly the work waiting for a worker: every notification in a
// tenant's waiting room or a pending list of the workers' queues, and the
// priority lane's alone; nothing scheduled for later. The worker is built
// as `sluice worker` builds it (app), from the environment the
// chart gives the worker pods (cluster-tls.yaml: queue "notify", 16 shards
// per lane), on a real redis-server. It is not started: a running worker
// would dispatch and send the tasks while they are counted, and
// /queue-depth reads Redis alone, so its figures are a running worker's.
func TestKEDAReadsTheQueueDepth(t *testing.T) {
	t.Parallel()
	c := loadChart(t)
	vals := readValues(t, filepath.Join(chartDir, "ci", "cluster-tls.yaml"))
	r := render(t, c, vals)
	d := one[appsv1.Deployment](t, r, "sluice-worker")
	env := podEnv(t, d.Spec.Template.Spec, d.Spec.Template.Spec.Containers[0])
	cfg, err := worker.ParseConfig(env)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Start(t).Client(t)
	w, err := app.NewWorker(cfg, app.WorkerOptions{Redis: rdb, Logger: slog.New(slog.DiscardHandler),
		Senders: map[tasks.Channel]sender.Sender{tasks.Email: noSend{}, tasks.SMS: noSend{}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(w.HTTPHandler())
	t.Cleanup(srv.Close)
	keys, err := tasks.ParseKeyring(env["SLUICE_PAYLOAD_KEYS"])
	if err != nil {
		t.Fatal(err)
	}
	want := enqueueBacklog(t, rdb, cfg.Layout(), keys)
	got := map[string]float64{}
	for _, tr := range find[scaledObject](r)[0].Spec.Triggers {
		u, err := url.Parse(tr.Metadata["url"])
		if err != nil {
			t.Fatal(err)
		}
		body := get(t, srv.URL+u.RequestURI())
		v := gjson.GetBytes(body, tr.Metadata["valueLocation"])
		if v.Type != gjson.Number {
			t.Fatalf("trigger %s: %q of %s is %s, not a number", tr.Name, tr.Metadata["valueLocation"], bytes.TrimSpace(body), v.Type)
		}
		if got[tr.Name] = v.Num; v.Num != want[tr.Name] {
			t.Errorf("trigger %s reads %v at %q of %s, want %v", tr.Name, v.Num, tr.Metadata["valueLocation"], bytes.TrimSpace(body), want[tr.Name])
		}
	}
	if len(got) != len(want) {
		t.Errorf("the triggers read %v, want %v", got, want)
	}
	as := autoscalingValues(t, c, vals)
	formula := find[scaledObject](r)[0].Spec.Advanced.ScalingModifiers.Formula
	workers := max(want["waiting"]/(as["sendsPerWorker"]*as["drainSeconds"]), want["priority"]/(as["prioritySendsPerWorker"]*as["priorityDrainSeconds"]))
	if n, err := kedaFormula(formula, got); err != nil || n != workers {
		t.Errorf("KEDA computes %v workers (%v) from %v, want %v", n, err, got, workers)
	}
}

func get(t *testing.T, u string) []byte {
	t.Helper()
	res, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %v %s %s", u, err, res.Status, b)
	}
	return b
}

// enqueueBacklog puts into layout's queues what the workers have to do,
// and what they have not yet: through the producer Sluice's API uses,
// notifications of three tenants in the three lanes (into their waiting
// rooms); through an asynq.Client, one more (into its tenant's room, as
// Asynq's group); as a plain Asynq producer does, a task straight into
// the legacy queue's pending list and one into a priority shard's; and two
// scheduled for later, an OTP among them, which wait for their time, not
// for a worker. It checks Redis holds them so, and returns what each
// trigger must read.
func enqueueBacklog(t *testing.T, rdb *redis.Client, layout tasks.Layout, keys *tasks.Keyring) map[string]float64 {
	t.Helper()
	ctx := t.Context()
	email := func(tenant, category string) (tasks.Notification, asynq.Option) {
		n := tasks.NewEmail(tenant, "ann@example.com", "hi", "body")
		n.Category = category
		return n, asynq.Queue(layout.Route(tenant, tasks.DefaultLane(category), nil))
	}
	p := tasks.NewProducer(rdb, keys)
	for _, tc := range [][2]string{{"acme", "receipt"}, {"acme", "receipt"}, {"globex", "newsletter"}, {"initech", "otp"}} {
		n, q := email(tc[0], tc[1])
		if _, err := p.Enqueue(ctx, n, q); err != nil {
			t.Fatal(err)
		}
	}
	client := asynq.NewClientFromRedisClient(rdb)
	n, q := email("globex", "receipt")
	if _, err := tasks.Enqueue(ctx, client, keys, n, q); err != nil {
		t.Fatal(err)
	}
	prio := layout.LaneQueues(tasks.LanePriority)
	for _, queue := range []string{layout.Legacy(), prio[len(prio)-1]} {
		if _, err := client.Enqueue(asynq.NewTask(tasks.TypeEmail, []byte("{}")), asynq.Queue(queue)); err != nil {
			t.Fatal(err)
		}
	}
	for _, category := range []string{"otp", "receipt"} {
		n, q := email("acme", category)
		if _, err := tasks.Enqueue(ctx, client, keys, n, q, asynq.ProcessIn(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	held := map[string]int64{}
	for _, queue := range layout.Queues() {
		room := tasks.RoomOf(queue)
		w, err := tasks.ReadWaiting(ctx, rdb, queue)
		if err != nil {
			t.Fatal(err)
		}
		held["in rooms"] += w.Count
		held["pending"] += rdb.LLen(ctx, room.Pending).Val()
		held["scheduled"] += rdb.ZCard(ctx, room.Scheduled).Val()
	}
	if want := map[string]int64{"in rooms": 5, "pending": 2, "scheduled": 2}; !maps.Equal(held, want) {
		t.Fatalf("Redis holds %v, the test means %v: the test no longer makes the backlog it counts", held, want)
	}
	return map[string]float64{"waiting": 7, "priority": 2}
}
