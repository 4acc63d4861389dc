// Command bench measures Sluice against its peers on this machine, in one
// run, and prints medians and ratios (absolute figures drift on shared
// machines; ratios measured side by side do not). It lives in its own module
// so the product's go.mod does not depend on the peers. Run it through
// ../scripts/bench.sh.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/testkit/redistest"
)

var (
	quick       = flag.Bool("quick", false, "a few-minute subset: short micro runs, the short backlog only")
	rounds      = flag.Int("rounds", 3, "interleaved rounds (A B A B …) per micro scenario")
	dur         = flag.Duration("dur", 2*time.Second, "length of one micro run")
	docs        = flag.String("docs", "../docs", "where figures are written")
	cpuProf     = flag.String("cpuprofile", "", "write the harness process's CPU profile here (workers and peers run in it)")
	workerEnv   = flag.String("worker-env", "", "comma-separated KEY=VALUE settings applied to every in-process worker's environment and to the binaries' (to try settings; a baseline binary refuses one it does not know: skip it with -fair-baseline= or -baseline=)")
	workerPeers = flag.String("worker-peers", "", "worker section: run only these peers (comma-separated: sluice, asynq, asynq+redis_rate); the ratio rows need all three")
	withFloors  = flag.Bool("floors", false, "worker section: also run issue 38's floors (Asynq with Sluice's check alone, with its record, the full check, the poll gate)")
	cmdStats    = flag.Bool("commandstats", false, "print the worker runs' Redis commands per task, by command (INFO commandstats)")
	monitorOn   = flag.Bool("monitor", false, "count the commands clients send per task in the worker runs (MONITOR through redis-cli; it slows Redis, so the runs' rates and CPU are not comparable)")
	only        = flag.String("only", "", "comma-separated sections to run: check,throttled,booked,depth,tune,calls,worker,backlog,multi,coincide,issue15,lanes,enqueue,digest,fair,memory,counters,replicas,figures")
)

type row struct {
	section, name, value, ratio, target, verdict string
}

var table []row

func add(r row) {
	table = append(table, r)
	fmt.Printf("  %-44s %14s  %8s  %s %s\n", r.name, r.value, r.ratio, r.target, r.verdict)
}

func want(section string) bool {
	if *only == "" {
		return true
	}
	for _, s := range strings.Split(*only, ",") {
		if s == section {
			return true
		}
	}
	return false
}

func main() {
	flag.Parse()
	log.SetFlags(0)
	if *cpuProf != "" {
		defer startCPUProfile(*cpuProf)()
	}
	if *quick {
		*dur = time.Second
	}
	dir, err := os.MkdirTemp("", "sluice-bench-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := redistest.Launch(dir)
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 128})
	defer rdb.Close()
	ctx := context.Background()
	ver, _ := rdb.Info(ctx, "server").Result()
	fmt.Printf("bench: redis %s, %d rounds of %v, quick=%v\n", field(ver, "redis_version"), *rounds, *dur, *quick)
	began := time.Now()
	for _, s := range sections(ctx, rdb, srv.Addr) {
		if s.name != "" && !want(s.name) {
			continue
		}
		if s.heading != "" {
			fmt.Println("\n== " + s.heading)
		}
		s.run()
	}
	fmt.Printf("\nbench: done in %v; load average now %s\n", time.Since(began).Round(time.Second), loadAverage())
	fmt.Println("\n| section | scenario | value | ratio | target | met |")
	fmt.Println("|---|---|---:|---:|---|---|")
	for _, r := range table {
		fmt.Printf("| %s | %s | %s | %s | %s | %s |\n", r.section, r.name, r.value, r.ratio, r.target, r.verdict)
	}
}

// startCPUProfile writes the process's CPU profile to path until the
// function it returns is called.
func startCPUProfile(path string) (stop func()) {
	f, err := os.Create(path)
	if err != nil {
		log.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		log.Fatal(err)
	}
	return pprof.StopCPUProfile
}

// section is one part of the bench: -only selects it by name (one without
// a name always runs), and its heading is printed before it runs.
type section struct {
	name, heading string
	run           func()
}

// sections are the bench's parts in the order they run, on the Redis of
// rdb at addr.
func sections(ctx context.Context, rdb *redis.Client, addr string) []section {
	return []section{
		{"check", "limiter checks (calls/s, median of interleaved rounds, 10,000 recipients, every call admitted)", func() { micro(ctx, rdb) }},
		{"throttled", "the throttled path: denials, bookings, wake-and-admit vs redis_rate's denial (calls/s)", func() { throttled(ctx, rdb) }},
		{"booked", "issue 38: a throttled backlog's Redis CPU per delivered send vs a send admitted at once (in-process worker, same run)", func() { bookedCost(ctx, addr) }},
		{"depth", "issue 38: a booking on a key with a deep backlog (Redis time per booking, one caller)", func() { depth(ctx, rdb) }},
		{"tune", "coalescing settings (single-rule check, calls/s)", func() { tune(ctx, rdb) }},
		{"calls", "what one redis.call costs inside a Redis function, by kind; the worker's check made alone (Redis time)", func() { calls(ctx, rdb) }},
		{"worker", "worker throughput (tasks/s, in-process Asynq servers, no-op sender, every task admitted)", func() { workerOverhead(ctx, addr) }},
		{"backlog", "backlog to one recipient vs the exact scheduler (two workers)", func() { backlogs(ctx, addr) }},
		{"multi", "multi-rule, multi-recipient backlogs vs the exact scheduler (two workers)", func() { multiBacklogs(ctx, addr) }},
		{"coincide", "drains whose slots coincide: 300 SMS, 2 tenants × 15 recipients × 10, two workers", func() { coincide(ctx, addr) }},
		{"memory", "memory (INFO used_memory deltas)", func() { memory(ctx, addr, rdb) }},
		{"counters", "issue 22: calendar and bucketed rules — memory of one full key, checks/s vs a log", func() { counters(ctx, rdb) }},
		{"lanes", "issue 19: lanes and shards — the real binary, one worker, log sender", func() { lanes(ctx) }},
		{"enqueue", "issue 38: producers — a campaign of SMS into a fresh Redis, against a plain Asynq client's loop in the same run", func() { producers(ctx) }},
		{"digest", "issue 37: a burst of deferred notifications, with a digest rule and without — the real binary, one worker, log sender", func() { digestSection(ctx) }},
		{"fair", "issue 34: fair share between tenants inside a lane — the real binary, one worker, log sender", func() { fair(ctx) }},
		{"replicas", "replica-acknowledged admissions (SLUICE_REDIS_WAIT_REPLICAS=1) on a master with one replica", func() { replicas(ctx) }},
		{"issue15", "issue 15: the real binary, one worker, 150 SMS to 15 numbers", func() { issue15(ctx) }},
		{"", "", capacity}, // from what the sections before it measured
		{"figures", "figures", func() { figures(ctx, rdb) }},
	}
}

func field(info, name string) string {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), name+":"); ok {
			return v
		}
	}
	return "?"
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// medianOf is the median of f over samples.
func medianOf[S any](samples []S, f func(S) float64) float64 {
	v := make([]float64, len(samples))
	for i, s := range samples {
		v[i] = f(s)
	}
	return median(v)
}

func verdict(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

func docPath(name string) string { return filepath.Join(*docs, name) }

// redisCPU is the Redis server's CPU time so far (INFO cpu: user + sys, all threads).
func redisCPU(ctx context.Context, rdb redis.UniversalClient) time.Duration {
	info, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		log.Fatal(err)
	}
	u, _ := strconv.ParseFloat(field(info, "used_cpu_user"), 64)
	s, _ := strconv.ParseFloat(field(info, "used_cpu_sys"), 64)
	return time.Duration((u + s) * 1e9)
}

// redisReads is Redis's count of read events handled (INFO stats
// total_reads_processed): about one per client round trip, a pipeline
// being one.
func redisReads(ctx context.Context, rdb redis.UniversalClient) int64 {
	info, err := rdb.Info(ctx, "stats").Result()
	if err != nil {
		log.Fatal(err)
	}
	n, _ := strconv.ParseInt(field(info, "total_reads_processed"), 10, 64)
	return n
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct{ calls, usec float64 }

// commandStats reads INFO commandstats since the last CONFIG RESETSTAT, by
// command name (cmdstat_ left out); those scripts make are included.
func commandStats(ctx context.Context, rdb redis.UniversalClient) map[string]cmdStat {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		log.Fatal(err)
	}
	stats := map[string]cmdStat{}
	for _, l := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st cmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			f, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "calls":
				st.calls = f
			case "usec":
				st.usec = f
			}
		}
		stats[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return stats
}

// commandCalls sums INFO commandstats: every command (those scripts make
// included) and the script calls (FCALL, EVALSHA, EVAL) since the last
// CONFIG RESETSTAT.
func commandCalls(ctx context.Context, rdb redis.UniversalClient) (all, scripts int64) {
	for name, st := range commandStats(ctx, rdb) {
		n := int64(st.calls)
		switch name {
		case "config|resetstat", "info":
			continue
		case "fcall", "evalsha", "eval":
			scripts += n
		}
		all += n
	}
	return all, scripts
}

// capacity projects sends/s per Redis core from the Redis CPU per task of
// the saturated worker runs (admit + done + Asynq's own scripts) and of the
// multi-rule backlogs (book + admit + done + Asynq, the idle workers' polls
// taken out).
func capacity() {
	s, a := workerCPU["sluice/10"], workerCPU["asynq/10"]
	if s == 0 || a == 0 {
		return
	}
	add(row{"capacity", "Redis CPU per send, saturated worker (concurrency 10): Sluice / of which Asynq's own", fmt.Sprintf("%.0f µs / %.0f µs", us(s), us(a)), "", "(report)", ""})
	add(row{"capacity", "→ sends/s per Redis core, every send admitted at once", thousands(1 / s.Seconds()), "", "(report)", ""})
	if len(multiCPU) == 0 {
		return
	}
	t := time.Duration(median(durations(multiCPU)))
	lim := max(t-a, 0) // the limiter's share: book + admit + done
	add(row{"capacity", "→ sends/s per Redis core, throttled backlog (book + admit + done + Asynq)", thousands(1 / t.Seconds()), "", fmt.Sprintf("(report: %.0f µs per send)", us(t)), ""})
	add(row{"capacity", "→ sends/s per 3-master Cluster, one queue (its master runs every Asynq script and a third of the limiter)",
		thousands(1 / (a + lim/3).Seconds()), "", "(report; throttled backlog)", ""})
	add(row{"capacity", "→ sends/s per 3-master Cluster, queues spread over the masters", thousands(3 / t.Seconds()), "", "(report; throttled backlog)", ""})
}

func durations(ds []time.Duration) []float64 {
	var out []float64
	for _, d := range ds {
		out = append(out, float64(d))
	}
	return out
}

// loadAverage is the 1, 5 and 15 minute load average, where Linux says it.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

// printCommandStats prints each command's calls and Redis time per task
// since the last CONFIG RESETSTAT (those run inside scripts included).
func printCommandStats(ctx context.Context, rdb redis.UniversalClient, what string, tasks int) {
	stats := commandStats(ctx, rdb)
	names := make([]string, 0, len(stats))
	for name := range stats {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Printf("  commands per task, %s:\n", what)
	for _, name := range names {
		st := stats[name]
		if st.calls/float64(tasks) >= 0.005 {
			fmt.Printf("    %-32s %6.2f calls  %7.2f µs\n", name, st.calls/float64(tasks), st.usec/float64(tasks))
		}
	}
}

// monitor counts the commands clients send (MONITOR, through redis-cli),
// those run by scripts left out: the round trips behind a run.
type monitor struct {
	cmd *exec.Cmd
	out *os.File
}

func startMonitor(addr string) *monitor {
	host, port, _ := strings.Cut(addr, ":")
	f, err := os.CreateTemp("", "monitor-")
	if err != nil {
		log.Fatal(err)
	}
	c := exec.Command("redis-cli", "-h", host, "-p", port, "monitor")
	c.Stdout = f
	if err := c.Start(); err != nil {
		log.Fatal(err)
	}
	// redis-cli prints OK once the server streams to it: only then does the run start.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, _ := os.ReadFile(f.Name()); strings.HasPrefix(string(b), "OK") {
			break
		}
		if time.Now().After(deadline) {
			log.Fatal("monitor: redis-cli did not attach within 5 s")
		}
	}
	return &monitor{c, f}
}

func (m *monitor) print(tasks int) {
	m.cmd.Process.Kill()
	m.cmd.Wait()
	defer os.Remove(m.out.Name())
	raw, err := os.ReadFile(m.out.Name())
	if err != nil {
		log.Fatal(err)
	}
	counts := map[string]int{}
	for _, l := range strings.Split(string(raw), "\n") {
		_, rest, ok := strings.Cut(l, "] \"")
		if !ok || strings.Contains(l, " lua] ") {
			continue
		}
		counts[monitorLabel(rest)]++
	}
	names := make([]string, 0, len(counts))
	for k := range counts {
		names = append(names, k)
	}
	sort.Strings(names)
	fmt.Printf("  commands clients sent per task (MONITOR):")
	for _, k := range names {
		if v := float64(counts[k]) / float64(tasks); v >= 0.005 {
			fmt.Printf(" %s %.2f", k, v)
		}
	}
	fmt.Println()
}

// monitorLabel names one MONITOR line's command (from its first quoted
// word on); a script call also by its hash's start and its first key's kind
// (the key's last part that is not an id), which tells Asynq's scripts apart.
func monitorLabel(rest string) string {
	f := strings.Split(rest, "\" \"")
	name := strings.ToLower(strings.Trim(f[0], "\""))
	if (name != "evalsha" && name != "fcall") || len(f) < 4 {
		return name
	}
	parts := strings.Split(strings.Trim(f[3], "\""), ":")
	kind := parts[len(parts)-1]
	if len(parts) > 1 && (len(kind) > 12 || strings.ContainsAny(kind, "0123456789")) {
		kind = parts[len(parts)-2]
	}
	return name + "(" + f[1][:min(7, len(f[1]))] + " " + kind + ")"
}

// ownCPU is this process's CPU time so far, user and system (getrusage).
func ownCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		log.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
