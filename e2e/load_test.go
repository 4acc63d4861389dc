package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
)

// scrapeDecisions sums sluice_throttle_decisions_total from a worker's /metrics.
func scrapeDecisions(t *testing.T, addr string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, m := range regexp.MustCompile(`(?m)^sluice_throttle_decisions_total\{[^}]*\} (\S+)$`).FindAllStringSubmatch(string(body), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		sum += v
	}
	return sum
}

// A sustained, bounded run: 1,500 SMS over 20 s from 5 tenants to 100
// recipients, three workers. No rule is exceeded on the provider's timeline,
// every key expires, and the figures are reported.
func TestSustainedLoad(t *testing.T) {
	t.Parallel()
	const (
		total    = 1500
		duration = 20 * time.Second
	)
	e := newEnv(t, "sms:recipient=2/3s,sms:recipient=20/1h,sms:tenant=150/5s")
	var addrs []string
	for i := 0; i < 3; i++ {
		a := freeAddr(t)
		addrs = append(addrs, a)
		e.worker(fmt.Sprintf("w%d", i), map[string]string{"SLUICE_HTTP_ADDR": a})
	}
	for _, a := range addrs {
		waitStatus(t, a, 200, 10*time.Second)
	}
	ctx := context.Background()
	rcpts := recipients(100)
	tenantOf := func(i int) string { return fmt.Sprintf("tenant-%d", i%5) }
	ids := map[string]string{}
	tenantOfTo := map[string]string{}
	start := time.Now()
	tick := time.NewTicker(duration / total)
	for i := 0; i < total; i++ {
		<-tick.C // a steady arrival rate is the scenario, not synchronisation
		to := rcpts[(i*7)%len(rcpts)]
		tenantOfTo[to] = tenantOf((i * 7) % len(rcpts))
		n := tasks.NewSMS(tenantOfTo[to], to, "load "+strconv.Itoa(i))
		if _, err := tasks.Enqueue(ctx, e.client, e.keys, n); err != nil {
			t.Fatal(err)
		}
		ids[n.ID] = to
	}
	tick.Stop()
	ds := e.waitAllDelivered(ids, 3*time.Minute)
	elapsed := ds[len(ds)-1].At.Sub(start)

	r := audit(ds, 2, 3*time.Second, byRecipient)
	if r.violations != 0 || r.duplicates != 0 {
		t.Fatalf("recipient rule: %d violations (%s), %d duplicates", r.violations, r.worst, r.duplicates)
	}
	// The tenant rule on the provider's timeline.
	if tr := audit(ds, 150, 5*time.Second, func(d fakes.Delivery) string { return tenantOfTo[d.To] }); tr.violations != 0 {
		t.Fatalf("tenant rule: %s", tr.worst)
	}
	var calls float64
	for _, a := range addrs {
		calls += scrapeDecisions(t, a)
	}
	// How long past its recipient's window a throttled send arrived.
	byTo := map[string][]time.Time{}
	for _, d := range ds {
		byTo[d.To] = append(byTo[d.To], d.At)
	}
	var late []time.Duration
	for _, ts := range byTo {
		sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
		for i := 2; i < len(ts); i++ {
			late = append(late, max(0, ts[i].Sub(ts[i-2])-3*time.Second))
		}
	}
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	mem, _ := e.rdb.Info(ctx, "memory").Result()
	sluiceKeys := len(e.rdb.Keys(ctx, "sluice:*").Val())
	t.Logf("load: %d SMS, 5 tenants, 100 recipients, 3 workers: %.1f delivered/s over %v; %.2f limiter calls per delivered; "+
		"gap beyond the recipient window p50 %v p99 %v; %d sluice keys, redis used_memory %s",
		total, float64(total)/elapsed.Seconds(), elapsed.Round(time.Second), calls/total,
		late[len(late)/2].Round(time.Millisecond), late[len(late)*99/100].Round(time.Millisecond), sluiceKeys, field(mem, "used_memory_human"))
	if left := e.keysWithoutTTL(); len(left) != 0 {
		t.Fatalf("keys without TTL: %v", left[:min(5, len(left))])
	}
}
