package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/internal/pollgate"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// keySpec seals every payload the harness enqueues; keyring opens them.
var (
	keySpec    = tasks.NewKeySpec("bench")
	keyring, _ = tasks.ParseKeyring(keySpec)
)

// sent is one send as the sender saw it.
type sent struct {
	at time.Time
	n  tasks.Notification
}

// recorder is a no-op sender that notes when each send happened.
type recorder struct {
	mu   sync.Mutex
	sent []sent
	want int
	done chan struct{}
}

func newRecorder(want int) *recorder { return &recorder{want: want, done: make(chan struct{})} }

func (r *recorder) Send(_ context.Context, n tasks.Notification) error {
	r.mu.Lock()
	r.sent = append(r.sent, sent{time.Now(), n})
	if len(r.sent) == r.want {
		close(r.done)
	}
	r.mu.Unlock()
	return nil
}

func (r *recorder) sends() []sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]sent(nil), r.sent...)
	sort.Slice(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// rate is sends/s from the first send to the last.
func (r *recorder) rate() float64 {
	s := r.sends()
	return float64(len(s)-1) / s[len(s)-1].at.Sub(s[0].at).Seconds()
}

var runSeq int

func queueName(prefix string) string { runSeq++; return prefix + "-" + strconv.Itoa(runSeq) }

func workerConfig(addr, queue, rules string, extra map[string]string) worker.Config {
	env := map[string]string{
		"SLUICE_REDIS_URL":      "redis://" + addr,
		"SLUICE_QUEUE":          queue,
		"SLUICE_RULES":          rules,
		"SLUICE_SUBJECT_SECRET": secret,
		"SLUICE_PAYLOAD_KEYS":   keySpec,
		"SLUICE_HTTP_ADDR":      "off",
		"SLUICE_LOG_LEVEL":      "error",
	}
	for k, v := range extra {
		env[k] = v
	}
	applyWorkerEnv(env)
	cfg, err := worker.ParseConfig(env)
	if err != nil {
		log.Fatal(err)
	}
	return cfg
}

// applyWorkerEnv sets -worker-env's KEY=VALUE settings in env (overriding
// the bench's own), for trying settings.
func applyWorkerEnv(env map[string]string) {
	if *workerEnv == "" {
		return
	}
	for _, kv := range strings.Split(*workerEnv, ",") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
}

// startWorker runs a Sluice worker in-process until stop is called.
func startWorker(addr string, cfg worker.Config, s sender.Sender) (reg *prometheus.Registry, stop func()) {
	return startWorkerWith(addr, cfg, s, nil)
}

// startWorkerWith is startWorker with a decision hook (worker.Options.OnDecision).
func startWorkerWith(addr string, cfg worker.Config, s sender.Sender, onDecision func(tasks.Notification, throttle.Decision)) (reg *prometheus.Registry, stop func()) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	reg = prometheus.NewRegistry()
	w, err := app.NewWorker(cfg, app.WorkerOptions{Redis: rdb, Registry: reg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Senders: map[tasks.Channel]sender.Sender{tasks.SMS: s, tasks.Email: s}, OnDecision: onDecision})
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return reg, func() {
		cancel()
		if err := <-done; err != nil {
			log.Fatal(err)
		}
		rdb.Close()
	}
}

// enqueueAll enqueues ns in order, straight into the queue's pending list
// (plainTask: no waiting room, which a bare Asynq server would never serve;
// the rooms' own cost is the fair section's), and returns when each
// enqueue returned.
func enqueueAll(ctx context.Context, c *asynq.Client, queue string, ns []tasks.Notification) []arrival {
	out := make([]arrival, len(ns))
	for i, n := range ns {
		if n.ID == "" {
			n.ID = tasks.NewID()
		}
		t, opts := plainTask(n, queue)
		if _, err := c.EnqueueContext(ctx, t, opts...); err != nil {
			log.Fatal(err)
		}
		out[i] = arrival{time.Now(), n.Normalized()}
	}
	return out
}

func decisions(reg *prometheus.Registry) float64 {
	mfs, _ := reg.Gather()
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == "sluice_throttle_decisions_total" {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// asynqServer is a bare Asynq server configured like the Sluice worker's.
func asynqServer(rdb *redis.Client, cfg worker.Config) *asynq.Server {
	return asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: cfg.Concurrency + cfg.MaxWaiters, Queues: map[string]int{cfg.Queue: 1},
		TaskCheckInterval: cfg.PollInterval, DelayedTaskCheckInterval: cfg.DelayedCheckInterval, LogLevel: asynq.ErrorLevel})
}

// openTask is what every peer does before sending: open the sealed payload.
func openTask(ctx context.Context, t *asynq.Task) (tasks.Notification, error) {
	id, _ := asynq.GetTaskID(ctx)
	return tasks.Open(keyring, id, t.Type(), t.Payload(), false)
}

// overheadRules are the worker rows' rules: one recipient rule and one
// tenant rule, never reached (every task is admitted at once).
const overheadRules = "sms:recipient=100/1m,sms:tenant=1000000/1h"

// workerCPU is Redis CPU per task of each worker peer (saturated runs).
var workerCPU = map[string]time.Duration{}

// workerOverhead compares tasks/s of a Sluice worker (throttle middleware,
// every send admitted, distinct recipients) with a bare Asynq server running
// the same decode and no-op send, and with an Asynq server whose middleware
// asks go-redis/redis_rate for the same two limits, interleaved.
func workerOverhead(ctx context.Context, addr string) {
	n := 3000
	if *quick {
		n = 1000
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	defer rdb.Close()
	lim := newLimiter(rdb, throttle.Options{}) // coalesced, as the worker's
	defer lim.Close()
	rlim := newLimiter(rdb, throttle.Options{DoneLinger: time.Millisecond}) // the worker's DONE_LINGER default
	defer rlim.Close()
	cs, err := consent.NewStore(rdb, rlim, consent.Options{})
	if err != nil {
		log.Fatal(err)
	}
	o := overheadBench{addr: addr, rdb: rdb, client: asynq.NewClientFromRedisClient(rdb), rl: redis_rate.NewLimiter(rdb), lim: lim, rlim: rlim,
		consent: cs, delivery: delivery.NewStore(rdb, rlim), n: n}
	peers := []string{"sluice", "asynq", "asynq+redis_rate"}
	if *workerPeers != "" {
		peers = strings.Split(*workerPeers, ",")
	}
	if *withFloors {
		for _, f := range floors {
			peers = append(peers, f.peer)
		}
	}
	for _, conc := range []int{10, 50, 200} {
		runs := overheadRuns{rates: map[string][]float64{}, cpus: map[string][]float64{}, owns: map[string][]float64{}, cmds: map[string][]float64{},
			calls: map[string][]float64{}, trips: map[string][]float64{}, ratios: map[string][]float64{}}
		for r := 0; r < *rounds; r++ {
			order := slices.Clone(peers)
			if r%2 == 1 {
				slices.Reverse(order)
			}
			got := map[string]float64{}
			for _, p := range order {
				got[p] = runs.add(p, o.run(ctx, p, conc, r))
			}
			runs.ratios["asynq"] = append(runs.ratios["asynq"], got["sluice"]/got["asynq"])
			runs.ratios["asynq+redis_rate"] = append(runs.ratios["asynq+redis_rate"], got["sluice"]/got["asynq+redis_rate"])
			if *withFloors {
				for _, f := range floors {
					runs.ratios[f.peer] = append(runs.ratios[f.peer], got[f.peer]/got["asynq+redis_rate"])
				}
			}
		}
		if *workerPeers != "" { // some peers only: their rates and costs, no ratios
			for _, p := range peers {
				fmt.Printf("  concurrency %d: %s %.0f/s; per task process CPU %.0f µs, Redis CPU %.0f µs, round trips %.2f\n", conc, p,
					median(runs.rates[p]), median(runs.owns[p])*1e6, median(runs.cpus[p])*1e6, median(runs.trips[p]))
			}
			continue
		}
		reportOverhead(conc, peers, runs)
	}
}

// overheadBench is what every run of workerOverhead shares.
type overheadBench struct {
	addr     string
	rdb      *redis.Client
	client   *asynq.Client
	rl       *redis_rate.Limiter
	lim      *throttle.Limiter // checkFloor's
	rlim     *throttle.Limiter // the other floors' (DONE_LINGER as the worker's)
	consent  *consent.Store    // fullFloor's and gatedFloor's keys
	delivery *delivery.Store   // the same
	n        int               // tasks per run
}

// checkFloor is the worker rows' bound: a bare Asynq server whose handler
// asks Sluice's limiter (the sliding-window log, one script per check,
// coalesced as in the worker) for the same two rules and nothing else —
// no done record, no queued-work ledger, no waiting rooms, no consent, no
// provider choice. A worker that checks its rules this way cannot do
// better than it.
const checkFloor = "asynq+sluice check"

// recordFloor is checkFloor with the record invariant 11 needs of every
// send: the check keeps the id's state (Reserve, at-least-once, as the
// worker's) and the send is marked done after it (MarkDone, carried by the
// next check within 1 ms as in the worker). Still no queued-work ledger,
// waiting rooms, consent, plans, poll gate, provider choice, metrics or
// tracing.
const recordFloor = "asynq+sluice check+record"

// fullFloor is recordFloor whose check also reads and writes, in the same
// script call, what the worker's check does for every SMS: the recipient's
// consent (invariant 19), the provider's hold (21), the recipient note a
// delivery report resolves a crash re-send by (21) and the send's deadline
// (14). Still no queued-work ledger, waiting rooms, poll gate, plans,
// provider choice, metrics or tracing.
const fullFloor = "asynq+sluice full check"

// gatedFloor is fullFloor whose Asynq server polls through Sluice's poll
// gate (internal/pollgate, QUEUE_RECHECK's default), as the worker's do: an
// idle worker then costs Redis almost nothing, and a busy one receives an
// invalidation for every key its queues' tasks write.
const gatedFloor = "asynq+sluice full check+gate"

// floors are the worker rows' bounds, each the one before with one more
// part the worker must have; what names them in the rows.
var floors = []struct{ peer, what string }{
	{checkFloor, "Sluice's check alone"},
	{recordFloor, "Sluice's check and record"},
	{fullFloor, "Sluice's full check and record"},
	{gatedFloor, "Sluice's full check, record and poll gate"},
}

// overheadSample is one run's measurements, per task where not a rate.
type overheadSample struct {
	rate, cpu, cmds, calls float64 // tasks/s; Redis CPU seconds, commands, script calls per task
	trips                  float64 // Redis's read events per task: the clients' round trips (a pipeline is one)
	own                    float64 // this process's CPU seconds per task (the worker or the Asynq peer, and the recorder)
}

// overheadRuns are one concurrency's samples by peer, and Sluice's ratio
// to each peer per round.
type overheadRuns struct {
	rates, cpus, owns, cmds, calls, trips, ratios map[string][]float64
}

// add records peer p's sample and returns its rate.
func (o overheadRuns) add(p string, s overheadSample) float64 {
	o.cmds[p] = append(o.cmds[p], s.cmds)
	o.calls[p] = append(o.calls[p], s.calls)
	o.trips[p] = append(o.trips[p], s.trips)
	o.rates[p] = append(o.rates[p], s.rate)
	o.cpus[p] = append(o.cpus[p], s.cpu)
	o.owns[p] = append(o.owns[p], s.own)
	return s.rate
}

// run drains n tasks of round r (recipients of their own) with peer p at
// concurrency conc, on an emptied Redis, and measures it.
func (o overheadBench) run(ctx context.Context, p string, conc, r int) overheadSample {
	if err := o.rdb.FlushAll(ctx).Err(); err != nil {
		log.Fatal(err)
	}
	q := queueName("ovh")
	cfg := workerConfig(o.addr, q, overheadRules, map[string]string{"SLUICE_CONCURRENCY": strconv.Itoa(conc)})
	ns := make([]tasks.Notification, o.n)
	for i := range ns {
		ns[i] = tasks.NewSMS("bench", fmt.Sprintf("+1416%07d", r*o.n+i), "bench "+strconv.Itoa(i))
	}
	into := q
	if p == "sluice" {
		// Where Sluice's producers put them: the standard lane's shard of
		// the tenant (plainTask: no waiting room). In the legacy queue every
		// dequeue first asked the lanes' 16 empty shards (answered by the
		// poll gate, still ~20 µs of CPU a task).
		into = tasks.Layout{Base: q}.Route(ns[0].Tenant, tasks.LaneStandard, nil)
	}
	enqueueAll(ctx, o.client, into, ns)
	rec := newRecorder(o.n)
	if err := o.rdb.ConfigResetStat(ctx).Err(); err != nil {
		log.Fatal(err)
	}
	cpu0, own0, reads0 := redisCPU(ctx, o.rdb), ownCPU(), redisReads(ctx, o.rdb)
	var mon *monitor
	if *monitorOn {
		mon = startMonitor(o.addr)
	}
	if p == "sluice" {
		_, stop := startWorker(o.addr, cfg, rec)
		<-rec.done
		stop()
	} else {
		o.runAsynq(cfg, rec, p)
	}
	var s overheadSample
	s.rate = rec.rate()
	s.own = (ownCPU() - own0).Seconds() / float64(o.n)
	if *cmdStats {
		printCommandStats(ctx, o.rdb, fmt.Sprintf("%s, concurrency %d", p, conc), o.n)
	}
	if mon != nil {
		mon.print(o.n)
	}
	s.trips = float64(redisReads(ctx, o.rdb)-reads0-2) / float64(o.n) // less this harness's own two reads (INFO)
	all, scripts := commandCalls(ctx, o.rdb)
	s.cmds, s.calls = float64(all)/float64(o.n), float64(scripts)/float64(o.n)
	s.cpu = (redisCPU(ctx, o.rdb) - cpu0).Seconds() / float64(o.n)
	return s
}

// runAsynq drains the queue of cfg with a bare Asynq server whose handler
// opens each task and sends it to rec; as peer "asynq+redis_rate" it first
// asks redis_rate for the worker's two limits, as checkFloor Sluice's
// limiter, as the other floors Sluice's limiter with the id's record (and
// as gatedFloor through a poll gate).
func (o overheadBench) runAsynq(cfg worker.Config, rec *recorder, peer string) {
	rdb := o.rdb
	if peer == gatedFloor {
		c, stop := o.gated(cfg.Queue)
		defer stop()
		rdb = c
	}
	srv := asynqServer(rdb, cfg)
	mux := asynq.NewServeMux()
	mux.HandleFunc(tasks.TypeSMS, func(ctx context.Context, t *asynq.Task) error {
		nt, err := openTask(ctx, t)
		if err != nil {
			return err
		}
		switch peer {
		case "asynq+redis_rate":
			if err := o.allowRedisRate(ctx, nt); err != nil {
				return err
			}
		case checkFloor:
			if err := o.allowSluice(ctx, nt); err != nil {
				return err
			}
		case recordFloor, fullFloor, gatedFloor:
			return o.reserveSluice(ctx, nt, rec, peer != recordFloor)
		}
		return rec.Send(ctx, nt)
	})
	if err := srv.Start(mux); err != nil {
		log.Fatal(err)
	}
	<-rec.done
	srv.Shutdown()
}

// allowRedisRate asks redis_rate for overheadRules' two limits on nt: an
// error if either denies.
func (o overheadBench) allowRedisRate(ctx context.Context, nt tasks.Notification) error {
	for _, l := range []struct {
		key string
		lim redis_rate.Limit
	}{{"r:" + nt.Tenant + ":" + nt.To, redis_rate.PerMinute(100)}, {"t:" + nt.Tenant, redis_rate.PerHour(1_000_000)}} {
		res, err := o.rl.Allow(ctx, l.key, l.lim)
		if err != nil {
			return err
		}
		if res.Allowed == 0 {
			return fmt.Errorf("redis_rate denied %s", l.key)
		}
	}
	return nil
}

// overheadLimits are overheadRules' two limits on nt, as Sluice's limiter
// takes them.
func overheadLimits(nt tasks.Notification) []throttle.Limit {
	return []throttle.Limit{
		{Scope: "sms:recipient", Subject: nt.To, Rule: throttle.Rule{Limit: 100, Window: time.Minute}},
		{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 1_000_000, Window: time.Hour}},
	}
}

// allowSluice asks Sluice's limiter for overheadRules' two limits on nt,
// in one check: an error if it denies.
func (o overheadBench) allowSluice(ctx context.Context, nt tasks.Notification) error {
	d, err := o.lim.Allow(ctx, nt.Tenant, nt.ID, overheadLimits(nt)...)
	if err != nil {
		return err
	}
	if !d.Allowed {
		return fmt.Errorf("sluice's limiter denied %s", nt.ID)
	}
	return nil
}

// gated returns a client through a running poll gate on queue, once the
// gate answers polls, and its stop.
func (o overheadBench) gated(queue string) (*redis.Client, func()) {
	g := pollgate.New(o.rdb, []string{queue}, pollgate.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	c, err := g.Client()
	if err != nil {
		log.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	for !g.Active() { // the gate signals nothing else
		time.Sleep(time.Millisecond)
	}
	return c.(*redis.Client), func() { cancel(); <-done; c.Close() }
}

// reserveSluice is recordFloor's handler (fullFloor's with full):
// Reserve overheadRules' two limits for nt keeping its state, send it to
// rec, mark it done.
func (o overheadBench) reserveSluice(ctx context.Context, nt tasks.Notification, rec *recorder, full bool) error {
	opts := throttle.ReserveOptions{Policy: throttle.AtLeastOnce, Nonce: nt.ID[:8]}
	if full {
		opts.StateTTL = 24 * time.Hour
		opts.Deadline = time.Now().Add(tasks.DefaultTimeout)
		opts.Consent = &throttle.ConsentCheck{Key: o.consent.Key(nt.Tenant, nt.Channel, nt.To), Category: nt.CategoryOrDefault()}
		opts.Holds = []string{o.rlim.HoldKey("sms:provider", "")}
		opts.Note = o.delivery.RecipientNote(nt.Tenant, nt.ID, nt.To, 24*time.Hour)
	}
	d, err := o.rlim.Reserve(ctx, nt.Tenant, nt.ID, opts, overheadLimits(nt)...)
	if err != nil {
		return err
	}
	if d.Status != throttle.StatusAdmitted {
		return fmt.Errorf("sluice's limiter did not admit %s: %v", nt.ID, d.Status)
	}
	if err := rec.Send(ctx, nt); err != nil {
		return err
	}
	return o.rlim.MarkDone(ctx, nt.Tenant, nt.ID, d.Attempt, 24*time.Hour)
}

// reportOverhead records each peer's Redis CPU per task at conc in
// workerCPU, prints the medians and adds the worker rows: throughput
// against Asynq + redis_rate (each round's ratio printed), Redis CPU per
// task against bare Asynq, this process's CPU per task against the peer,
// and per task the round trips, commands and script calls of each.
func reportOverhead(conc int, peers []string, runs overheadRuns) {
	rates, cmds, calls, trips := runs.rates, runs.cmds, runs.calls, runs.trips
	s := median(rates["sluice"])
	c := strconv.Itoa(conc)
	for _, p := range peers {
		workerCPU[p+"/"+c] = time.Duration(median(runs.cpus[p]) * 1e9)
	}
	fmt.Printf("  concurrency %d: sluice %.0f/s, asynq %.0f/s, asynq+redis_rate %.0f/s; Redis CPU per task %v, %v, %v\n", conc, s,
		median(rates["asynq"]), median(rates["asynq+redis_rate"]), workerCPU["sluice/"+c].Round(time.Microsecond),
		workerCPU["asynq/"+c].Round(time.Microsecond), workerCPU["asynq+redis_rate/"+c].Round(time.Microsecond))
	perTask := func(p string) string {
		return fmt.Sprintf("%.2f / %.1f / %.2f", median(trips[p]), median(cmds[p]), median(calls[p]))
	}
	fmt.Printf("  concurrency %d: per task, round trips / commands (those in scripts included) / script calls: sluice %s; asynq %s; asynq+redis_rate %s\n",
		conc, perTask("sluice"), perTask("asynq"), perTask("asynq+redis_rate"))
	reportOwnCPU(conc, peers, runs)
	ar := median(runs.ratios["asynq+redis_rate"])
	target, met := "(report)", ""
	switch conc {
	case 10:
		target, met = "≥ 1.0×", verdict(ar >= 1)
	case 50:
		target, met = "≥ 1.1×", verdict(ar >= 1.1)
	}
	add(row{"worker", fmt.Sprintf("vs Asynq + redis_rate middleware, concurrency %d", conc), fmt.Sprintf("%.0f vs %.0f tasks/s; rounds %s", s, median(rates["asynq+redis_rate"]), roundsOf(runs.ratios["asynq+redis_rate"])), f2(ar), target, met})
	a := median(runs.ratios["asynq"])
	add(row{"worker", fmt.Sprintf("vs bare Asynq (no-op handler), concurrency %d", conc), fmt.Sprintf("%.0f vs %.0f tasks/s; rounds %s", s, median(rates["asynq"]), roundsOf(runs.ratios["asynq"])), f2(a), "(report)", ""})
	if sc := float64(workerCPU["sluice/"+c]) / float64(workerCPU["asynq/"+c]); sc > 0 {
		add(row{"worker", fmt.Sprintf("Redis CPU per task, Sluice vs bare Asynq, concurrency %d", conc),
			fmt.Sprintf("%.0f vs %.0f µs; rounds %s", us(workerCPU["sluice/"+c]), us(workerCPU["asynq/"+c]), roundsOf(perRound(runs.cpus["sluice"], runs.cpus["asynq"]))),
			f2(sc), "≤ 1.6×", verdict(sc <= 1.6)})
	}
	own, peer := median(runs.owns["sluice"]), median(runs.owns["asynq+redis_rate"])
	add(row{"worker", fmt.Sprintf("process CPU per task, Sluice vs Asynq + redis_rate, concurrency %d", conc),
		fmt.Sprintf("%.0f vs %.0f µs", own*1e6, peer*1e6), f2(own / peer), "≤ 1.0×", verdict(own <= peer)})
	add(row{"worker", fmt.Sprintf("per task: Redis round trips / commands / script calls, concurrency %d", conc),
		fmt.Sprintf("sluice %s; asynq %s; asynq+redis_rate %s", perTask("sluice"), perTask("asynq"), perTask("asynq+redis_rate")), "", "(report)", ""})
	if *withFloors {
		reportFloors(conc, runs)
	}
}

// reportFloors adds issue 38's bound rows: Asynq with Sluice's check and
// nothing else, then with each further part the worker had to have.
func reportFloors(conc int, runs overheadRuns) {
	c := strconv.Itoa(conc)
	for _, f := range floors {
		fr := median(runs.ratios[f.peer])
		fc := float64(workerCPU[f.peer+"/"+c]) / float64(workerCPU["asynq/"+c])
		add(row{"worker", fmt.Sprintf("bound: Asynq + %s vs Asynq + redis_rate middleware, concurrency %d", f.what, conc),
			fmt.Sprintf("%.0f vs %.0f tasks/s; rounds %s", median(runs.rates[f.peer]), median(runs.rates["asynq+redis_rate"]), roundsOf(runs.ratios[f.peer])), f2(fr), "(report)", ""})
		add(row{"worker", fmt.Sprintf("bound: Redis CPU per task, Asynq + %s vs bare Asynq, concurrency %d", f.what, conc),
			fmt.Sprintf("%.0f vs %.0f µs", us(workerCPU[f.peer+"/"+c]), us(workerCPU["asynq/"+c])), f2(fc), "(report)", ""})
	}
}

// backlogResult is one backlog drained by two in-process workers.
type backlogResult struct {
	name, rules, policy  string
	n                    int
	window               time.Duration
	callsPerMsg          float64
	drain, ideal, idealS time.Duration // measured; exact scheduler without and with the slack
	violations           int
	cpuPerMsg, cpuNet    time.Duration // Redis CPU per delivered message; without the idle workers' share
	lateP50, lateP99     time.Duration // send time − admitted slot
	lateMax              time.Duration
}

// backlog enqueues ns at once (in order) for two Sluice workers under rules
// and measures the drain (first enqueue to last send) against the exact
// scheduler's, limiter calls per delivered message, Redis CPU per delivered
// message, and every rule on the actual send times.
func backlog(ctx context.Context, addr, name, rules, policy string, ns []tasks.Notification) backlogResult {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		log.Fatal(err)
	}
	client := asynq.NewClientFromRedisClient(rdb)
	q := queueName("backlog")
	rec := newRecorder(len(ns))
	cfg := workerConfig(addr, q, rules, map[string]string{"SLUICE_RESCHEDULE": policy})
	var mu sync.Mutex
	slots := map[string]time.Time{}
	onDecision := func(n tasks.Notification, d throttle.Decision) {
		if d.Status == throttle.StatusAdmitted {
			mu.Lock()
			slots[n.ID] = d.At
			mu.Unlock()
		}
	}
	reg1, stop1 := startWorkerWith(addr, cfg, rec, onDecision)
	reg2, stop2 := startWorkerWith(addr, cfg, rec, onDecision)
	time.Sleep(200 * time.Millisecond) // both servers up
	// What two idle workers cost Redis (polls, heartbeats, the delayed-task
	// forwarder), to take out of the per-message figure.
	idle0 := redisCPU(ctx, rdb)
	time.Sleep(2 * time.Second)
	idleRate := float64(redisCPU(ctx, rdb)-idle0) / float64(2*time.Second)
	cpu0 := redisCPU(ctx, rdb)
	start := time.Now()
	arrivals := enqueueAll(ctx, client, q, ns)
	slowest := idealDrain(rules, arrivals, start, cfg.SendSlack)
	select {
	case <-rec.done:
	case <-time.After(3*slowest + 30*time.Second):
		log.Fatalf("backlog %s: %d of %d sent before the time limit", name, len(rec.sends()), len(ns))
	}
	cpu := redisCPU(ctx, rdb) - cpu0
	idle := time.Duration(idleRate * float64(time.Since(start)))
	calls := decisions(reg1) + decisions(reg2)
	stop1()
	stop2()
	s := rec.sends()
	res := backlogResult{name: name, rules: rules, policy: policy, n: len(ns), callsPerMsg: calls / float64(len(ns)),
		drain: s[len(s)-1].at.Sub(start), ideal: idealDrain(rules, arrivals, start, 0), idealS: slowest,
		violations: violations(rules, s), cpuPerMsg: cpu / time.Duration(len(ns)), cpuNet: (cpu - idle) / time.Duration(len(ns))}
	var late []time.Duration
	mu.Lock()
	for _, x := range s {
		if at, ok := slots[x.n.ID]; ok {
			late = append(late, x.at.Sub(at))
		}
	}
	mu.Unlock()
	sort.Slice(late, func(i, j int) bool { return late[i] < late[j] })
	if len(late) > 0 {
		res.lateP50, res.lateP99, res.lateMax = late[len(late)/2], late[len(late)*99/100], late[len(late)-1]
	}
	return res
}

// violations counts sends that broke a rule on actual send times: a send
// with limit others of its key less than window − 20 ms before it (the
// sender runs just after admission, so send times jitter by a few ms).
func violations(rules string, s []sent) int {
	policy, err := plans.Parse(rules)
	if err != nil {
		log.Fatal(err)
	}
	byKey := map[string][]time.Time{}
	lims := map[string]int{}
	wins := map[string]time.Duration{}
	for _, x := range s {
		for _, e := range policy.Match(x.n.Tenant, x.n.Channel, x.n.Category).Rates {
			l := e.Limit(x.n.To, x.n.From, x.n.User)
			k := groupOf(x.n.Tenant, l) + "|" + l.Scope + "|" + l.Subject + "|" + l.Rule.Window.String()
			byKey[k] = append(byKey[k], x.at)
			lims[k], wins[k] = l.Rule.Limit, l.Rule.Window
		}
	}
	v := 0
	for k, ts := range byKey {
		for i := lims[k]; i < len(ts); i++ {
			if ts[i].Sub(ts[i-lims[k]]) <= wins[k]-20*time.Millisecond {
				v++
			}
		}
	}
	return v
}

var backlogResults []backlogResult

// multiCPU is the net Redis CPU per delivered message of each multi-rule backlog.
var multiCPU []time.Duration

func describe(r backlogResult) string {
	return fmt.Sprintf("drain %.1f s vs ideal %.1f s (with slack %.1f s), %.2f calls/msg, %d violations, send − slot p50 %v p99 %v max %v",
		r.drain.Seconds(), r.ideal.Seconds(), r.idealS.Seconds(), r.callsPerMsg, r.violations,
		r.lateP50.Round(time.Millisecond), r.lateP99.Round(time.Millisecond), r.lateMax.Round(time.Millisecond))
}

// backlogs: one recipient, limit 10 per window, six windows' worth, for
// windows of 2 to 10 s; the naive policy as a peer at 2 s.
func backlogs(ctx context.Context, addr string) {
	windows := []time.Duration{2 * time.Second, 4 * time.Second, 6 * time.Second, 10 * time.Second}
	if *quick {
		windows = windows[:1]
	}
	const limit, batches = 10, 6
	for _, w := range windows {
		policies := []string{"booked"}
		if w == 2*time.Second && !*quick {
			policies = append(policies, "naive")
		}
		for _, policy := range policies {
			rules := fmt.Sprintf("sms:recipient=%d/%s,sms:tenant=1000000/1h", limit, w)
			to := fmt.Sprintf("+1418%07d", runSeq)
			ns := make([]tasks.Notification, limit*batches)
			for i := range ns {
				ns[i] = tasks.NewSMS("bench", to, "bench "+strconv.Itoa(i))
			}
			r := backlog(ctx, addr, fmt.Sprintf("%d to one recipient under %d/%v", len(ns), limit, w), rules, policy, ns)
			r.window = w
			backlogResults = append(backlogResults, r)
			ratio := float64(r.drain) / float64(r.ideal)
			target, v := "≤ 1.10× ideal, 0 violations", verdict(ratio <= 1.10 && r.violations == 0)
			if policy == "naive" {
				target, v = "(peer: naive rescheduling)", ""
			}
			add(row{"backlog", fmt.Sprintf("%s, %s, two workers", r.name, policy), describe(r), f2(ratio), target, v})
			if policy == "booked" {
				add(row{"backlog", fmt.Sprintf("… slack's share of that ideal (window %v + 100 ms)", w), fmt.Sprintf("%.1f s vs %.1f s", r.idealS.Seconds(), r.ideal.Seconds()),
					f2(float64(r.idealS) / float64(r.ideal)), "(exact scheduler with slack / without)", ""})
			}
		}
	}
}

// spread returns recipients × each SMS of one tenant, shuffled with a fixed seed.
func spread(tenant string, recipients, each int, seed uint64) []tasks.Notification {
	var ns []tasks.Notification
	for r := 0; r < recipients; r++ {
		for i := 0; i < each; i++ {
			ns = append(ns, tasks.NewSMS(tenant, fmt.Sprintf("+1415%07d", 5550000+r), fmt.Sprintf("message %d", i)))
		}
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	rng.Shuffle(len(ns), func(i, j int) { ns[i], ns[j] = ns[j], ns[i] })
	return ns
}

// multiBacklogs: several rules, many recipients, two workers, against the
// exact scheduler over the same arrivals.
func multiBacklogs(ctx context.Context, addr string) {
	type sc struct {
		rules            string
		recipients, each int
	}
	scs := []sc{{"sms:recipient=3/5s,sms:tenant=20/4s", 15, 10}, {"sms:recipient=2/6s,sms:tenant=100/10s", 15, 10}}
	if *quick {
		scs = []sc{{"sms:recipient=3/5s,sms:tenant=20/4s", 10, 6}}
	}
	for i, s := range scs {
		ns := spread("acme", s.recipients, s.each, uint64(i+1))
		r := backlog(ctx, addr, fmt.Sprintf("%d SMS, %d recipients × %d, %s", len(ns), s.recipients, s.each, s.rules), s.rules, "booked", ns)
		ratio := float64(r.drain) / float64(r.ideal)
		add(row{"multi", r.name + ", two workers", describe(r), f2(ratio), "≤ 1.15× ideal, 0 violations", verdict(ratio <= 1.15 && r.violations == 0)})
		add(row{"multi", "… limiter calls per delivered message", fmt.Sprintf("%.2f", r.callsPerMsg), "", "≤ 2", verdict(r.callsPerMsg <= 2)})
		add(row{"multi", "… slack's share of the ideal", fmt.Sprintf("%.1f s vs %.1f s", r.idealS.Seconds(), r.ideal.Seconds()), f2(float64(r.idealS) / float64(r.ideal)), "(exact scheduler with slack / without)", ""})
		add(row{"multi", "… Redis CPU per delivered message: all / less the idle workers' polls (book + admit + done + Asynq)",
			fmt.Sprintf("%.0f µs / %.0f µs", us(r.cpuPerMsg), us(r.cpuNet)), "", "(report; see capacity)", ""})
		multiCPU = append(multiCPU, r.cpuNet)
	}
}

func thousands(x float64) string {
	s := strconv.FormatFloat(x, 'f', 0, 64)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// coincide is issue 23's drain: 300 SMS to 30 recipients (2 tenants × 15,
// 10 each), all enqueued at once, two workers, under sms:recipient=2/6s
// alone and with a tenant rule that cannot bind. Every recipient's slots
// fall on the same instants, so about 60 booked tasks wake together.
func coincide(ctx context.Context, addr string) {
	for _, rules := range []string{"sms:recipient=2/6s", "sms:recipient=2/6s,sms:tenant=100000/1h"} {
		ns := append(spread("acme", 15, 10, 7), spread("globex", 15, 10, 8)...)
		rng := rand.New(rand.NewPCG(9, 9))
		rng.Shuffle(len(ns), func(i, j int) { ns[i], ns[j] = ns[j], ns[i] })
		r := backlog(ctx, addr, fmt.Sprintf("%d SMS, 2 tenants × 15 recipients × 10, %s", len(ns), rules), rules, "booked", ns)
		ratio := float64(r.drain) / float64(r.ideal)
		add(row{"coincide", r.name + ", two workers", describe(r), f2(ratio), "≤ 1.10× ideal, 0 violations", verdict(ratio <= 1.10 && r.violations == 0)})
		add(row{"coincide", "… slack's share of the ideal", fmt.Sprintf("%.1f s vs %.1f s", r.idealS.Seconds(), r.ideal.Seconds()), f2(float64(r.idealS) / float64(r.ideal)), "(exact scheduler with slack / without)", ""})
	}
}

// reportOwnCPU prints and records each peer's CPU per task in this process
// (the worker or the Asynq server, its handler and the recorder) and in
// Redis: on two cores shared by both, their sum is what a task costs.
func reportOwnCPU(conc int, peers []string, runs overheadRuns) {
	var parts []string
	for _, p := range peers {
		own, rd := median(runs.owns[p])*1e6, median(runs.cpus[p])*1e6
		parts = append(parts, fmt.Sprintf("%s %.0f + %.0f = %.0f µs", p, own, rd, own+rd))
	}
	fmt.Printf("  concurrency %d: CPU per task, process + Redis: %s\n", conc, strings.Join(parts, "; "))
	add(row{"worker", fmt.Sprintf("CPU per task, this process + Redis, concurrency %d", conc),
		strings.Join(parts, "; "), "", "(report)", ""})
}

// roundsOf lists each round's ratio, in round order.
// perRound is a[i]/b[i] for each round both measured (rounds are
// interleaved, so round i of each peer ran on the same machine state).
func perRound(a, b []float64) []float64 {
	out := make([]float64, 0, min(len(a), len(b)))
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			out = append(out, a[i]/b[i])
		}
	}
	return out
}

func roundsOf(ratios []float64) string {
	out := make([]string, len(ratios))
	for i, r := range ratios {
		out[i] = f2(r)
	}
	return strings.Join(out, ", ")
}
