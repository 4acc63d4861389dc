package main

import (
	"context"
	"fmt"
	"image/color"
	"log"
	"os"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/sluicehq/sluice/throttle"
)

// boundaryTraffic is the lesson's scenario at small scale: limit 10 per 1 s,
// 20 attempts in the last 50 ms before each second boundary and 20 in the
// first 50 ms after it.
func boundaryTraffic(start time.Time) []time.Time {
	var out []time.Time
	for _, b := range []int{1, 2, 3} {
		edge := start.Add(time.Duration(b) * time.Second)
		for i := 0; i < 20; i++ {
			out = append(out, edge.Add(-50*time.Millisecond+time.Duration(i)*2500*time.Microsecond))
		}
		for i := 0; i < 20; i++ {
			out = append(out, edge.Add(time.Duration(i)*2500*time.Microsecond))
		}
	}
	return out
}

// inTrailingWindow returns, for each admission, the admissions in the second up to it.
func inTrailingWindow(admitted []time.Time, start time.Time, window time.Duration) plotter.XYs {
	var pts plotter.XYs
	for i, t := range admitted {
		n := 0
		for j := 0; j <= i; j++ {
			if !admitted[j].Before(t.Add(-window)) {
				n++
			}
		}
		pts = append(pts, plotter.XY{X: t.Sub(start).Seconds(), Y: float64(n)})
	}
	return pts
}

func figures(ctx context.Context, rdb *redis.Client) {
	if err := os.MkdirAll(*docs, 0o755); err != nil {
		log.Fatal(err)
	}
	start := time.Now().Truncate(time.Hour).Add(time.Hour) // whole-second aligned
	rule := throttle.Rule{Limit: 10, Window: time.Second}
	var now time.Time
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte("bench-secret-0123456789"), Now: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	var fixed, sliding []time.Time
	for i, t := range boundaryTraffic(start) {
		now = t
		// A fixed window as the lesson describes it: INCR a per-second counter.
		key := "fixed:" + strconv.FormatInt(t.Unix(), 10)
		n, err := rdb.Incr(ctx, key).Result()
		if err != nil {
			log.Fatal(err)
		}
		rdb.Expire(ctx, key, 2*time.Second)
		if n <= int64(rule.Limit) {
			fixed = append(fixed, t)
		}
		d, err := lim.Allow(ctx, "figure", "a"+strconv.Itoa(i), throttle.Limit{Scope: "sms:recipient", Subject: "figure", Rule: rule})
		if err != nil {
			log.Fatal(err)
		}
		if d.Allowed {
			sliding = append(sliding, t)
		}
	}
	p := plot.New()
	p.Title.Text = "Admissions in the trailing 1 s, limit 10/s, bursts at each second boundary"
	p.X.Label.Text = "time (s)"
	p.Y.Label.Text = "admissions in [t − 1 s, t]"
	fl, _ := plotter.NewScatter(inTrailingWindow(fixed, start, time.Second))
	fl.Color = color.RGBA{R: 200, A: 255}
	sl, _ := plotter.NewScatter(inTrailingWindow(sliding, start, time.Second))
	sl.Color = color.RGBA{B: 200, A: 255}
	sl.Shape = nil
	slLine, _ := plotter.NewLine(inTrailingWindow(sliding, start, time.Second))
	slLine.Color = sl.Color
	limitLine, _ := plotter.NewLine(plotter.XYs{{X: 0.8, Y: 10}, {X: 3.2, Y: 10}})
	limitLine.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
	p.Add(fl, slLine, limitLine)
	p.Legend.Add(fmt.Sprintf("fixed window (%d admitted)", len(fixed)), fl)
	p.Legend.Add(fmt.Sprintf("Sluice sliding log (%d admitted)", len(sliding)), slLine)
	p.Legend.Add("limit", limitLine)
	p.Legend.Top = true
	if err := p.Save(8*vg.Inch, 4*vg.Inch, docPath("boundary.png")); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("  wrote %s: fixed window admitted %d, sliding log %d of %d attempts\n", docPath("boundary.png"), len(fixed), len(sliding), len(boundaryTraffic(start)))

	if len(backlogResults) == 0 {
		return
	}
	q := plot.New()
	q.Title.Text = "Limiter calls per delivered message (10 per 2 s, two workers)"
	q.X.Label.Text = "backlog (notifications to one recipient)"
	q.Y.Label.Text = "limiter calls per delivered message"
	for i, policy := range []string{"naive", "booked"} {
		var pts plotter.XYs
		for _, r := range backlogResults {
			if r.policy == policy && r.limit == 10 {
				pts = append(pts, plotter.XY{X: float64(r.n), Y: r.callsPerMsg})
			}
		}
		if len(pts) == 0 {
			continue
		}
		l, s, _ := plotter.NewLinePoints(pts)
		c := []color.Color{color.RGBA{R: 200, A: 255}, color.RGBA{B: 200, A: 255}}[i]
		l.Color, s.Color = c, c
		q.Add(l, s)
		q.Legend.Add(policy, l, s)
	}
	q.Legend.Top = true
	q.Legend.Left = true
	if err := q.Save(8*vg.Inch, 4*vg.Inch, docPath("backlog-calls.png")); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("  wrote %s\n", docPath("backlog-calls.png"))
}
