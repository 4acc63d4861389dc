package main

import (
	"context"
	"fmt"
	"log"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/throttle"
)

var floorScript = redis.NewScript("return 1")

const secret = "bench-secret-0123456789"

type op func(ctx context.Context, i int64) error

// throughput runs f from callers goroutines for *dur and returns calls/s.
func throughput(ctx context.Context, callers int, f op) float64 {
	rate, _ := run(ctx, callers, f)
	return rate
}

// run runs f from callers goroutines for *dur and returns calls/s and calls.
func run(ctx context.Context, callers int, f op) (float64, int64) {
	var n atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(*dur)
	start := time.Now()
	for g := 0; g < callers; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				i := n.Add(1)
				if err := f(ctx, i); err != nil {
					log.Fatal(err)
				}
			}
		}()
	}
	wg.Wait()
	return float64(n.Load()) / time.Since(start).Seconds(), n.Load()
}

// scenario is one peer at one number of callers.
type scenario struct {
	name    string
	callers int
	f       op
}

// interleave runs every scenario once per round, in turn — A B C … then
// … C B A, so that a drift in the machine's load falls on every peer alike —
// each on an emptied Redis, and returns the rates of every round. It also
// notes the median Redis CPU per call (INFO cpu, user + sys) in serverCPU.
func interleave(ctx context.Context, rdb *redis.Client, scs []scenario) results {
	res, cpu := results{}, map[string][]float64{}
	for r := 0; r < *rounds; r++ {
		for k := range scs {
			s := scs[k]
			if r%2 == 1 {
				s = scs[len(scs)-1-k]
			}
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				log.Fatal(err)
			}
			before := redisCPU(ctx, rdb)
			rate, n := run(ctx, s.callers, s.f)
			res[s.name] = append(res[s.name], rate)
			cpu[s.name] = append(cpu[s.name], (redisCPU(ctx, rdb)-before).Seconds()/float64(n))
		}
	}
	for name := range res {
		serverCPU[name] = time.Duration(median(cpu[name]) * 1e9)
	}
	return res
}

// results are the rates of each scenario, one per round.
type results map[string][]float64

func (r results) med(name string) float64 { return median(r[name]) }

// ratio is the median over rounds of a's rate over b's in the same round.
func (r results) ratio(a, b string) float64 {
	var xs []float64
	for i := range r[a] {
		xs = append(xs, r[a][i]/r[b][i])
	}
	return median(xs)
}

// serverCPU is the median Redis CPU per call of each scenario.
var serverCPU = map[string]time.Duration{}

// member is a distinct notification id per call; ids come from the producer
// in production, so making one is not the limiter's cost.
func member(int64) string { return "n" + strconv.FormatInt(memberSeq.Add(1), 36) }

var memberSeq atomic.Int64

// subject spreads calls over 10,000 recipients: every check is admitted
// (100/min per recipient is never reached in a run), for every peer.
func subject(i int64) string { return "+1415" + strconv.FormatInt(5_000_000+i%10_000, 10) }

var recipientRule = throttle.Rule{Limit: 100, Window: time.Minute}

func newLimiter(rdb redis.UniversalClient, o throttle.Options) *throttle.Limiter {
	o.Secret = []byte(secret)
	o.CompactMembers = true
	lim, err := throttle.New(rdb, o)
	if err != nil {
		log.Fatal(err)
	}
	return lim
}

func sluiceOne(lim *throttle.Limiter) op {
	return func(ctx context.Context, i int64) error {
		_, err := lim.Allow(ctx, "bench", member(i), throttle.Limit{Scope: "sms:recipient", Subject: subject(i), Rule: recipientRule})
		return err
	}
}

func sluiceThree(lim *throttle.Limiter) op {
	return func(ctx context.Context, i int64) error {
		s := subject(i)
		_, err := lim.Allow(ctx, "bench", member(i),
			throttle.Limit{Scope: "sms:recipient", Subject: s, Rule: recipientRule},
			throttle.Limit{Scope: "sms:recipient", Subject: s, Rule: throttle.PerDay(500)},
			throttle.Limit{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 1_000_000, Window: time.Hour}})
		return err
	}
}

func rateOne(rl *redis_rate.Limiter) op {
	return func(ctx context.Context, i int64) error {
		_, err := rl.Allow(ctx, subject(i), redis_rate.PerMinute(100))
		return err
	}
}

func floorOp(rdb *redis.Client) op {
	return func(ctx context.Context, i int64) error {
		return floorScript.Run(ctx, rdb, []string{"floor"}).Err()
	}
}

// checkCurve is throughput by callers, per peer, for the figure.
var checkCurve = map[string]map[int]float64{}

var curvePeers = []string{"sluice coalesced", "sluice plain", "redis_rate", "floor"}

func micro(ctx context.Context, rdb *redis.Client) {
	coal := newLimiter(rdb, throttle.Options{})
	defer coal.Close()
	plain := newLimiter(rdb, throttle.Options{Direct: true})
	defer plain.Close()
	rl := redis_rate.NewLimiter(rdb)
	peers := map[string]func(int) op{
		"sluice coalesced": func(int) op { return sluiceOne(coal) },
		"sluice plain":     func(int) op { return sluiceOne(plain) },
		"redis_rate":       func(int) op { return rateOne(rl) },
		"floor":            func(int) op { return floorOp(rdb) },
	}
	counts := []int{1, 4, 16, 32, 64}
	if *quick {
		counts = []int{1, 32}
	}
	// One interleaved sweep per number of callers: every peer of a row is
	// measured next to the others, round by round.
	for _, c := range counts {
		var scs []scenario
		for _, p := range curvePeers {
			scs = append(scs, scenario{p, c, peers[p](c)})
		}
		if c == 32 {
			scs = append(scs, scenario{"sluice 3 rules coalesced", c, sluiceThree(coal)}, scenario{"sluice 3 rules plain", c, sluiceThree(plain)})
		}
		m := interleave(ctx, rdb, scs)
		fmt.Printf("  %2d callers:", c)
		for _, s := range scs {
			if checkCurve[s.name] == nil {
				checkCurve[s.name] = map[int]float64{}
			}
			checkCurve[s.name][c] = m.med(s.name)
			fmt.Printf("  %s %.0f/s (Redis %.1f µs/call)", s.name, m.med(s.name), us(serverCPU[s.name]))
		}
		fmt.Println()
		vs := func(name string) string { return fmt.Sprintf("%.0f vs %.0f", m.med(name), m.med("redis_rate")) }
		ratio := func(name string) float64 { return m.ratio(name, "redis_rate") }
		switch c {
		case 32:
			add(row{"check", "single-rule vs redis_rate, 32 callers: sluice coalesced", vs("sluice coalesced"), f2(ratio("sluice coalesced")), "≥ 1.3×", verdict(ratio("sluice coalesced") >= 1.3)})
			add(row{"check", "single-rule vs redis_rate, 32 callers: sluice plain (Direct)", vs("sluice plain"), f2(ratio("sluice plain")), "(peer)", ""})
			add(row{"check", "three-rule vs redis_rate single-rule, 32 callers: coalesced", vs("sluice 3 rules coalesced"), f2(ratio("sluice 3 rules coalesced")), "≥ 1.0×", verdict(ratio("sluice 3 rules coalesced") >= 1)})
			add(row{"check", "three-rule vs redis_rate single-rule, 32 callers: plain", vs("sluice 3 rules plain"), f2(ratio("sluice 3 rules plain")), "(peer)", ""})
			add(row{"check", "floor (EVALSHA return 1) vs redis_rate, 32 callers", vs("floor"), f2(ratio("floor")), "(the floor)", ""})
			add(row{"check", "Redis CPU per check, 32 callers: coalesced / plain / 3 rules coalesced / redis_rate / floor",
				fmt.Sprintf("%.1f / %.1f / %.1f / %.1f / %.1f µs", us(serverCPU["sluice coalesced"]), us(serverCPU["sluice plain"]), us(serverCPU["sluice 3 rules coalesced"]), us(serverCPU["redis_rate"]), us(serverCPU["floor"])),
				"", "(INFO cpu delta / checks)", ""})
			add(row{"check", "sluice coalesced vs the floor, 32 callers", fmt.Sprintf("%.0f vs %.0f", m.med("sluice coalesced"), m.med("floor")), f2(m.ratio("sluice coalesced", "floor")), "(reference)", ""})
		case 1:
			add(row{"check", "single-rule vs redis_rate, 1 caller: sluice coalesced", vs("sluice coalesced"), f2(ratio("sluice coalesced")), "≥ 0.9×", verdict(ratio("sluice coalesced") >= 0.9)})
			add(row{"check", "single-rule vs redis_rate, 1 caller: sluice plain (Direct)", vs("sluice plain"), f2(ratio("sluice plain")), "(peer)", ""})
			add(row{"check", "floor (EVALSHA return 1) vs redis_rate, 1 caller", vs("floor"), f2(ratio("floor")), "(the floor)", ""})
			add(row{"check", "Redis CPU per check, 1 caller: coalesced / plain / redis_rate / floor",
				fmt.Sprintf("%.1f / %.1f / %.1f / %.1f µs", us(serverCPU["sluice coalesced"]), us(serverCPU["sluice plain"]), us(serverCPU["redis_rate"]), us(serverCPU["floor"])),
				"", "(INFO cpu delta / checks)", ""})
		}
	}
}

// tune measures coalescing settings (Options.Pipelines × MaxBatch) against
// the default and redis_rate, at 32 and 64 callers.
func tune(ctx context.Context, rdb *redis.Client) {
	rl := redis_rate.NewLimiter(rdb)
	type cfg struct{ pipes, batch int }
	cfgs := []cfg{{1, 32}, {2, 32}, {4, 32}, {8, 32}, {2, 8}, {4, 8}, {2, 128}, {4, 128}}
	if *quick {
		cfgs = []cfg{{1, 32}, {4, 32}, {8, 32}}
	}
	for _, callers := range []int{32, 64} {
		scs := []scenario{{"redis_rate", callers, rateOne(rl)}}
		for _, c := range cfgs {
			lim := newLimiter(rdb, throttle.Options{Pipelines: c.pipes, MaxBatch: c.batch})
			defer lim.Close()
			scs = append(scs, scenario{fmt.Sprintf("Pipelines %d, MaxBatch %d", c.pipes, c.batch), callers, sluiceOne(lim)})
		}
		m := interleave(ctx, rdb, scs)
		for _, s := range scs[1:] {
			add(row{"tune", fmt.Sprintf("%s, %d callers", s.name, callers), fmt.Sprintf("%.0f vs %.0f", m.med(s.name), m.med("redis_rate")),
				f2(m.ratio(s.name, "redis_rate")), "(vs redis_rate)", ""})
		}
	}
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

func f2(x float64) string { return fmt.Sprintf("%.2f", x) }
