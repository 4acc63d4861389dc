package dashboard

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
)

// The chart's geometry, in SVG user units.
const (
	chartW, chartH          = 720, 250
	chartLeft, chartRight   = 48, 150
	chartTop, chartBottom   = 40, 36
	chartPlotW              = chartW - chartLeft - chartRight
	chartPlotH              = chartH - chartTop - chartBottom
	chartBar, chartLine     = "#7fa7d6", "#0b3a70"
	chartLimit, chartBooked = "#b3261e", "#b07800"
	chartMuted, chartGrid   = "#595959", "#d9d9d9"
	chartNotKept            = "#efefef"
)

// Title names the chart.
func (c uiChart) Title() string {
	return strings.ToUpper(c.Channel) + " sends, last hour"
}

// Summary says in words what the chart shows (its alt text).
func (c uiChart) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d sent in the last hour, at most %d in one minute; the %s window holds %d of %d",
		strings.ToUpper(c.Channel), c.Total, c.Peak, c.Rule, c.Used, c.Rule.Limit)
	if c.Booked > 0 {
		fmt.Fprintf(&b, " and %d booked ahead", c.Booked)
	}
	if c.Rule.Window < uiChartSpan {
		fmt.Fprintf(&b, "; it keeps only its last %s", c.Rule.WindowString())
	}
	return b.String() + "."
}

// niceCeil rounds x up to a round number: 1, 2, 2.5, 4, 5 or 8 times a
// power of ten (halves of which are round too).
func niceCeil(x float64) float64 {
	if x <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 2.5, 4, 5, 8, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

func num(x float64) string { return strconv.FormatFloat(x, 'f', -1, 64) }

// drawChart draws c as a standalone SVG: light bars for the sends of each
// minute (left scale), and on the right scale a dark step line for how the
// window of c.Rule filled (the sends that count in it now, as they were
// made) up to its dashed limit, with the booked slots on top at the end.
// The span before the window began is greyed out. Presentation attributes
// only: no style element, no script.
func drawChart(c uiChart) []byte {
	var b bytes.Buffer
	esc := html.EscapeString
	n := len(c.Counts)
	left := niceCeil(float64(c.Peak) * 1.1)
	right := niceCeil(float64(max(c.Rule.Limit, c.Used+c.Booked)) * 1.05)
	yL := func(v float64) float64 { return chartTop + chartPlotH - v/left*chartPlotH }
	yR := func(v float64) float64 { return chartTop + chartPlotH - v/right*chartPlotH }
	x := func(i int) float64 { return chartLeft + float64(i)*chartPlotW/float64(max(1, n)) }
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-labelledby="t d" font-family="system-ui, sans-serif" font-size="12">`,
		chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<title id="t">%s</title><desc id="d">%s</desc>`, esc(c.Title()), esc(c.Summary()))
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`, chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="18" font-size="14" font-weight="600" fill="#1a1a1a">%s</text>`, chartLeft, esc(c.Title()))
	// The span before the window began: its sends no longer count.
	first := n
	for i, v := range c.InWindow {
		if v >= 0 {
			first = i
			break
		}
	}
	if first > 0 && n > 0 {
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`, chartLeft, chartTop, x(first)-chartLeft, chartPlotH, chartNotKept)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="%s">before the %s window</text>`,
			(chartLeft+x(first))/2, chartTop+16, chartMuted, esc(c.Rule.String()))
	}
	// Scales: sends per minute on the left, sends in the window on the right.
	for _, f := range []float64{0, 0.5, 1} {
		yy := yL(f * left)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s"/>`, chartLeft, chartLeft+chartPlotW, yy, yy, chartGrid)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" fill="%s">%s</text>`, chartLeft-6, yy+4, chartMuted, num(f*left))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" fill="%s">%s</text>`, chartLeft+chartPlotW+6, yy+4, chartLine, num(f*right))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="%s">per minute</text>`, 4, chartTop-8, chartMuted)
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="%s">in the window</text>`, chartLeft+chartPlotW+6, chartTop-8, chartLine)
	// Bars: sends per minute.
	barW := float64(chartPlotW)/float64(max(1, n)) - 2
	for i, v := range c.Counts {
		if v == 0 {
			continue
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%d sent %s</title></rect>`,
			x(i)+1, yL(float64(v)), max(1, barW), yL(0)-yL(float64(v)), chartBar, v, esc(minuteLabel(n-1-i)))
	}
	// The limit of the window.
	ly := yR(float64(c.Rule.Limit))
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="2" stroke-dasharray="6 4"/>`,
		chartLeft, chartLeft+chartPlotW, ly, ly, chartLimit)
	fmt.Fprintf(&b, `<text x="%d" y="%.1f" fill="%s" font-weight="600">limit %s</text>`, chartLeft+chartPlotW+40, ly+4, chartLimit, esc(c.Rule.String()))
	// How the window filled: a step line over the minutes it spans.
	if first < n {
		var pts []string
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(first), yR(0)))
		for i := first; i < n; i++ {
			v := float64(c.InWindow[i])
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), yR(v)), fmt.Sprintf("%.1f,%.1f", x(i+1), yR(v)))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2.5"/>`, strings.Join(pts, " "), chartLine)
		end := x(n)
		if c.Booked > 0 {
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="5"><title>%d booked ahead</title></line>`,
				end, end, yR(float64(c.Used)), yR(float64(c.Used+c.Booked)), chartBooked, c.Booked)
		}
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`, end, yR(float64(c.Used)), chartLine)
	}
	// X axis: minutes ago.
	for _, ago := range []int{60, 45, 30, 15, 0} {
		if ago > n {
			continue
		}
		px, label, anchor := x(n-ago), fmt.Sprintf("−%dm", ago), "middle"
		if ago == 0 {
			label, anchor = "now "+c.Now.UTC().Format("15:04")+" UTC", "end"
		}
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s"/>`, px, px, chartTop+chartPlotH, chartTop+chartPlotH+4, chartMuted)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="%s" fill="%s">%s</text>`, px, chartTop+chartPlotH+18, anchor, chartMuted, esc(label))
	}
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#1a1a1a"/>`, chartLeft, chartLeft+chartPlotW, yL(0), yL(0))
	legend := fmt.Sprintf("%d sent in the hour · window %d / %d", c.Total, c.Used, c.Rule.Limit)
	if c.Booked > 0 {
		legend += fmt.Sprintf(" + %d booked", c.Booked)
	}
	fmt.Fprintf(&b, `<text x="%d" y="18" text-anchor="end" fill="%s">%s</text>`, chartLeft+chartPlotW, chartMuted, esc(legend))
	b.WriteString(`</svg>`)
	return b.Bytes()
}

func minuteLabel(ago int) string {
	if ago == 0 {
		return "in the last minute"
	}
	return fmt.Sprintf("%d–%d minutes ago", ago, ago+1)
}
