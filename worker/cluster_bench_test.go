package worker_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/worker"
)

// BenchmarkClusterSpread measures how a Cluster's masters share the Redis
// work of a drain (issue 52): each op enqueues 20,000 SMS to 5,000
// recipients (4 each) through the producers' path, two in-process workers
// send them to a loopback SMS API, and every master's INFO commandstats
// and cpu are read before and after. One tenant or eight, on 1, 3 or 6
// masters; admitted traffic (the rules far from full: every send admitted
// at once) or throttled (1 per recipient per 2 s: one of each recipient's
// four admitted, three booked for their slots and sent at them), or
// digested (SMS alerts, 1 per recipient per 10 s, folded into one message
// per slot: each recipient's first sent, the second booked past the
// in-process wait and opening a digest the later ones join; per
// notification, whether sent or carried).
//
// Each master's commands and CPU while the workers idle (3 s, measured
// first) are taken off at their rate. It reports, per send: the commands
// (commandstats calls: a script's own calls included) and the microseconds
// of CPU (the main thread's, INFO cpu) over all masters, the busiest
// master's share of both, and the commands of the master holding the
// global {hold} keys; and "sends/s/busiest-core": 1 s over the busiest
// master's CPU per send, the most sends a second that master's one core
// admits at this spread (the Cluster's capacity when Redis is the
// bottleneck: on this 2-core machine the workers are, so throughput itself
// is not compared).
//
//	go test ./worker -run XXX -bench ClusterSpread -benchtime 1x
//	BENCH_SEND_SLACK=1s go test ./worker -run XXX -bench ClusterSpread -benchtime 1x
func BenchmarkClusterSpread(b *testing.B) {
	for _, traffic := range []string{"admitted", "throttled", "digested"} {
		for _, masters := range []int{1, 3, 6} {
			for _, tenants := range []int{1, 8} {
				b.Run(fmt.Sprintf("%s/masters=%d/tenants=%d", traffic, masters, tenants), func(b *testing.B) {
					benchClusterSpread(b, traffic, masters, tenants)
				})
			}
		}
	}
}

// spreadRules are each traffic's rules.
var spreadRules = map[string]string{
	"admitted":  "sms:recipient=100/1m,sms:tenant=1000000/1h",
	"throttled": "sms:recipient=1/2s,sms:tenant=1000000/1h",
	"digested":  "sms:recipient=1/10s,sms:tenant=1000000/1h,sms.alerts:digest=max:50",
}

const spreadSends, spreadRecipients = 20000, 5000

func benchClusterSpread(b *testing.B, traffic string, masters, tenants int) {
	cl, cc := redistest.NewCluster(b, masters, 0)
	sms := fakes.NewSMSAPI(b)
	cfg, err := worker.ParseConfig(map[string]string{
		"SLUICE_REDIS_URL":           "redis://" + cl.Addrs[0],
		"SLUICE_REDIS_CLUSTER_ADDRS": strings.Join(cl.Addrs, ","),
		"SLUICE_RULES":               spreadRules[traffic],
		"SLUICE_SUBJECT_SECRET":      "test-secret-0123456789",
		"SLUICE_PAYLOAD_KEYS":        testKeys,
		"SLUICE_HTTP_ADDR":           "off",
		"SLUICE_LOG_LEVEL":           "error",
		"SLUICE_SMS_SENDER":          "http",
		"SLUICE_SMS_BASE_URL":        sms.URL,
		"SLUICE_SMS_ACCOUNT_SID":     sms.AccountSID,
		"SLUICE_SMS_AUTH_TOKEN":      sms.AuthToken,
		"SLUICE_SMS_FROM":            "+15005550006",
		// The product's default unless BENCH_SEND_SLACK says otherwise: on
		// this 2-core machine the Redis processes, workers, producers and
		// SMS API crowd the cores, and admitted sends that wait over half
		// the slack for a request slot are checked again (late wakes).
		"SLUICE_SEND_SLACK": cmp.Or(os.Getenv("BENCH_SEND_SLACK"), "100ms"),
	})
	if err != nil {
		b.Fatal(err)
	}
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	for i, reg := range regs {
		w, err := app.NewWorker(cfg, app.WorkerOptions{Registry: reg, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		sluicetest.Background(b, "worker.Run "+strconv.Itoa(i), w.Run)
	}
	keys := mustKeys(b)
	client := asynq.NewClientFromRedisClient(cc)
	b.Cleanup(func() { client.Close() })
	ctx := context.Background()
	hold, err := cc.MasterForKey(ctx, "{hold}")
	if err != nil {
		b.Fatal(err)
	}
	// Each master's CPU while the workers idle, per second: taken off the
	// drain's, so what is left is what the sends cost.
	idleFrom, idleAt := masterStats(b, cc), time.Now()
	time.Sleep(3 * time.Second)
	idle := idleFrom.until(masterStats(b, cc)).per(time.Since(idleAt))
	var total spreadStats
	sent := 0
	b.ResetTimer()
	for op := range b.N {
		before, at := masterStats(b, cc), time.Now()
		enqueueSpread(b, ctx, client, keys, tenants, op, traffic == "digested")
		sent += spreadSends
		waitSent(b, sms, regs, sent)
		total.add(before.until(masterStats(b, cc)).less(idle, time.Since(at)))
	}
	b.StopTimer()
	total.report(b, float64(b.N*spreadSends), hold.Options().Addr)
	b.Logf("%d messages reached the SMS API for %d notifications", sms.Count(), b.N*spreadSends)
	b.Logf("worker counters (both workers): %s", counters(b, regs))
}

// counters sums the workers' counters that say how sends went: decisions
// by status, late and held wakes, moves, retries.
func counters(b *testing.B, regs []*prometheus.Registry) string {
	sums := map[string]float64{}
	for _, reg := range regs {
		mfs, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, mf := range mfs {
			name := mf.GetName()
			if !strings.HasSuffix(name, "_total") {
				continue
			}
			for _, m := range mf.GetMetric() {
				label := name
				for _, lp := range m.GetLabel() {
					if lp.GetName() == "status" || lp.GetName() == "outcome" || lp.GetName() == "reason" {
						label += "{" + lp.GetValue() + "}"
					}
				}
				sums[label] += m.GetCounter().GetValue()
			}
		}
	}
	var out []string
	for k, v := range sums {
		if v > 0 {
			out = append(out, fmt.Sprintf("%s=%.0f", strings.TrimPrefix(k, "sluice_"), v))
		}
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// waitSent waits until n notifications are accounted for: sent to the SMS
// API, or carried there by a digest (sluice_digested_total{result=
// "joined"}). It counts (a copy of 20,000 deliveries at each arrival would
// make the harness the bottleneck).
func waitSent(b *testing.B, sms *fakes.SMSAPI, regs []*prometheus.Registry, n int) {
	deadline := time.Now().Add(5 * time.Minute)
	tick := time.NewTicker(10 * time.Millisecond) // a digest's joins do not signal the SMS API
	defer tick.Stop()
	for sms.Count()+int(joined(b, regs)) < n {
		if time.Now().After(deadline) {
			b.Fatalf("%d sent and %.0f joined of %d after 5 min", sms.Count(), joined(b, regs), n)
		}
		select {
		case <-sms.Changed():
		case <-tick.C:
		}
	}
}

// joined is the items the workers folded into digests.
func joined(b *testing.B, regs []*prometheus.Registry) float64 {
	var sum float64
	for _, reg := range regs {
		sum += metric(b, reg, "sluice_digested_total", map[string]string{"result": "joined"})
	}
	return sum
}

// enqueueSpread enqueues one op's sends from 8 goroutines, as producers do.
func enqueueSpread(b *testing.B, ctx context.Context, client *asynq.Client, keys *tasks.Keyring, tenants, op int, digested bool) {
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			for i := g; i < spreadSends; i += 8 {
				to := fmt.Sprintf("+1415%07d", i%spreadRecipients)
				n := tasks.NewSMS("t"+strconv.Itoa(i%tenants), to, "spread "+strconv.Itoa(op))
				if digested {
					n.Category = "alerts"
				}
				if _, err := tasks.Enqueue(ctx, client, keys, n); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// spreadStats are each master's commands and main-thread CPU (µs), by address.
type spreadStats struct {
	calls, usec map[string]float64
	byCmd       map[string]float64 // commands over all masters, by name
}

func (s *spreadStats) add(o spreadStats) {
	if s.calls == nil {
		s.calls, s.usec = map[string]float64{}, map[string]float64{}
	}
	for a, v := range o.calls {
		s.calls[a] += v
		s.usec[a] += o.usec[a]
	}
	if s.byCmd == nil {
		s.byCmd = map[string]float64{}
	}
	for c, v := range o.byCmd {
		s.byCmd[c] += v
	}
}

func (s spreadStats) until(after spreadStats) spreadStats {
	d := spreadStats{calls: map[string]float64{}, usec: map[string]float64{}}
	for a := range after.calls {
		d.calls[a], d.usec[a] = after.calls[a]-s.calls[a], after.usec[a]-s.usec[a]
	}
	d.byCmd = map[string]float64{}
	for c, v := range after.byCmd {
		d.byCmd[c] = v - s.byCmd[c]
	}
	return d
}

// per is s per second over d.
func (s spreadStats) per(d time.Duration) spreadStats {
	p := spreadStats{calls: map[string]float64{}, usec: map[string]float64{}}
	for a := range s.calls {
		p.calls[a], p.usec[a] = s.calls[a]/d.Seconds(), s.usec[a]/d.Seconds()
	}
	return p
}

// less is s without d of the idle rates.
func (s spreadStats) less(idle spreadStats, d time.Duration) spreadStats {
	for a := range s.calls {
		s.calls[a] = max(0, s.calls[a]-idle.calls[a]*d.Seconds())
		s.usec[a] = max(0, s.usec[a]-idle.usec[a]*d.Seconds())
	}
	return s
}

func (s spreadStats) report(b *testing.B, sends float64, holdAddr string) {
	var calls, usec, topCalls, topUsec float64
	var shares []string
	for a, v := range s.usec {
		calls, usec = calls+s.calls[a], usec+v
		topCalls, topUsec = max(topCalls, s.calls[a]), max(topUsec, v)
	}
	for _, v := range s.usec {
		shares = append(shares, strconv.Itoa(int(100*v/usec+0.5)))
	}
	sort.Sort(sort.Reverse(sort.StringSlice(shares)))
	b.ReportMetric(calls/sends, "cmds/send")
	b.ReportMetric(usec/sends, "µs/send")
	b.ReportMetric(100*topUsec/usec, "busiest-%time")
	b.ReportMetric(100*topCalls/calls, "busiest-%cmds")
	b.ReportMetric(s.calls[holdAddr]/sends, "hold-master-cmds/send")
	b.ReportMetric(sends/(topUsec/1e6), "sends/s/busiest-core")
	var cmds []string
	for c := range s.byCmd {
		cmds = append(cmds, c)
	}
	sort.Slice(cmds, func(i, j int) bool { return s.byCmd[cmds[i]] > s.byCmd[cmds[j]] })
	var top []string
	for _, c := range cmds[:min(12, len(cmds))] {
		top = append(top, fmt.Sprintf("%s %.2f", c, s.byCmd[c]/sends))
	}
	b.Logf("%.0f sends; CPU by master (%%): %s; commands a send (idle not taken off): %s", sends, strings.Join(shares, " "), strings.Join(top, ", "))
}

// masterStats reads every master's commands and main-thread CPU.
func masterStats(b *testing.B, cc *redis.ClusterClient) spreadStats {
	s := spreadStats{calls: map[string]float64{}, usec: map[string]float64{}, byCmd: map[string]float64{}}
	var mu sync.Mutex
	err := cc.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		info, err := m.Info(ctx, "commandstats", "cpu").Result()
		if err != nil {
			return err
		}
		var calls, usec float64
		byCmd := map[string]float64{}
		for _, line := range strings.Split(info, "\n") {
			name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
			switch {
			case !ok:
			case name == "used_cpu_sys_main_thread" || name == "used_cpu_user_main_thread":
				x, _ := strconv.ParseFloat(fields, 64)
				usec += 1e6 * x
			case strings.HasPrefix(name, "cmdstat_"):
				for _, f := range strings.Split(fields, ",") {
					if k, v, _ := strings.Cut(f, "="); k == "calls" {
						x, _ := strconv.ParseFloat(v, 64)
						calls += x
						byCmd[strings.TrimPrefix(name, "cmdstat_")] += x
					}
				}
			}
		}
		mu.Lock()
		defer mu.Unlock()
		s.calls[m.Options().Addr], s.usec[m.Options().Addr] = calls, usec
		for c, v := range byCmd {
			s.byCmd[c] += v
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return s
}
