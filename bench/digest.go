package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
)

// The digest section (issue 37): a burst of deferred notifications with a
// digest rule against the same burst without one, the real binary (one
// worker, log sender): 200 recipients × 10 SMS of category alerts, queued
// before the worker starts, under sms:recipient=1/1s. Without a digest
// each is checked, booked, woken, admitted, sent and recorded done, 10 s of
// slots per recipient; with sms.alerts:digest=max:50 the first goes at once
// and the other 9 join one digest sent at the next slot. Redis CPU, commands
// (scripts' own included) and script calls per delivered item, from the
// worker's start until every item is out.

const digestRecipients, digestItems = 200, 10

type digestSample struct {
	cpu            time.Duration
	cmds, scripts  float64
	sends, elapsed float64
}

func digestBurst(ctx context.Context, bin, dir string, digested bool) digestSample {
	srv, err := redistest.Launch(must(os.MkdirTemp(dir, "redis-")))
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	defer rdb.Close()
	var ns []tasks.Notification
	for i := 0; i < digestItems; i++ {
		for r := 0; r < digestRecipients; r++ {
			n := tasks.NewSMS("acme", fmt.Sprintf("+1425%07d", r), fmt.Sprintf("alert %d", i))
			n.Category = "alerts"
			ns = append(ns, n)
		}
	}
	enqueueRooms(ctx, rdb, ns, route(tasks.LaneStandard), true)
	rules := "sms:recipient=1/1s,sms:tenant=1000000/1h"
	want := len(ns)
	if digested {
		rules += ",sms.alerts:digest=max:50"
		want = 2 * digestRecipients // the first of each, and one digest of the other 9
	}
	env := baseEnv(srv.Addr, rules)
	env["SLUICE_SMS_SENDER"] = "log"
	c0 := readStats(ctx, rdb)
	start := time.Now()
	w := startBin(bin, env)
	defer w.stop()
	w.await(want, 3*time.Minute, "digest")
	c1 := readStats(ctx, rdb)
	items := float64(len(ns))
	return digestSample{cpu: (c1.cpu - c0.cpu) / time.Duration(len(ns)), cmds: (c1.cmds - c0.cmds) / items,
		scripts: (c1.scripts - c0.scripts) / items, sends: float64(want), elapsed: time.Since(start).Seconds()}
}

func digestSection(ctx context.Context) {
	dir, err := os.MkdirTemp("", "sluice-digest-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := buildBinary(dir)
	var with, without []digestSample
	for r := range max(2, *rounds) {
		// A B, then B A: a drift in the machine's load falls on both alike.
		for i := range 2 {
			if (i+r)%2 == 0 {
				with = append(with, digestBurst(ctx, bin, dir, true))
			} else {
				without = append(without, digestBurst(ctx, bin, dir, false))
			}
		}
	}
	for _, s := range append(with, without...) {
		fmt.Printf("    %.0f sends in %.1f s: %v Redis CPU, %.1f commands, %.2f scripts per item\n", s.sends, s.elapsed, s.cpu, s.cmds, s.scripts)
	}
	cpu := func(s digestSample) float64 { return float64(s.cpu) / 1e3 }
	a, b := medianOf(with, cpu), medianOf(without, cpu)
	add(row{"digest", fmt.Sprintf("%d×%d deferred SMS: Redis CPU per delivered item, digest vs none", digestRecipients, digestItems),
		fmt.Sprintf("%.1f vs %.1f µs", a, b), f2(a / b), "< 1× (cheaper per item)", verdict(a < b)})
	cmds := func(s digestSample) float64 { return s.cmds }
	scr := func(s digestSample) float64 { return s.scripts }
	add(row{"digest", "commands (scripts' own included) / script calls per item, digest vs none",
		fmt.Sprintf("%.1f / %.2f vs %.1f / %.2f", medianOf(with, cmds), medianOf(with, scr), medianOf(without, cmds), medianOf(without, scr)), f2(medianOf(with, cmds) / medianOf(without, cmds)), "(report)", ""})
}
