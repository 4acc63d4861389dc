package throttle_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// The distinct-count rule's cost per check, as a ratio to the sliding log's
// in the same run: each round makes one check of a tenant-wide log rule and
// one of a tenant-wide distinct rule (a recipient among 100,000: new at
// first, repeats later), interleaved so that both meet the same machine.
// distinct/log is the figure docs/BENCHMARKS.md quotes.
//
//	go test -run '^$' -bench DistinctVsLog ./throttle/
func BenchmarkDistinctVsLog(b *testing.B) {
	bb := setup(b, false)
	logRule := throttle.Rule{Limit: 1_000_000, Window: time.Minute}
	dstRule := throttle.Rule{Limit: 1_000_000, Window: time.Minute, Distinct: true}
	var logNS, dstNS time.Duration
	i := 0
	for b.Loop() {
		i++
		to := "+1415" + strconv.Itoa(5_000_000+i%100_000)
		t0 := time.Now()
		if _, err := bb.lim.Reserve(ctx, bb.group, "l"+strconv.Itoa(i), throttle.ReserveOptions{Book: true},
			throttle.Limit{Scope: "whatsapp:tenant", Rule: logRule}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := bb.lim.Reserve(ctx, bb.group, "d"+strconv.Itoa(i), throttle.ReserveOptions{Book: true},
			throttle.Limit{Scope: "whatsapp:tenant", Distinct: to, Rule: dstRule}); err != nil {
			b.Fatal(err)
		}
		logNS += t1.Sub(t0)
		dstNS += time.Since(t1)
	}
	b.ReportMetric(float64(logNS.Nanoseconds())/float64(b.N), "log-ns/check")
	b.ReportMetric(float64(dstNS.Nanoseconds())/float64(b.N), "distinct-ns/check")
	b.ReportMetric(float64(dstNS)/float64(logNS), "distinct/log")
}

// Memory per entry of a full distinct key next to a full log key of the
// same size: MEMORY USAGE of each, divided by its entries. A distinct key
// holds one entry per subject counted (a 22-byte keyed hash and its last
// send), a log key one per send (a 36-byte id here, as without
// SLUICE_COMPACT_MEMBERS).
//
//	go test -run '^$' -bench DistinctMemory ./throttle/
func BenchmarkDistinctMemory(b *testing.B) {
	for _, n := range []int{100, 250, 10_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			bb := setup(b, true)
			logLim := throttle.Limit{Scope: "whatsapp:tenant", Rule: throttle.Rule{Limit: n, Window: time.Hour}}
			dst := throttle.Rule{Limit: n, Window: time.Hour, Distinct: true}
			for j := range n {
				bb.clock.Add(time.Millisecond)
				if _, err := bb.lim.Reserve(ctx, bb.group, member(), throttle.ReserveOptions{}, logLim); err != nil {
					b.Fatal(err)
				}
				if _, err := bb.lim.Reserve(ctx, bb.group, member(), throttle.ReserveOptions{},
					throttle.Limit{Scope: "whatsapp:tenant", Distinct: "+1415" + strconv.Itoa(5_000_000+j), Rule: dst}); err != nil {
					b.Fatal(err)
				}
			}
			dstKey := bb.key(b, throttle.Limit{Scope: "whatsapp:tenant", Rule: dst})
			var logBytes, dstBytes int64
			for b.Loop() {
				var err error
				if logBytes, err = bb.client.MemoryUsage(ctx, bb.key(b, logLim)).Result(); err != nil {
					b.Fatal(err)
				}
				if dstBytes, err = bb.client.MemoryUsage(ctx, dstKey).Result(); err != nil {
					b.Fatal(err)
				}
			}
			if c := bb.client.ZCard(ctx, dstKey).Val(); c != int64(n) {
				b.Fatalf("the distinct key holds %d entries, want %d", c, n)
			}
			b.ReportMetric(float64(logBytes)/float64(n), "log-B/entry")
			b.ReportMetric(float64(dstBytes)/float64(n), "distinct-B/entry")
		})
	}
}
