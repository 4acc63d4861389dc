package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
)

// Issue 19: lanes and shards in the queue. Every scenario runs the real
// binary (log sender, one worker) on a fresh redis-server; the "before"
// figures run the binary of the last commit before lanes (-baseline),
// built from git in the same run, or this binary with everything in the
// single legacy queue, which it serves as the old one did.

var lanesParts = flag.String("lanes", "flood,idle,saturated,cluster", "parts of the lanes section to run")

func lanesPart(p string) bool { return strings.Contains(","+*lanesParts+",", ","+p+",") }

var baselineRef = flag.String("baseline", "2f26761", "git ref of the binary the lanes figures compare with (main before issue 19)")

const lanesRules = "sms.otp:exempt,sms.otp:recipient=10/1h,sms.marketing:bulk,sms.marketing:recipient=1/1h,sms:recipient=5/1m"

// worker is a running `sluice worker` whose log is read for sends.
type binWorker struct {
	cmd   *exec.Cmd
	sends chan sent // by the log sender, with the worker's timestamps
	ids   sync.Map  // id → label, to resolve sends
	ready chan struct{}
}

// startBin runs bin as a worker with env, reading its JSON log.
func startBin(bin string, env map[string]string) *binWorker {
	env["SLUICE_LOG_FORMAT"] = "json"
	if env["SLUICE_HTTP_ADDR"] == "" {
		env["SLUICE_HTTP_ADDR"] = "off"
	}
	w := &binWorker{cmd: exec.Command(bin, "worker"), sends: make(chan sent, 1<<20), ready: make(chan struct{})}
	w.cmd.Env = cleanEnv(env)
	stderr, err := w.cmd.StderrPipe()
	if err != nil {
		log.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		log.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		once := false
		for sc.Scan() {
			var line struct {
				Time  time.Time `json:"time"`
				Msg   string    `json:"msg"`
				ID    string    `json:"id"`
				Level string    `json:"level"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				if !once {
					fmt.Fprintf(os.Stderr, "    worker: %s\n", sc.Text())
				}
				continue
			}
			switch {
			case !once && line.Msg == "tenant plans in force":
				once = true
				close(w.ready)
			case line.Msg == "sent (log sender)":
				w.sends <- sent{at: line.Time, n: tasks.Notification{ID: line.ID}}
			case line.Level == "ERROR":
				fmt.Fprintf(os.Stderr, "    worker: %s\n", sc.Text())
			}
		}
	}()
	select {
	case <-w.ready:
	case <-exited:
		log.Fatalf("lanes: %s exited before it started serving", bin)
	case <-time.After(30 * time.Second):
		log.Fatal("lanes: the worker did not start")
	}
	return w
}

// await returns once the worker has reported n sends, or stops the bench
// if it has not within timeout (what names the run).
func (w *binWorker) await(n int, timeout time.Duration, what string) {
	deadline := time.After(timeout)
	for got := 0; got < n; {
		select {
		case <-w.sends:
			got++
		case <-deadline:
			log.Fatalf("%s: %d of %d sent in %v", what, got, n, timeout)
		}
	}
}

func (w *binWorker) stop() {
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	_ = w.cmd.Wait()
}

// buildBaseline builds the binary of ref (the last commit before lanes)
// from git into dir; "" if it cannot.
func buildBaseline(dir, ref string) string {
	src := filepath.Join(dir, "baseline-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		log.Fatal(err)
	}
	archive := exec.Command("sh", "-c", "git -C .. archive "+ref+" | tar -x -C "+src)
	if out, err := archive.CombinedOutput(); err != nil {
		fmt.Printf("  (no baseline: git archive %s: %v %s)\n", ref, err, out)
		return ""
	}
	bin := filepath.Join(dir, "sluice-baseline")
	b := exec.Command("go", "build", "-o", bin, "./cmd/sluice")
	b.Dir = src
	if out, err := b.CombinedOutput(); err != nil {
		fmt.Printf("  (no baseline: build %s: %v %s)\n", ref, err, out)
		return ""
	}
	return bin
}

func baseEnv(addr, rules string) map[string]string {
	env := map[string]string{
		"SLUICE_REDIS_URL":      "redis://" + addr,
		"SLUICE_RULES":          rules,
		"SLUICE_SUBJECT_SECRET": secret,
		"SLUICE_PAYLOAD_KEYS":   keySpec,
	}
	applyWorkerEnv(env) // -worker-env: the binaries' settings too, for trying them
	return env
}

// enqueueParallel enqueues ns with 16 producers; queue "" routes by tasks'
// defaults (the lanes), else everything goes to that queue. plain enqueues
// as producers did before the waiting rooms: straight into the pending
// lists (for the binaries built before them).
func enqueueParallel(ctx context.Context, rdb redis.UniversalClient, ns []tasks.Notification, queue string, plain bool) {
	client := asynq.NewClientFromRedisClient(rdb)
	var wg sync.WaitGroup
	for p := 0; p < 16; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := p; i < len(ns); i += 16 {
				q := queue
				if q == "" {
					q = tasks.DefaultLayout.Route(ns[i].Tenant, tasks.DefaultLane(ns[i].Category), nil)
				}
				var err error
				if plain {
					t, opts := plainTask(ns[i], q)
					_, err = client.EnqueueContext(ctx, t, opts...)
				} else {
					_, err = tasks.Enqueue(ctx, client, keyring, ns[i], asynq.Queue(q))
				}
				if err != nil {
					log.Fatal(err)
				}
			}
		}()
	}
	wg.Wait()
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// lanesFlood: tenant A's bulk flood and tenant B's standard flood queued
// before the worker starts; then every 200 ms an OTP of A, B and C and a
// standard notification of C, until B's flood has drained.
func lanesFlood(ctx context.Context, bin, dir string, flood int, single bool) (otp, cstd []time.Duration, drain time.Duration) {
	srv, err := redistest.Launch(must(os.MkdirTemp(dir, "redis-")))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	defer rdb.Close()
	queue := ""
	if single {
		queue = tasks.DefaultQueue
	}
	b, c := "tenant-b", "tenant-c"
	for tasks.DefaultLayout.Shard(c, nil) == tasks.DefaultLayout.Shard(b, nil) {
		c += "x"
	}
	ns, isB := floodBacklog(flood, b)
	t0 := time.Now()
	enqueueParallel(ctx, rdb, ns, queue, single)
	fmt.Printf("    enqueued %d in %.1f s\n", len(ns), time.Since(t0).Seconds())
	env := baseEnv(srv.Addr, lanesRules)
	env["SLUICE_SMS_SENDER"], env["SLUICE_EMAIL_SENDER"] = "log", "log"
	w := startBin(bin, env)
	defer w.stop()
	start := time.Now()
	u := &urgentLog{kind: map[string]string{}, enq: map[string]time.Time{}}
	stop := make(chan struct{})
	genDone := make(chan struct{})
	go func() {
		defer close(genDone)
		u.trickle(ctx, rdb, b, c, single, stop)
	}()
	last := drainFlood(w, isB, flood, u)
	close(stop)
	<-genDone
	u.awaitRest(w)
	return u.otp, u.cstd, last.Sub(start)
}

// floodBacklog is lanesFlood's backlog: flood marketing SMS of tenant-a
// (the bulk lane) and flood standard SMS of tenant b, interleaved; isB
// holds b's ids.
func floodBacklog(flood int, b string) (ns []tasks.Notification, isB map[string]bool) {
	ns = make([]tasks.Notification, 0, 2*flood)
	isB = map[string]bool{}
	for i := 0; i < flood; i++ {
		m := tasks.NewSMS("tenant-a", fmt.Sprintf("+1416%07d", i%10000), "sale")
		m.Category = "marketing"
		s := tasks.NewSMS(b, fmt.Sprintf("+1417%07d", i), "receipt")
		isB[s.ID] = true
		ns = append(ns, m, s)
	}
	return ns, isB
}

// urgentLog is what lanesFlood trickles in during the floods: each
// notification's kind ("otp", or "c" for C's standard ones) and when it was
// enqueued, written by the trickle, read as sends arrive; and the
// latencies of those sent, by kind.
type urgentLog struct {
	mu   sync.Mutex
	kind map[string]string
	enq  map[string]time.Time

	otp, cstd []time.Duration // read and written by the reader of sends only
}

// trickle enqueues every 200 ms, until stop closes, an OTP of tenant-a, b
// and c and a standard notification of c, recording each before it is
// enqueued; single puts them in the legacy queue.
func (u *urgentLog) trickle(ctx context.Context, rdb *redis.Client, b, c string, single bool, stop <-chan struct{}) {
	client := asynq.NewClientFromRedisClient(rdb)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		var batch []tasks.Notification
		for _, tenant := range []string{"tenant-a", b, c} {
			o := tasks.NewSMS(tenant, fmt.Sprintf("+1418%07d", i), "code")
			o.Category = "otp"
			batch = append(batch, o)
		}
		batch = append(batch, tasks.NewSMS(c, fmt.Sprintf("+1419%07d", i), "shipped"))
		for j, n := range batch {
			u.mu.Lock()
			if j < 3 {
				u.kind[n.ID] = "otp"
			} else {
				u.kind[n.ID] = "c"
			}
			u.enq[n.ID] = time.Now()
			u.mu.Unlock()
			var opts []asynq.Option
			if single {
				opts = append(opts, asynq.Queue(tasks.DefaultQueue))
			}
			if _, err := tasks.Enqueue(ctx, client, keyring, n, opts...); err != nil {
				log.Fatal(err)
			}
		}
	}
}

// sent records the latency of s if it is an urgent notification.
func (u *urgentLog) sent(s sent) {
	u.mu.Lock()
	k, at := u.kind[s.n.ID], u.enq[s.n.ID]
	u.mu.Unlock()
	switch k {
	case "otp":
		u.otp = append(u.otp, s.at.Sub(at))
	case "c":
		u.cstd = append(u.cstd, s.at.Sub(at))
	}
}

// awaitRest reads sends until every urgent notification recorded has
// gone, for 5 s at most: those still on their way when B finished.
func (u *urgentLog) awaitRest(w *binWorker) {
	grace := time.After(5 * time.Second)
	u.mu.Lock()
	want := len(u.kind)
	u.mu.Unlock()
	for len(u.otp)+len(u.cstd) < want {
		select {
		case s := <-w.sends:
			u.sent(s)
		case <-grace:
			fmt.Printf("    %d urgent notifications not sent 5 s after B's flood\n", want-len(u.otp)-len(u.cstd))
			return
		}
	}
}

// drainFlood reads w's sends until the flood of b's (isB) has gone,
// recording the urgent ones in u, and returns when b's last went.
func drainFlood(w *binWorker, isB map[string]bool, flood int, u *urgentLog) time.Time {
	bLeft := flood
	var last time.Time
	timeout := time.After(10 * time.Minute)
	for bLeft > 0 {
		select {
		case s := <-w.sends:
			if isB[s.n.ID] {
				bLeft--
				last = s.at
				continue
			}
			u.sent(s)
		case <-timeout:
			log.Fatalf("lanes: B's flood not drained in 10 minutes (%d left)", bLeft)
		}
	}
	return last
}

// sharing: how many of 16 random tenants share tenant-b's shard at the
// default layout, and with tenant-b pinned to a shard of its own.
func sharing() (mean, p95 float64, pinned int) {
	rng := rand.New(rand.NewPCG(19, 19))
	l := tasks.DefaultLayout
	var counts []float64
	pinnedMax := 0
	for trial := 0; trial < 10000; trial++ {
		bShard := l.Shard("tenant-b", nil)
		pins := tasks.Pins{"tenant-b": bShard}
		n, m := 0, 0
		for i := 0; i < 16; i++ {
			name := fmt.Sprintf("t%x", rng.Uint64())
			if l.Shard(name, nil) == bShard {
				n++
			}
			if l.Shard(name, pins) == bShard {
				m++
			}
		}
		counts = append(counts, float64(n))
		pinnedMax = max(pinnedMax, m)
	}
	sort.Float64s(counts)
	sum := 0.0
	for _, c := range counts {
		sum += c
	}
	return sum / float64(len(counts)), counts[len(counts)*95/100], pinnedMax
}

// redisStats reads total commands, scripts and CPU from one node.
type redisStats struct {
	cmds, scripts float64
	cpu, sys      time.Duration
}

func readStats(ctx context.Context, rdb *redis.Client) redisStats {
	info, err := rdb.Info(ctx, "stats", "commandstats", "cpu").Result()
	if err != nil {
		log.Fatal(err)
	}
	var s redisStats
	s.cmds, _ = strconv.ParseFloat(field(info, "total_commands_processed"), 64)
	for _, name := range []string{"cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval"} {
		v := field(info, name)
		calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
		n, _ := strconv.ParseFloat(calls, 64)
		s.scripts += n
	}
	u, _ := strconv.ParseFloat(field(info, "used_cpu_user"), 64)
	sy, _ := strconv.ParseFloat(field(info, "used_cpu_sys"), 64)
	s.cpu, s.sys = time.Duration((u+sy)*1e9), time.Duration(sy*1e9)
	return s
}

// idle measures an idle worker's Redis load: commands/s (top-level, and
// with those run inside scripts), scripts/s, and Redis CPU per second.
func idle(ctx context.Context, bin, dir string, d time.Duration) (cmds, scripts float64, cpu time.Duration) {
	srv, err := redistest.Launch(must(os.MkdirTemp(dir, "redis-")))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	env := baseEnv(srv.Addr, "sms:recipient=1/1m")
	if x := os.Getenv("LANES_EXTRA"); x != "" && !strings.Contains(bin, "baseline") {
		k, v, _ := strings.Cut(x, "=")
		env[k] = v
	}
	w := startBin(bin, env)
	defer w.stop()
	time.Sleep(3 * time.Second) // past start-up (plans, first polls, subscriptions)
	a := readStats(ctx, rdb)
	time.Sleep(d)
	b := readStats(ctx, rdb)
	sec := d.Seconds()
	// INFO itself counts: two calls, taken out.
	return (b.cmds - a.cmds - 2) / sec, (b.scripts - a.scripts) / sec, time.Duration(float64(b.cpu-a.cpu) / sec)
}

// saturated: n SMS, every one admitted at once, queued before the worker
// starts; Redis CPU from the worker's start to the last send, per send.
func saturated(ctx context.Context, bin, dir string, n, tenants int, single, plain bool) time.Duration {
	srv, err := redistest.Launch(must(os.MkdirTemp(dir, "redis-")))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	defer rdb.Close()
	ns := make([]tasks.Notification, n)
	for i := range ns {
		ns[i] = tasks.NewSMS(fmt.Sprintf("tenant-%d", i%tenants), fmt.Sprintf("+1420%07d", i), "hi")
	}
	q := ""
	if single {
		q = tasks.DefaultQueue
	}
	enqueueParallel(ctx, rdb, ns, q, plain)
	env := baseEnv(srv.Addr, "sms:recipient=5/1m,sms:tenant=1000000/1h")
	env["SLUICE_SMS_SENDER"] = "log"
	if x := os.Getenv("LANES_EXTRA"); x != "" && !single {
		k, v, _ := strings.Cut(x, "=")
		env[k] = v
	}
	c0 := readStats(ctx, rdb)
	w := startBin(bin, env)
	defer w.stop()
	w.await(n, 5*time.Minute, "saturated")
	c1 := readStats(ctx, rdb)
	fmt.Printf("    saturated (%s, %d tenants): %.1f commands and %.2f scripts per task, %v Redis CPU per task\n", filepath.Base(bin), tenants,
		(c1.cmds-c0.cmds)/float64(n), (c1.scripts-c0.scripts)/float64(n), (c1.cpu-c0.cpu)/time.Duration(n))
	return (c1.cpu - c0.cpu) / time.Duration(n)
}

func must[T any](v T, err error) T {
	if err != nil {
		log.Fatal(err)
	}
	return v
}

// lanes runs issue 19's scenarios.
func lanes(ctx context.Context) {
	dir, err := os.MkdirTemp("", "sluice-lanes-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := buildBinary(dir)
	base := buildBaseline(dir, *baselineRef)

	flood := 100_000
	if *quick {
		flood = 20_000
	}
	if lanesPart("flood") {
		lanesFloods(ctx, bin, dir, flood)
	}
	if base == "" {
		return
	}
	if lanesPart("idle") {
		lanesIdle(ctx, bin, base, dir)
	}
	if lanesPart("saturated") {
		lanesSaturated(ctx, bin, base, dir)
	}
	if lanesPart("cluster") {
		lanesCluster(ctx, bin, base, dir)
	}
}

func lanesFloods(ctx context.Context, bin, dir string, flood int) {
	otp, cstd, drain := lanesFlood(ctx, bin, dir, flood, false)
	fmt.Printf("    lanes: B's %d drained in %.1f s; %d OTPs p50 %v p99 %v max %v; %d of C's p50 %v p99 %v max %v\n", flood, drain.Seconds(),
		len(otp), pct(otp, .5), pct(otp, .99), pct(otp, 1), len(cstd), pct(cstd, .5), pct(cstd, .99), pct(cstd, 1))
	add(row{"lanes", fmt.Sprintf("OTP enqueue-to-send behind %d bulk (A) + %d standard (B), p99 / max", flood, flood),
		fmt.Sprintf("%v / %v", pct(otp, .99).Round(time.Millisecond), pct(otp, 1).Round(time.Millisecond)), "", "≤ 300 ms / ≤ 500 ms",
		verdict(pct(otp, .99) <= 300*time.Millisecond && pct(otp, 1) <= 500*time.Millisecond)})
	add(row{"lanes", "tenant C's standard (another shard) while B drains, p99", pct(cstd, .99).Round(time.Millisecond).String(), "", "≤ 1 s",
		verdict(pct(cstd, .99) <= time.Second)})
	before := flood / 2
	if *quick {
		before = flood / 4
	}
	otp1, cstd1, _ := lanesFlood(ctx, bin, dir, before, true)
	add(row{"lanes", fmt.Sprintf("before lanes: everything in one FIFO queue, %d + %d, OTP p99 / max", before, before),
		fmt.Sprintf("%v / %v (C's p99 %v)", pct(otp1, .99).Round(time.Millisecond), pct(otp1, 1).Round(time.Millisecond), pct(cstd1, .99).Round(time.Millisecond)), "", "(report)", ""})

	mean, p95, pinned := sharing()
	add(row{"lanes", fmt.Sprintf("of 16 random tenants, sharing B's shard (%d shards per lane)", tasks.DefaultShards),
		fmt.Sprintf("mean %.2f, p95 %.0f; with B pinned (shard=K): %d", mean, p95, pinned), "", "(report)", ""})
}

func lanesIdle(ctx context.Context, bin, base, dir string) {
	idleVs(ctx, bin, base, dir, "lanes", fmt.Sprintf("idle worker, Redis commands/s (%d queues vs 1)", len(tasks.DefaultLayout.Queues())), 1.2)
}

// idleVs adds the row comparing an idle worker of bin with one of base:
// Redis commands/s (two rounds each, interleaved), target at most max×.
func idleVs(ctx context.Context, bin, base, dir, section, name string, most float64) {
	d := 20 * time.Second
	if *quick {
		d = 8 * time.Second
	}
	var nc, nx, bc, bx []float64
	var ncpu, bcpu []float64
	for r := 0; r < 2; r++ {
		c, x, u := idle(ctx, bin, dir, d)
		nc, nx, ncpu = append(nc, c), append(nx, x), append(ncpu, float64(u))
		c, x, u = idle(ctx, base, dir, d)
		bc, bx, bcpu = append(bc, c), append(bx, x), append(bcpu, float64(u))
	}
	fmt.Printf("    idle: %.1f commands/s (%.1f scripts/s, %v CPU/s); before %.1f (%.1f, %v)\n", median(nc), median(nx), time.Duration(median(ncpu)),
		median(bc), median(bx), time.Duration(median(bcpu)))
	ratio := median(nc) / median(bc)
	add(row{section, name,
		fmt.Sprintf("%.1f vs %.1f (CPU %v vs %v per s)", median(nc), median(bc), time.Duration(median(ncpu)).Round(time.Microsecond), time.Duration(median(bcpu)).Round(time.Microsecond)),
		f2(ratio), fmt.Sprintf("≤ %s×", strconv.FormatFloat(most, 'g', -1, 64)), verdict(ratio <= most)})
}

func lanesSaturated(ctx context.Context, bin, base, dir string) {
	saturatedVs(ctx, bin, base, dir, "lanes", "", true, 1.2)
}

// saturatedVs adds the rows comparing the Redis CPU per delivered task of
// a saturated worker of bin with one of base (fed plain tasks; in the
// legacy queue when single), for 1 and 8 tenants, target at most most×.
func saturatedVs(ctx context.Context, bin, base, dir, section, suffix string, single bool, most float64) {
	n := 20_000
	if *quick {
		n = 5_000
	}
	for _, tenants := range []int{1, 8} {
		var a, b []float64
		for r := 0; r < 3; r++ {
			a = append(a, float64(saturated(ctx, bin, dir, n, tenants, false, false)))
			b = append(b, float64(saturated(ctx, base, dir, n, tenants, single, true)))
		}
		ratio := median(a) / median(b)
		add(row{section, fmt.Sprintf("saturated worker, Redis CPU per delivered task, %d tenant(s)%s", tenants, suffix),
			fmt.Sprintf("%v vs %v", time.Duration(median(a)).Round(100*time.Nanosecond), time.Duration(median(b)).Round(100*time.Nanosecond)),
			f2(ratio), fmt.Sprintf("≤ %s×", strconv.FormatFloat(most, 'g', -1, 64)), verdict(ratio <= most)})
	}
}

// launchCluster starts a 3-master Redis Cluster (no replicas) on loopback.
func launchCluster(dir string) ([]*redistest.Server, []string) {
	var nodes []*redistest.Server
	var addrs []string
	for i := 0; i < 3; i++ {
		s, err := redistest.Launch(must(os.MkdirTemp(dir, "node-")), "--cluster-enabled", "yes", "--cluster-node-timeout", "2000", "--cluster-config-file", "nodes.conf")
		if err != nil {
			log.Fatal(err)
		}
		nodes, addrs = append(nodes, s), append(addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		log.Fatalf("redis-cli --cluster create: %v %s", err, out)
	}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.Close()
	}
	return nodes, addrs
}

// lanesCluster: a 3-master Cluster, 12 tenants, every SMS admitted at once;
// the share of Redis CPU (queue and limiter) each master spent, for this
// binary and the one before lanes (one queue, so one master runs every
// Asynq script).
func lanesCluster(ctx context.Context, bin, base, dir string) {
	n := 24_000
	if *quick {
		n = 6_000
	}
	for _, run := range []struct {
		name, bin string
		single    bool
	}{{"lanes", bin, false}, {"before lanes", base, true}} {
		nodes, addrs := launchCluster(dir)
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64})
		ns := make([]tasks.Notification, n)
		for i := range ns {
			ns[i] = tasks.NewSMS(fmt.Sprintf("tenant-%02d", i%12), fmt.Sprintf("+1421%07d", i), "hi")
		}
		q := ""
		if run.single {
			q = tasks.DefaultQueue
		}
		enqueueParallel(ctx, cc, ns, q, run.single)
		clients := make([]*redis.Client, len(addrs))
		before := make([]redisStats, len(addrs))
		for i, a := range addrs {
			clients[i] = redis.NewClient(&redis.Options{Addr: a})
			before[i] = readStats(ctx, clients[i])
		}
		env := baseEnv(addrs[0], "sms:recipient=5/1m,sms:tenant=1000000/1h")
		env["SLUICE_REDIS_CLUSTER_ADDRS"] = strings.Join(addrs, ",")
		env["SLUICE_SMS_SENDER"] = "log"
		if x := os.Getenv("LANES_EXTRA"); x != "" && !run.single {
			k, v, _ := strings.Cut(x, "=")
			env[k] = v
		}
		w := startBin(run.bin, env)
		got := 0
		for got < n {
			select {
			case <-w.sends:
				got++
			case <-time.After(5 * time.Minute):
				log.Fatalf("cluster: %d of %d sent", got, n)
			}
		}
		w.stop()
		var cpus []time.Duration
		var total time.Duration
		var cmds, scripts float64
		var sys time.Duration
		for i, c := range clients {
			after := readStats(ctx, c)
			d := after.cpu - before[i].cpu
			cpus, total, sys = append(cpus, d), total+d, sys+after.sys-before[i].sys
			cmds, scripts = cmds+after.cmds-before[i].cmds, scripts+after.scripts-before[i].scripts
			c.Close()
		}
		fmt.Printf("    cluster (%s): %.1f commands and %.2f scripts per task, %v Redis CPU per task (%v of it in the kernel)\n", run.name,
			cmds/float64(n), scripts/float64(n), total/time.Duration(n), sys/time.Duration(n))
		cc.Close()
		for _, s := range nodes {
			s.Stop()
		}
		var shares []string
		worst := 0.0
		for _, d := range cpus {
			sh := float64(d) / float64(total)
			worst = max(worst, sh)
			shares = append(shares, fmt.Sprintf("%.0f %%", 100*sh))
		}
		target, v := "(report)", ""
		if !run.single {
			target, v = "≤ 45 % per master", verdict(worst <= 0.45)
		}
		add(row{"lanes", fmt.Sprintf("3-master Cluster, 12 tenants, %s: Redis CPU per master", run.name),
			fmt.Sprintf("%s (%v per task)", strings.Join(shares, ", "), (total / time.Duration(n)).Round(100*time.Nanosecond)), "", target, v})
	}
}
