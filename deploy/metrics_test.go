package deploy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sluicehq/sluice/api"
	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/worker"
)

// running is a worker and an API, in process, on a real redis-server.
type running struct {
	workerURL, apiURL string
	wreg, areg        *prometheus.Registry
}

// onlyRegistered are the metrics that need an event the exercise does not
// make (a send whose in-process wait woke late needs a starved CPU; a
// delivery outcome a signed provider callback; a hold a provider's
// throttling answer; a cap deferral a full in-flight cap): they are checked
// by their registration, not by a series on /metrics.
var onlyRegistered = []string{"sluice_late_wakes_total", "sluice_delivery_outcomes_total", "sluice_provider_holds_total", "sluice_cap_deferrals_total"}

const adminToken = "deploy-test-admin-token-0123456789abcdef"

func startSluice(t *testing.T) running {
	t.Helper()
	// A memory limit, as production Redis has: the memory ratio is reported for such nodes.
	srv := redistest.Start(t, "--maxmemory", "256mb", "--maxmemory-policy", "noeviction")
	env := map[string]string{
		"SLUICE_REDIS_URL":        srv.URL(),
		"SLUICE_SUBJECT_SECRET":   "deploy-test-subject-secret",
		"SLUICE_PAYLOAD_KEYS":     tasks.NewKeySpec("deploy"),
		"SLUICE_RULES":            "sms:recipient=1/1m,sms.otp:exempt,sms.otp:recipient=1/1s",
		"SLUICE_SHUTDOWN_TIMEOUT": "2s",
		"SLUICE_POLL_INTERVAL":    "50ms",
		"SLUICE_API_TOKEN_KEY":    "deploy-test-token-key-0123456789abcdef",
		"SLUICE_API_ADMIN_TOKEN":  adminToken,
	}
	wcfg, err := worker.ParseConfig(env)
	if err != nil {
		t.Fatal(err)
	}
	acfg, err := api.ParseConfig(env)
	if err != nil {
		t.Fatal(err)
	}
	listen := func() net.Listener {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// The registries the commands make themselves: Go and process collectors.
	registry := func() *prometheus.Registry {
		r := prometheus.NewRegistry()
		r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		return r
	}
	run := running{wreg: registry(), areg: registry()}
	log := slog.New(slog.DiscardHandler)
	wl, al := listen(), listen()
	run.workerURL, run.apiURL = "http://"+wl.Addr().String(), "http://"+al.Addr().String()
	w, err := app.NewWorker(wcfg, app.WorkerOptions{Registry: run.wreg, Listener: wl, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.NewAPI(acfg, env, app.APIOptions{Registry: run.areg, Listener: al, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- w.Run(ctx) }()
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
		}
	})

	// What makes the metrics appear: through the API, two SMS to one number
	// under 1/1m (one sent, one booked for later) and two OTPs under 1/1s
	// (the second waits in the worker for its slot); straight into Redis, a
	// payload that is not sealed (archived) and a notification in another
	// tenant's shard (moved, then sent).
	post := func(body string) {
		req, _ := http.NewRequest(http.MethodPost, run.apiURL+"/v1/notifications?tenant=acme", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminToken)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusAccepted {
			t.Fatalf("POST %s: %s %s", body, res.Status, b)
		}
	}
	waitReady(t, run.apiURL+"/readyz")
	post(`{"channel":"sms","to":"+14155550100","body":"one"}`)
	post(`{"channel":"sms","to":"+14155550100","body":"two"}`)
	post(`{"channel":"sms","to":"+14155550101","body":"111111","category":"otp"}`)
	post(`{"channel":"sms","to":"+14155550101","body":"222222","category":"otp"}`)
	client := asynq.NewClientFromRedisClient(srv.Client(t))
	layout := wcfg.Layout()
	if _, err := client.Enqueue(asynq.NewTask(tasks.TypeSMS, []byte(`{"not":"sealed"}`)), asynq.Queue(layout.Legacy())); err != nil {
		t.Fatal(err)
	}
	keys, err := tasks.ParseKeyring(env["SLUICE_PAYLOAD_KEYS"])
	if err != nil {
		t.Fatal(err)
	}
	wrong := layout.Queue(tasks.LaneStandard, (layout.Shard("acme", nil)+1)%tasks.DefaultShards)
	if _, err := tasks.Enqueue(ctx, client, keys, tasks.NewSMS("acme", "+14155550102", "moved"), asynq.Queue(wrong)); err != nil {
		t.Fatal(err)
	}
	// 4 sent (one, both OTPs, the moved one), 1 booked, 1 archived.
	until(t, 20*time.Second, func() bool {
		v := scrapeValues(t, run.workerURL)
		return v[`sluice_sends_total{channel="sms",result="sent"}`] >= 4 && v[`sluice_rescheduled_total{channel="sms"}`] >= 1 &&
			v[`sluice_inline_waits_total{channel="sms"}`] >= 1 && v[`sluice_moved_total{channel="sms"}`] >= 1
	})
	return run
}

func waitReady(t *testing.T, u string) {
	t.Helper()
	until(t, 10*time.Second, func() bool {
		res, err := http.Get(u)
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
}

// until polls cond every 50 ms until it holds, failing after d.
func until(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(d)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("not reached within %s", d)
		}
	}
}

func scrape(t *testing.T, u string) string {
	t.Helper()
	res, err := http.Get(u + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s/metrics: %v %s", u, err, res.Status)
	}
	return string(b)
}

// scrapeValues maps each sample line's series ("name{labels}") to its value.
func scrapeValues(t *testing.T, u string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(scrape(t, u)))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		var v float64
		if _, err := fmt.Sscan(line[i+1:], &v); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// families are the metric families a /metrics page has series of, by the
// names queries use: a histogram's name_bucket, name_sum and name_count too.
func families(t *testing.T, u string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(scrape(t, u)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			out[f[2]] = true
			if f[3] == "histogram" || f[3] == "summary" {
				out[f[2]+"_bucket"], out[f[2]+"_sum"], out[f[2]+"_count"] = true, true, true
			}
		}
	}
	return out
}

// registered reports whether reg has a collector of metric name, series or
// not: it offers a descriptor of that name with other labels, which the
// registry refuses exactly when the name is taken.
func registered(t *testing.T, reg *prometheus.Registry, name string) bool {
	t.Helper()
	p := probe{prometheus.NewDesc(name, "probe", []string{"sluice_deploy_probe"}, nil)}
	err := reg.Register(p)
	if err == nil {
		reg.Unregister(p)
		return false
	}
	if !strings.Contains(err.Error(), "previously registered descriptor with the same fully-qualified name") {
		t.Fatalf("probe %s: %v", name, err)
	}
	return true
}

type probe struct{ d *prometheus.Desc }

func (p probe) Describe(ch chan<- *prometheus.Desc) { ch <- p.d }
func (p probe) Collect(chan<- prometheus.Metric)    {}

// Every metric the alert rules and the dashboard read is one a running
// worker or API serves on /metrics; the few that need a rare event (see
// onlyRegistered) are at least registered by them.
func TestAlertsAndDashboardUseRealMetrics(t *testing.T) {
	t.Parallel()
	run := startSluice(t)
	served := families(t, run.workerURL)
	for k := range families(t, run.apiURL) {
		served[k] = true
	}
	if registered(t, run.wreg, "sluice_no_such_metric_total") {
		t.Fatal("the registration probe finds a metric nobody registered")
	}
	exprs := map[string][]string{"dashboard": dashboardQueries(t)}
	for _, g := range parseRules(t, readFile(t, AlertsFile)).Groups {
		for _, r := range g.Rules {
			exprs["alert "+r.Alert] = append(exprs["alert "+r.Alert], r.Expr)
		}
	}
	for where, list := range exprs {
		for _, expr := range list {
			for _, name := range metricNames(t, expr) {
				switch {
				case served[name]:
				case slices.Contains(onlyRegistered, name):
					if !registered(t, run.wreg, name) && !registered(t, run.areg, name) {
						t.Errorf("%s reads %s, which neither the worker nor the API registers", where, name)
					}
				default:
					t.Errorf("%s reads %s, which neither a running worker's nor the API's /metrics serves", where, name)
				}
			}
		}
	}
	for _, name := range onlyRegistered {
		// A late wake needs only a starved CPU, which a loaded test machine
		// (two shared cores, -race) gives now and then: served by chance, not
		// by the exercise.
		if served[name] && name != "sluice_late_wakes_total" {
			t.Errorf("%s is served now: drop it from onlyRegistered", name)
		}
	}
}
