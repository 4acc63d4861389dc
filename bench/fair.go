package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/tasks"
)

// Issue 34: fair share between tenants inside a lane. Every scenario runs
// the real binary (log sender, one worker) on a fresh redis-server; the
// "before" figures run the binary of the last commit before the waiting
// rooms (-fair-baseline), built from git in the same run, with the backlog
// enqueued as its producers did: straight into the pending lists.

var (
	fairParts    = flag.String("fair", "flood,bulk,tenants,drain,idle,saturated,cluster", "parts of the fair section to run")
	fairBaseline = flag.String("fair-baseline", "308dd63", "git ref of the binary the fair figures compare with (main before issue 34)")
)

func fairPart(p string) bool { return strings.Contains(","+*fairParts+",", ","+p+",") }

// plainTask is n as producers before the waiting rooms enqueued it: a
// task in its queue's pending list (no group).
func plainTask(n tasks.Notification, queue string) (*asynq.Task, []asynq.Option) {
	t, err := tasks.NewTask(n, keyring, asynq.Queue(queue))
	if err != nil {
		log.Fatal(err)
	}
	return asynq.NewTaskWithHeaders(t.Type(), t.Payload(), t.Headers()),
		[]asynq.Option{asynq.Queue(queue), asynq.TaskID(n.ID), asynq.MaxRetry(tasks.DefaultMaxRetry + 1), asynq.Timeout(tasks.DefaultTimeout), asynq.Retention(0)}
}

// enqueueRooms enqueues ns into their routes: into the tenants' rooms in
// batches (rooms), or one by one into the pending lists (the baseline's way).
func enqueueRooms(ctx context.Context, rdb redis.UniversalClient, ns []tasks.Notification, route func(tasks.Notification) string, rooms bool) {
	if rooms {
		p := tasks.NewProducer(rdb, keyring)
		for i := 0; i < len(ns); i += 500 {
			var items []tasks.Item
			for _, n := range ns[i:min(len(ns), i+500)] {
				items = append(items, tasks.Item{N: n, Opts: []asynq.Option{asynq.Queue(route(n))}})
			}
			res, err := p.EnqueueMany(ctx, items)
			if err != nil {
				log.Fatal(err)
			}
			for _, r := range res {
				if r.Err != nil {
					log.Fatal(r.Err)
				}
			}
		}
		return
	}
	client := asynq.NewClientFromRedisClient(rdb)
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < len(ns); i += 16 {
				t, opts := plainTask(ns[i], route(ns[i]))
				if _, err := client.EnqueueContext(ctx, t, opts...); err != nil {
					log.Fatal(err)
				}
			}
		})
	}
	wg.Wait()
}

// sameShard returns a tenant name other than of that lane routes to the
// same shard of the default layout.
func sameShard(of string, lane tasks.Lane, prefix string) string {
	want := tasks.DefaultLayout.Shard(of, nil)
	for i := 0; ; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		if tasks.DefaultLayout.Shard(name, nil) == want {
			return name
		}
	}
}

func route(lane tasks.Lane) func(tasks.Notification) string {
	return func(n tasks.Notification) string { return tasks.DefaultLayout.Route(n.Tenant, lane, nil) }
}

// fairFlood: acme's flood of standard SMS to 10,000 numbers under
// sms:recipient=1/1h (nearly all booked an hour ahead at their first
// check) queued before the worker starts; then a tenant on acme's shard
// enqueues one SMS every 200 ms for d. It returns the trickle's
// enqueue-to-send latencies.
func fairFlood(ctx context.Context, bin, dir string, flood int, d time.Duration, rooms bool) []time.Duration {
	srv, rdb := freshRedis(dir)
	defer srv.Stop()
	defer rdb.Close()
	other := sameShard("acme", tasks.LaneStandard, "other")
	ns := make([]tasks.Notification, flood)
	for i := range ns {
		ns[i] = tasks.NewSMS("acme", fmt.Sprintf("+1416%07d", i%10000), "flood")
	}
	enqueueRooms(ctx, rdb, ns, route(tasks.LaneStandard), rooms)
	env := baseEnv(srv.Addr, "sms:recipient=1/1h")
	env["SLUICE_SMS_SENDER"], env["SLUICE_EMAIL_SENDER"] = "log", "log"
	w := startBin(bin, env)
	defer w.stop()
	enq := sync.Map{}
	var lat []time.Duration
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for i, end := 0, time.Now().Add(d); time.Now().Before(end); i++ {
			<-tick.C
			// A recipient each: the flood's rule (1/1h per recipient) must
			// not be what holds the trickle back.
			n := tasks.NewSMS(other, fmt.Sprintf("+1417555%04d", i), "mine")
			enq.Store(n.ID, time.Now())
			enqueueRooms(ctx, rdb, []tasks.Notification{n}, route(tasks.LaneStandard), rooms)
		}
	}()
	want := int(d / (200 * time.Millisecond))
	timeout := time.After(d + 2*time.Minute)
	for len(lat) < want {
		select {
		case s := <-w.sends:
			if at, ok := enq.Load(s.n.ID); ok {
				lat = append(lat, s.at.Sub(at.(time.Time)))
			}
		case <-timeout:
			fmt.Printf("    %d of the trickle's %d not sent in time\n", want-len(lat), want)
			<-done
			return lat
		}
	}
	<-done
	return lat
}

// fairBulk: two tenants' campaigns in the bulk lane, big and small SMS,
// no binding rule, queued at once (big first) on one shard; how long the
// small one's last message takes from the lane's first send. small alone
// when big is 0. (Not from the worker's "tenant plans in force" line: its
// sends can start up to 0.7 s before it, which made the alone runs read
// 0.28-1.1 s for the same 1,000 sends.)
func fairBulk(ctx context.Context, bin, dir string, big, small int, rooms bool) time.Duration {
	srv, rdb := freshRedis(dir)
	defer srv.Stop()
	defer rdb.Close()
	shop := sameShard("news", tasks.LaneBulk, "shop")
	var ns []tasks.Notification
	isSmall := map[string]bool{}
	for i := range big {
		n := tasks.NewSMS("news", fmt.Sprintf("+1416%07d", i), "campaign")
		n.Category = "marketing"
		ns = append(ns, n)
	}
	for i := range small {
		n := tasks.NewSMS(shop, fmt.Sprintf("+1417%07d", i), "sale")
		n.Category = "marketing"
		isSmall[n.ID] = true
		ns = append(ns, n)
	}
	enqueueRooms(ctx, rdb, ns, route(tasks.LaneBulk), rooms)
	env := baseEnv(srv.Addr, "sms.marketing:bulk,sms:recipient=1000/1m,sms:tenant=1000000/1h")
	env["SLUICE_SMS_SENDER"] = "log"
	w := startBin(bin, env)
	defer w.stop()
	start, left, all := time.Now(), small, 0
	var first time.Time
	timeout := time.After(10 * time.Minute)
	for left > 0 {
		select {
		case s := <-w.sends:
			if all++; all == 1 {
				first = s.at
			}
			if isSmall[s.n.ID] {
				left--
				if left == 0 {
					fmt.Printf("    bulk (%d + %d, rooms %v): first send %v after the worker said it serves, the small campaign's last %v after the first send, %d sends in all\n",
						big, small, rooms, first.Sub(start).Round(time.Millisecond), s.at.Sub(first).Round(time.Millisecond), all)
					return s.at.Sub(first)
				}
			}
		case <-timeout:
			log.Fatalf("fair bulk: %d of the small campaign not sent", left)
		}
	}
	return 0
}

// fairTenants: 16 tenants with random backlogs (1 to 50,000, seeded) in
// the standard lane, queued at once, no binding rule; sends per tenant in
// the first d; weights from the plan rules.
func fairTenants(ctx context.Context, bin, dir string, d time.Duration, weights string, seed uint64) (counts, backlog map[string]int) {
	srv, rdb := freshRedis(dir)
	defer srv.Stop()
	defer rdb.Close()
	rng := rand.New(rand.NewPCG(seed, 34))
	backlog = map[string]int{}
	tenantOf := map[string]string{}
	var ns []tasks.Notification
	for t := range 16 {
		name := fmt.Sprintf("tenant-%02d", t)
		backlog[name] = 1 + rng.IntN(50_000)
		for i := range backlog[name] {
			n := tasks.NewSMS(name, fmt.Sprintf("+1%03d%07d", 420+t, i), "x")
			tenantOf[n.ID] = name
			ns = append(ns, n)
		}
	}
	rng.Shuffle(len(ns), func(i, j int) { ns[i], ns[j] = ns[j], ns[i] })
	enqueueRooms(ctx, rdb, ns, route(tasks.LaneStandard), true)
	env := baseEnv(srv.Addr, "sms:recipient=1000/1m,sms:tenant=1000000/1h"+weights)
	env["SLUICE_SMS_SENDER"] = "log"
	w := startBin(bin, env)
	defer w.stop()
	counts = map[string]int{}
	end := time.After(d)
	for {
		select {
		case s := <-w.sends:
			counts[tenantOf[s.n.ID]]++
		case <-end:
			return counts, backlog
		}
	}
}

// shares judges fairTenants' counts: over the tenants still backlogged at
// the end (sent fewer than their backlog), each one's count against the
// fair share (their mean, weight-scaled), the worst deviation and Jain's
// index of the weight-normalised counts.
func shares(counts, backlog map[string]int, weight map[string]int) (worst, jain float64, busy int) {
	var xs []float64
	for t, c := range counts {
		if c >= backlog[t] {
			continue // done early: it had less than its share to send
		}
		w := float64(max(1, weight[t]))
		xs = append(xs, float64(c)/w)
	}
	if len(xs) == 0 {
		return 0, 0, 0
	}
	var sum, sum2 float64
	for _, x := range xs {
		sum += x
		sum2 += x * x
	}
	mean := sum / float64(len(xs))
	for _, x := range xs {
		worst = max(worst, math.Abs(x-mean)/mean)
	}
	return worst, sum * sum / (float64(len(xs)) * sum2), len(xs)
}

// fairDrain: the flood of fairFlood without the trickle; how long the
// worker takes to check every notification (the rooms and pending lists
// empty), polled every 50 ms.
func fairDrain(ctx context.Context, bin, dir string, flood int, rooms bool) time.Duration {
	srv, rdb := freshRedis(dir)
	defer srv.Stop()
	defer rdb.Close()
	ns := make([]tasks.Notification, flood)
	for i := range ns {
		ns[i] = tasks.NewSMS("acme", fmt.Sprintf("+1416%07d", i%10000), "flood")
	}
	enqueueRooms(ctx, rdb, ns, route(tasks.LaneStandard), rooms)
	q := tasks.DefaultLayout.Route("acme", tasks.LaneStandard, nil)
	env := baseEnv(srv.Addr, "sms:recipient=1/1h")
	env["SLUICE_SMS_SENDER"] = "log"
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		log.Fatal(err)
	}
	w := startBin(bin, env)
	defer w.stop()
	start := time.Now()
	for {
		time.Sleep(50 * time.Millisecond) // polled: nothing signals "every task checked"
		waiting, err := tasks.ReadWaiting(ctx, rdb, q)
		if err != nil {
			log.Fatal(err)
		}
		pending := rdb.LLen(ctx, tasks.RoomOf(q).Pending).Val()
		active := rdb.LLen(ctx, keyspace.AsynqQueue(q).Active()).Val()
		if waiting.Count+pending+active == 0 {
			took := time.Since(start)
			if *cmdStats {
				printCommandStats(ctx, rdb, fmt.Sprintf("drain of %s (rooms %v)", filepath.Base(bin), rooms), flood)
			}
			return took
		}
		if time.Since(start) > 10*time.Minute {
			log.Fatalf("fair drain: %d waiting, %d pending after 10 minutes", waiting.Count, pending)
		}
	}
}

// fair runs issue 34's scenarios.
func fair(ctx context.Context) {
	dir, err := os.MkdirTemp("", "sluice-fair-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := buildBinary(dir)
	base := buildBaseline(dir, *fairBaseline)
	flood, trickle := 100_000, 30*time.Second
	if *quick {
		flood, trickle = 20_000, 10*time.Second
	}
	if fairPart("flood") {
		fairFloods(ctx, bin, base, dir, flood, trickle)
	}
	if fairPart("bulk") {
		fairBulks(ctx, bin, base, dir)
	}
	if fairPart("tenants") {
		fairShares(ctx, bin, dir)
	}
	if base == "" {
		return
	}
	if fairPart("drain") {
		fairDrains(ctx, bin, base, dir, flood)
	}
	if fairPart("idle") {
		fairIdle(ctx, bin, base, dir)
	}
	if fairPart("saturated") {
		fairSaturated(ctx, bin, base, dir)
	}
	if fairPart("cluster") {
		lanesCluster(ctx, bin, base, dir) // the lanes' rows: this binary, and "before lanes"
	}
}

func fairFloods(ctx context.Context, bin, base, dir string, flood int, d time.Duration) {
	lat := fairFlood(ctx, bin, dir, flood, d, true)
	fmt.Printf("    fair: %d of %d sends of the tenant sharing acme's shard: p50 %v p99 %v max %v\n", len(lat), int(d/(200*time.Millisecond)), pct(lat, .5), pct(lat, .99), pct(lat, 1))
	add(row{"fair", fmt.Sprintf("a tenant on the shard of %d waiting, enqueue-to-send p99 / max", flood),
		fmt.Sprintf("%v / %v", pct(lat, .99).Round(time.Millisecond), pct(lat, 1).Round(time.Millisecond)), "", "≤ 300 ms / ≤ 1 s",
		verdict(len(lat) == int(d/(200*time.Millisecond)) && pct(lat, .99) <= 300*time.Millisecond && pct(lat, 1) <= time.Second)})
	if base != "" {
		before := fairFlood(ctx, base, dir, flood, d, false)
		add(row{"fair", "before (one FIFO list per shard), p99 / max",
			fmt.Sprintf("%v / %v (%d of %d sent)", pct(before, .99).Round(time.Millisecond), pct(before, 1).Round(time.Millisecond), len(before), int(d/(200*time.Millisecond))),
			"", "(report)", ""})
	}
}

func fairBulks(ctx context.Context, bin, base, dir string) {
	big, small := 100_000, 1_000
	if *quick {
		big = 20_000
	}
	var alone, shared []float64
	for range 2 {
		alone = append(alone, float64(fairBulk(ctx, bin, dir, 0, small, true)))
		shared = append(shared, float64(fairBulk(ctx, bin, dir, big, small, true)))
	}
	ratio := median(shared) / median(alone)
	add(row{"fair", fmt.Sprintf("bulk lane: a %d-SMS campaign behind one of %d, its last send vs alone", small, big),
		fmt.Sprintf("%v vs %v", time.Duration(median(shared)).Round(time.Millisecond), time.Duration(median(alone)).Round(time.Millisecond)),
		f2(ratio), "≤ 2.2×", verdict(ratio <= 2.2)})
	if base != "" {
		before := fairBulk(ctx, base, dir, big, small, false)
		add(row{"fair", "before: the same, one FIFO list", before.Round(time.Millisecond).String(), f2(float64(before) / median(alone)), "(report)", ""})
	}
}

func fairShares(ctx context.Context, bin, dir string) {
	d := 30 * time.Second
	if *quick {
		d = 10 * time.Second
	}
	counts, backlog := fairTenants(ctx, bin, dir, d, "", 1)
	worst, jain, busy := shares(counts, backlog, nil)
	fmt.Printf("    16 tenants: backlogs %v, sent %v\n", backlog, counts)
	add(row{"fair", fmt.Sprintf("16 tenants, random backlogs, equal weights: first %v, worst share off / Jain's index (%d still waiting)", d, busy),
		fmt.Sprintf("%.1f %% / %.3f", 100*worst, jain), "", "≤ 20 % / ≥ 0.95", verdict(worst <= 0.2 && jain >= 0.95)})
	counts, backlog = fairTenants(ctx, bin, dir, d, ",tenant-03/weight=4", 1)
	worst, jain, busy = shares(counts, backlog, map[string]int{"tenant-03": 4})
	heavy := 0.0
	if counts["tenant-03"] < backlog["tenant-03"] {
		var others []float64
		for t, c := range counts {
			if t != "tenant-03" && c < backlog[t] {
				others = append(others, float64(c))
			}
		}
		heavy = float64(counts["tenant-03"]) / median(others)
	}
	add(row{"fair", fmt.Sprintf("the same, tenant-03 at weight 4: its share vs the others' median, worst off / Jain (%d waiting)", busy),
		fmt.Sprintf("%.2f× ; %.1f %% / %.3f", heavy, 100*worst, jain), "", "4× ±20 %", verdict(heavy >= 3.2 && heavy <= 4.8)})
}

func fairDrains(ctx context.Context, bin, base, dir string, flood int) {
	// Three series, interleaved: this binary with rooms, this binary with
	// the flood straight in the pending list (FIFO: what the rooms cost
	// alone, every other change since the baseline equal), and the
	// baseline's binary with its FIFO.
	// -rounds rounds (default 3), the order rotated each round: a drift in
	// the machine's load, or the first run's cold caches, falls on each alike.
	var a, c, b []float64
	runs := []func(){
		func() { a = append(a, float64(fairDrain(ctx, bin, dir, flood, true))) },
		func() { c = append(c, float64(fairDrain(ctx, bin, dir, flood, false))) },
		func() { b = append(b, float64(fairDrain(ctx, base, dir, flood, false))) },
	}
	for r := range max(2, *rounds) {
		for i := range runs {
			runs[(i+r)%len(runs)]()
		}
	}
	fmt.Printf("    drains: rooms %v, this binary FIFO %v, baseline FIFO %v\n", secs(a), secs(c), secs(b))
	ratio := median(a) / median(b)
	add(row{"fair", fmt.Sprintf("the flood of %d checked (booked an hour ahead): rooms vs before's FIFO", flood),
		fmt.Sprintf("%.1f s vs %.1f s", time.Duration(median(a)).Seconds(), time.Duration(median(b)).Seconds()), f2(ratio), "≤ 1.05×", verdict(ratio <= 1.05)})
	own := median(a) / median(c)
	add(row{"fair", "the same: rooms vs this binary's FIFO (the flood straight in the pending list)",
		fmt.Sprintf("%.1f s vs %.1f s", time.Duration(median(a)).Seconds(), time.Duration(median(c)).Seconds()), f2(own), "(report)", ""})
}

func secs(xs []float64) string {
	var out []string
	for _, x := range xs {
		out = append(out, fmt.Sprintf("%.1f s", time.Duration(x).Seconds()))
	}
	return strings.Join(out, ", ")
}

func fairIdle(ctx context.Context, bin, base, dir string) {
	idleVs(ctx, bin, base, dir, "fair", "idle worker, Redis commands/s, vs before", 1.15)
}

func fairSaturated(ctx context.Context, bin, base, dir string) {
	saturatedVs(ctx, bin, base, dir, "fair", ", vs before", false, 1.15)
}
