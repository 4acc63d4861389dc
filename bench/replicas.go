package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

// replicas measures what SLUICE_REDIS_WAIT_REPLICAS=1 costs: the same
// checks and the same worker drain on a master with one replica attached
// (so replication costs both peers alike), without and with a WAIT behind
// every admitting check, interleaved.
func replicas(ctx context.Context) {
	dir, err := os.MkdirTemp("", "sluice-bench-replicas-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	for _, d := range []string{"m", "r"} {
		if err := os.Mkdir(dir+"/"+d, 0o755); err != nil {
			log.Fatal(err)
		}
	}
	master, err := redistest.Launch(dir+"/m", "--repl-diskless-sync-delay", "0")
	if err != nil {
		log.Fatal(err)
	}
	defer master.Stop()
	host, port, _ := net.SplitHostPort(master.Addr)
	replica, err := redistest.Launch(dir+"/r", "--replicaof", host, port)
	if err != nil {
		log.Fatal(err)
	}
	defer replica.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: master.Addr, PoolSize: 128})
	defer rdb.Close()
	awaitReplica(ctx, rdb)
	replicaChecks(ctx, rdb)
	replicaDrain(ctx, rdb, master.Addr)
}

// awaitReplica waits until the master of rdb has its replica attached and
// in sync (WAIT 1 answers 1).
func awaitReplica(ctx context.Context, rdb *redis.Client) {
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(rdb.Info(ctx, "replication").Val(), "connected_slaves:1"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			log.Fatal("replicas: the replica did not connect")
		}
	}
	if n, err := rdb.Wait(ctx, 1, time.Second).Result(); err != nil || n != 1 {
		log.Fatalf("replicas: WAIT 1 answered %d, %v", n, err)
	}
}

// replicaChecks compares single-rule checks without and with a WAIT 1
// behind each admitting one, at 1 and 32 callers.
func replicaChecks(ctx context.Context, rdb *redis.Client) {
	none := newLimiter(rdb, throttle.Options{})
	defer none.Close()
	acked := newLimiter(rdb, throttle.Options{WaitReplicas: 1, WaitTimeout: time.Second})
	defer acked.Close()
	for _, callers := range []int{1, 32} {
		m := interleave(ctx, rdb, []scenario{
			{"no wait", callers, sluiceOne(none)},
			{"WAIT 1", callers, sluiceOne(acked)},
		})
		r := m.ratio("WAIT 1", "no wait")
		extra := 1e6/m.med("WAIT 1") - 1e6/m.med("no wait") // µs per check, one caller's view
		fmt.Printf("  %2d callers: no wait %.0f/s, WAIT 1 %.0f/s (Redis %.1f vs %.1f µs/check)\n", callers, m.med("no wait"), m.med("WAIT 1"),
			us(serverCPU["no wait"]), us(serverCPU["WAIT 1"]))
		what := fmt.Sprintf("+%.0f µs per check", extra)
		if callers > 1 {
			what = fmt.Sprintf("+%.1f µs per check of throughput", extra)
		}
		add(row{"replicas", fmt.Sprintf("single-rule check, WAIT 1 vs no wait, %d caller(s), master + 1 replica", callers),
			fmt.Sprintf("%.0f vs %.0f calls/s", m.med("WAIT 1"), m.med("no wait")), f2(r), "(cost: " + what + ")", ""})
		add(row{"replicas", fmt.Sprintf("… Redis CPU per check on the master, %d caller(s): WAIT 1 / no wait", callers),
			fmt.Sprintf("%.1f / %.1f µs", us(serverCPU["WAIT 1"]), us(serverCPU["no wait"])), "", "(INFO cpu delta / checks)", ""})
	}
}

// replicaDrain compares, per delivered task, a worker draining the same
// backlog from the master at addr without and with
// SLUICE_REDIS_WAIT_REPLICAS=1, interleaved.
func replicaDrain(ctx context.Context, rdb *redis.Client, addr string) {
	n := 2000
	if *quick {
		n = 600
	}
	client := asynq.NewClientFromRedisClient(rdb)
	rates, cpus := map[string][]float64{}, map[string][]float64{}
	var ratios []float64
	peers := []string{"no wait", "WAIT 1"}
	for r := 0; r < *rounds; r++ {
		order := peers
		if r%2 == 1 {
			order = []string{peers[1], peers[0]}
		}
		got := map[string]float64{}
		for _, p := range order {
			if err := rdb.FlushAll(ctx).Err(); err != nil {
				log.Fatal(err)
			}
			q := queueName("wait")
			extra := map[string]string{"SLUICE_CONCURRENCY": "10"}
			if p == "WAIT 1" {
				extra["SLUICE_REDIS_WAIT_REPLICAS"] = "1"
			}
			cfg := workerConfig(addr, q, overheadRules, extra)
			ns := make([]tasks.Notification, n)
			for i := range ns {
				ns[i] = tasks.NewSMS("bench", fmt.Sprintf("+1417%07d", r*n+i), "bench "+strconv.Itoa(i))
			}
			enqueueAll(ctx, client, q, ns)
			rec := newRecorder(n)
			cpu0 := redisCPU(ctx, rdb)
			_, stop := startWorker(addr, cfg, rec)
			<-rec.done
			stop()
			got[p] = rec.rate()
			rates[p] = append(rates[p], got[p])
			cpus[p] = append(cpus[p], (redisCPU(ctx, rdb)-cpu0).Seconds()/float64(n))
		}
		ratios = append(ratios, got["WAIT 1"]/got["no wait"])
	}
	a, b := median(rates["WAIT 1"]), median(rates["no wait"])
	fmt.Printf("  worker, concurrency 10: no wait %.0f tasks/s, WAIT 1 %.0f tasks/s; Redis CPU per task %.0f vs %.0f µs\n", b, a, 1e6*median(cpus["no wait"]), 1e6*median(cpus["WAIT 1"]))
	add(row{"replicas", "worker drain, concurrency 10, WAIT 1 vs no wait, master + 1 replica", fmt.Sprintf("%.0f vs %.0f tasks/s", a, b), f2(median(ratios)),
		fmt.Sprintf("(cost: +%.0f µs per delivered task)", 1e6/a-1e6/b), ""})
	add(row{"replicas", "… Redis CPU per delivered task on the master: WAIT 1 / no wait", fmt.Sprintf("%.0f / %.0f µs", 1e6*median(cpus["WAIT 1"]), 1e6*median(cpus["no wait"])), "", "(INFO cpu delta / tasks)", ""})
}
