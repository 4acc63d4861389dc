package main

import (
	"context"
	"fmt"
	"log"
	"sort"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
)

// The throttled backlog's row of issue 38: what Redis spends per delivered
// send when most sends are booked ahead (book → Asynq's retry set → its
// forwarder → dequeue → admit → wait in process → send → done), against a
// send admitted at once, in the same run, with the same in-process worker.
//
// Both drains are enqueued before the worker starts and measured from its
// start to the last send; the idle worker's own polls (measured for 2 s
// after each drain, per command) are taken out, by command, over the drain's
// length. The booked backlog puts bookedEach SMS on each of its recipients
// under bookedRule: the first goes at once, the others each a window later,
// through Asynq (the window is past MAX_INLINE_WAIT), so a booked send's
// own cost is (throttled total − the admitted sends' share) / booked sends.

// bookedRule's window lies past the default MAX_INLINE_WAIT (2 s), so a
// booked send goes back through Asynq instead of waiting in process.
const bookedRule = "sms:recipient=1/4s"

const bookedEach = 3

// bookedRun is one drain: Redis CPU and commands from the worker's start to
// the last send, the idle worker's share taken out.
type bookedRun struct {
	sends  int
	cpu    time.Duration      // Redis CPU, idle taken out
	stats  map[string]cmdStat // INFO commandstats, idle taken out
	drain  time.Duration      // worker start → last send
	checks float64            // limiter decisions
	reads  float64            // read events Redis served (round trips), idle taken out
}

// bookedCost: admitted (every recipient its own) and throttled (bookedEach
// per recipient) drains of the same number of sends, interleaved over the
// rounds.
func bookedCost(ctx context.Context, addr string) {
	recipients := 400
	if *quick {
		recipients = 200
	}
	n := recipients * bookedEach
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	defer rdb.Close()
	var adm, thr []bookedRun
	for r := 0; r < *rounds; r++ {
		admitted := make([]tasks.Notification, n)
		for i := range admitted {
			admitted[i] = tasks.NewSMS("bench", fmt.Sprintf("+1417%07d", r*n+i), "bench "+strconv.Itoa(i))
		}
		throttled := spread("bench", recipients, bookedEach, uint64(r+1))
		if r%2 == 0 {
			adm = append(adm, bookedDrain(ctx, rdb, addr, admitted))
			thr = append(thr, bookedDrain(ctx, rdb, addr, throttled))
		} else {
			thr = append(thr, bookedDrain(ctx, rdb, addr, throttled))
			adm = append(adm, bookedDrain(ctx, rdb, addr, admitted))
		}
		fmt.Printf("    round %d: admitted %.1f µs a send (%v, %.2f round trips), throttled %.1f µs a delivered send (%v, %.2f checks, %.2f round trips a send)\n", r+1,
			us(adm[r].cpu/time.Duration(n)), adm[r].drain.Round(time.Millisecond), adm[r].reads/float64(n),
			us(thr[r].cpu/time.Duration(n)), thr[r].drain.Round(time.Millisecond), thr[r].checks/float64(n), thr[r].reads/float64(n))
	}
	a := medianOf(adm, func(b bookedRun) float64 { return float64(b.cpu) / float64(b.sends) })
	t := medianOf(thr, func(b bookedRun) float64 { return float64(b.cpu) / float64(b.sends) })
	booked := n - recipients // the throttled sends that were booked
	own := (t*float64(n) - a*float64(recipients)) / float64(booked)
	ratios := make([]float64, len(adm))
	for i := range adm {
		ratios[i] = (float64(thr[i].cpu) / float64(n)) / (float64(adm[i].cpu) / float64(n))
	}
	ratio := median(ratios)
	add(row{"booked", fmt.Sprintf("admitted at once: Redis CPU per send (%d recipients, median of %d)", n, len(adm)), fmt.Sprintf("%.1f µs", a/1e3), "", "(baseline)", ""})
	add(row{"booked", fmt.Sprintf("throttled backlog, %d × %d under %s: per delivered send", recipients, bookedEach, bookedRule), fmt.Sprintf("%.1f µs", t/1e3), f2(ratio), "≤ 3× admitted", verdict(ratio <= 3)})
	add(row{"booked", "… per booked send, its own path (book, Asynq's retry, forward, dequeue, admit, done)", fmt.Sprintf("%.1f µs", own/1e3), f2(own / a), "(report)", ""})
	bookedBreakdown(adm, thr, n, booked)
}

// bookedBreakdown prints, per command, what the median rounds spent per
// admitted send and per booked send (the throttled drain's extra over its
// admitted share): where a booked send's cost goes.
func bookedBreakdown(adm, thr []bookedRun, n, booked int) {
	pick := func(rs []bookedRun) bookedRun {
		s := append([]bookedRun(nil), rs...)
		sort.Slice(s, func(i, j int) bool { return s[i].cpu < s[j].cpu })
		return s[len(s)/2]
	}
	a, t := pick(adm), pick(thr)
	names := map[string]bool{}
	for k := range a.stats {
		names[k] = true
	}
	for k := range t.stats {
		names[k] = true
	}
	var keys []string
	for k := range names {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return t.stats[keys[i]].usec > t.stats[keys[j]].usec })
	admittedShare := float64(n-booked) / float64(n) // the throttled drain's sends admitted at once
	fmt.Printf("    by command (median rounds; scripts' own commands are inside their script's time too):\n")
	fmt.Printf("    %-28s %18s %18s\n", "", "admitted send", "booked send")
	for _, k := range keys {
		as, ts := a.stats[k], t.stats[k]
		bc := (ts.calls - as.calls*admittedShare) / float64(booked)
		bu := (ts.usec - as.usec*admittedShare) / float64(booked)
		if k == "info" || k == "config|resetstat" || as.calls/float64(n) < 0.01 && bc < 0.01 {
			continue
		}
		fmt.Printf("    %-28s %6.2f × %7.2f µs %6.2f × %7.2f µs\n", k, as.calls/float64(n), as.usec/float64(n), bc, bu)
	}
}

// readEvents is INFO stats' total_reads_processed: the read events Redis
// served, about one per round trip a client makes.
func readEvents(ctx context.Context, rdb *redis.Client) int64 {
	info, err := rdb.Info(ctx, "stats").Result()
	if err != nil {
		log.Fatal(err)
	}
	v, _ := strconv.ParseInt(field(info, "total_reads_processed"), 10, 64)
	return v
}

// bookedDrain enqueues ns into a fresh queue, runs one in-process worker
// until every one is sent, then 2 s more on the empty queue to measure its
// idle cost, which it takes out.
func bookedDrain(ctx context.Context, rdb *redis.Client, addr string, ns []tasks.Notification) bookedRun {
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		log.Fatal(err)
	}
	q := queueName("booked")
	cfg := workerConfig(addr, q, bookedRule, map[string]string{"SLUICE_MAX_WAITERS": "1024"})
	enqueueAll(ctx, asynq.NewClientFromRedisClient(rdb), q, ns)
	rec := newRecorder(len(ns))
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		log.Fatal(err)
	}
	cpu0, reads0 := redisCPU(ctx, rdb), readEvents(ctx, rdb)
	var mon *monitor
	if *monitorOn {
		mon = startMonitor(addr)
	}
	start := time.Now()
	reg, stop := startWorker(addr, cfg, rec)
	select {
	case <-rec.done:
	case <-time.After(2 * time.Minute):
		log.Fatalf("booked: %d of %d sent in 2 minutes", len(rec.sends()), len(ns))
	}
	s := rec.sends()
	drain := s[len(s)-1].at.Sub(start)
	busy, busyStats, busyAt := redisCPU(ctx, rdb)-cpu0, commandStats(ctx, rdb), time.Now()
	busyReads := readEvents(ctx, rdb) - reads0
	if mon != nil {
		mon.print(len(ns))
	}
	time.Sleep(2 * time.Second)
	idle, idleStats := redisCPU(ctx, rdb)-cpu0-busy, commandStats(ctx, rdb)
	idleReads := readEvents(ctx, rdb) - reads0 - busyReads
	idleFor := time.Since(busyAt)
	checks := decisions(reg)
	stop()
	scale := float64(busyAt.Sub(start)) / float64(idleFor) // the drain's length in idle periods
	out := bookedRun{sends: len(ns), drain: drain, checks: checks, stats: map[string]cmdStat{}}
	out.cpu = busy - time.Duration(float64(idle)*scale)
	out.reads = float64(busyReads) - float64(idleReads)*scale
	for k, b := range busyStats {
		i := idleStats[k]
		out.stats[k] = cmdStat{calls: b.calls - (i.calls-b.calls)*scale, usec: b.usec - (i.usec-b.usec)*scale}
	}
	return out
}
