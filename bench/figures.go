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

// boundaryTraffic is the textbook boundary scenario at small scale: limit 10 per 1 s,
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
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte(secret), Now: func() time.Time { return now }})
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	var fixed, sliding []time.Time
	for i, t := range boundaryTraffic(start) {
		now = t
		// A fixed window as the textbook describes it: INCR a per-second counter.
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

	checkFigure()
	backlogFigure()
}

var palette = []color.Color{color.RGBA{B: 200, A: 255}, color.RGBA{G: 150, A: 255}, color.RGBA{R: 200, A: 255}, color.RGBA{A: 255}}

// checkFigure: single-rule checks/s by callers, per peer (the check section).
func checkFigure() {
	if len(checkCurve) == 0 {
		return
	}
	p := plot.New()
	p.Title.Text = "Single-rule checks per second by concurrent callers (10,000 recipients, same run)"
	p.X.Label.Text = "concurrent callers"
	p.Y.Label.Text = "checks / s (median of interleaved rounds)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.ConstantTicks([]plot.Tick{{Value: 1, Label: "1"}, {Value: 4, Label: "4"}, {Value: 16, Label: "16"}, {Value: 32, Label: "32"}, {Value: 64, Label: "64"}})
	for i, name := range curvePeers {
		var pts plotter.XYs
		for _, c := range []int{1, 4, 16, 32, 64} {
			if v, ok := checkCurve[name][c]; ok {
				pts = append(pts, plotter.XY{X: float64(c), Y: v})
			}
		}
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			log.Fatal(err)
		}
		l.Color, sc.Color = palette[i], palette[i]
		if name == "floor" {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		}
		p.Add(l, sc)
		p.Legend.Add(name, l, sc)
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Y.Min, p.Y.Max = 0, p.Y.Max*1.45 // room for the legend
	if err := p.Save(8*vg.Inch, 4.5*vg.Inch, docPath("check-callers.png")); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("  wrote %s\n", docPath("check-callers.png"))
}

// backlogFigure: drain time of the one-recipient backlogs by window, against
// the exact scheduler's (with and without the slack).
func backlogFigure() {
	var got, ideal, idealS plotter.XYs
	for _, r := range backlogResults {
		if r.policy != "booked" || r.window == 0 {
			continue
		}
		x := r.window.Seconds()
		got = append(got, plotter.XY{X: x, Y: r.drain.Seconds()})
		ideal = append(ideal, plotter.XY{X: x, Y: r.ideal.Seconds()})
		idealS = append(idealS, plotter.XY{X: x, Y: r.idealS.Seconds()})
	}
	if len(got) == 0 {
		return
	}
	p := plot.New()
	p.Title.Text = "Backlog of 60 SMS to one recipient, limit 10 per window, two workers"
	p.X.Label.Text = "window (s)"
	p.Y.Label.Text = "drain: first enqueue to last send (s)"
	for i, s := range []struct {
		name string
		pts  plotter.XYs
	}{{"Sluice (measured)", got}, {"exact scheduler, window + 100 ms slack", idealS}, {"exact scheduler (ideal)", ideal}} {
		l, sc, err := plotter.NewLinePoints(s.pts)
		if err != nil {
			log.Fatal(err)
		}
		l.Color, sc.Color = palette[i], palette[i]
		if i > 0 {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(4)}
		}
		p.Add(l, sc)
		p.Legend.Add(s.name, l, sc)
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Y.Min, p.Y.Max = 0, p.Y.Max*1.3 // room for the legend
	if err := p.Save(8*vg.Inch, 4.5*vg.Inch, docPath("backlog-drain.png")); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("  wrote %s\n", docPath("backlog-drain.png"))
}
