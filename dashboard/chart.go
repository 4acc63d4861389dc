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
	d := newChartCanvas(c)
	d.header()
	d.notKept()
	d.scales()
	d.bars()
	d.limit()
	d.windowFill()
	d.xAxis()
	d.legend()
	d.b.WriteString(`</svg>`)
	return d.b.Bytes()
}

// chartCanvas is a chart being drawn: its data, its scales and the SVG so
// far. Each method draws one part, in the order drawChart calls them.
type chartCanvas struct {
	b     bytes.Buffer
	c     uiChart
	n     int     // minutes shown
	left  float64 // top of the left scale, sends per minute
	right float64 // top of the right scale, sends in the window
	first int     // the first minute inside the window; n when none is
}

// newChartCanvas sets the scales of c and finds the minute its window
// begins.
func newChartCanvas(c uiChart) *chartCanvas {
	d := &chartCanvas{c: c, n: len(c.Counts)}
	d.left = niceCeil(float64(c.Peak) * 1.1)
	d.right = niceCeil(float64(max(c.Rule.Limit, c.Used+c.Booked)) * 1.05)
	d.first = d.n
	for i, v := range c.InWindow {
		if v >= 0 {
			d.first = i
			break
		}
	}
	return d
}

// yL is the height of v on the left scale.
func (d *chartCanvas) yL(v float64) float64 { return chartTop + chartPlotH - v/d.left*chartPlotH }

// yR is the height of v on the right scale.
func (d *chartCanvas) yR(v float64) float64 { return chartTop + chartPlotH - v/d.right*chartPlotH }

// x is where minute i begins.
func (d *chartCanvas) x(i int) float64 { return chartLeft + float64(i)*chartPlotW/float64(max(1, d.n)) }

// header opens the SVG: its title and description, the background and the
// visible title.
func (d *chartCanvas) header() {
	fmt.Fprintf(&d.b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-labelledby="t d" font-family="system-ui, sans-serif" font-size="12">`,
		chartW, chartH, chartW, chartH)
	fmt.Fprintf(&d.b, `<title id="t">%s</title><desc id="d">%s</desc>`, html.EscapeString(d.c.Title()), html.EscapeString(d.c.Summary()))
	fmt.Fprintf(&d.b, `<rect width="%d" height="%d" fill="#ffffff"/>`, chartW, chartH)
	fmt.Fprintf(&d.b, `<text x="%d" y="18" font-size="14" font-weight="600" fill="#1a1a1a">%s</text>`, chartLeft, html.EscapeString(d.c.Title()))
}

// notKept greys out the span before the window began: its sends no longer
// count.
func (d *chartCanvas) notKept() {
	if d.first > 0 && d.n > 0 {
		fmt.Fprintf(&d.b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`, chartLeft, chartTop, d.x(d.first)-chartLeft, chartPlotH, chartNotKept)
		fmt.Fprintf(&d.b, `<text x="%.1f" y="%d" text-anchor="middle" fill="%s">before the %s window</text>`,
			(chartLeft+d.x(d.first))/2, chartTop+16, chartMuted, html.EscapeString(d.c.Rule.String()))
	}
}

// scales draws the grid and both scales: sends per minute on the left,
// sends in the window on the right.
func (d *chartCanvas) scales() {
	for _, f := range []float64{0, 0.5, 1} {
		yy := d.yL(f * d.left)
		fmt.Fprintf(&d.b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s"/>`, chartLeft, chartLeft+chartPlotW, yy, yy, chartGrid)
		fmt.Fprintf(&d.b, `<text x="%d" y="%.1f" text-anchor="end" fill="%s">%s</text>`, chartLeft-6, yy+4, chartMuted, num(f*d.left))
		fmt.Fprintf(&d.b, `<text x="%d" y="%.1f" fill="%s">%s</text>`, chartLeft+chartPlotW+6, yy+4, chartLine, num(f*d.right))
	}
	fmt.Fprintf(&d.b, `<text x="%d" y="%d" fill="%s">per minute</text>`, 4, chartTop-8, chartMuted)
	fmt.Fprintf(&d.b, `<text x="%d" y="%d" fill="%s">in the window</text>`, chartLeft+chartPlotW+6, chartTop-8, chartLine)
}

// bars draws a bar for the sends of each minute that had any.
func (d *chartCanvas) bars() {
	barW := float64(chartPlotW)/float64(max(1, d.n)) - 2
	for i, v := range d.c.Counts {
		if v == 0 {
			continue
		}
		fmt.Fprintf(&d.b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%d sent %s</title></rect>`,
			d.x(i)+1, d.yL(float64(v)), max(1, barW), d.yL(0)-d.yL(float64(v)), chartBar, v, html.EscapeString(minuteLabel(d.n-1-i)))
	}
}

// limit draws the window's limit as a dashed line, labelled.
func (d *chartCanvas) limit() {
	ly := d.yR(float64(d.c.Rule.Limit))
	fmt.Fprintf(&d.b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="2" stroke-dasharray="6 4"/>`,
		chartLeft, chartLeft+chartPlotW, ly, ly, chartLimit)
	fmt.Fprintf(&d.b, `<text x="%d" y="%.1f" fill="%s" font-weight="600">limit %s</text>`, chartLeft+chartPlotW+40, ly+4, chartLimit, html.EscapeString(d.c.Rule.String()))
}

// windowFill draws how the window filled, a step line over the minutes it
// spans, ending in a dot at what it holds now with the booked slots above.
func (d *chartCanvas) windowFill() {
	if d.first >= d.n {
		return
	}
	var pts []string
	pts = append(pts, fmt.Sprintf("%.1f,%.1f", d.x(d.first), d.yR(0)))
	for i := d.first; i < d.n; i++ {
		v := float64(d.c.InWindow[i])
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", d.x(i), d.yR(v)), fmt.Sprintf("%.1f,%.1f", d.x(i+1), d.yR(v)))
	}
	fmt.Fprintf(&d.b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2.5"/>`, strings.Join(pts, " "), chartLine)
	end := d.x(d.n)
	if d.c.Booked > 0 {
		fmt.Fprintf(&d.b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="5"><title>%d booked ahead</title></line>`,
			end, end, d.yR(float64(d.c.Used)), d.yR(float64(d.c.Used+d.c.Booked)), chartBooked, d.c.Booked)
	}
	fmt.Fprintf(&d.b, `<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"/>`, end, d.yR(float64(d.c.Used)), chartLine)
}

// xAxis draws the ticks of minutes ago, then the axis itself.
func (d *chartCanvas) xAxis() {
	for _, ago := range []int{60, 45, 30, 15, 0} {
		if ago > d.n {
			continue
		}
		px, label, anchor := d.x(d.n-ago), fmt.Sprintf("−%dm", ago), "middle"
		if ago == 0 {
			label, anchor = "now "+d.c.Now.UTC().Format("15:04")+" UTC", "end"
		}
		fmt.Fprintf(&d.b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s"/>`, px, px, chartTop+chartPlotH, chartTop+chartPlotH+4, chartMuted)
		fmt.Fprintf(&d.b, `<text x="%.1f" y="%d" text-anchor="%s" fill="%s">%s</text>`, px, chartTop+chartPlotH+18, anchor, chartMuted, html.EscapeString(label))
	}
	fmt.Fprintf(&d.b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#1a1a1a"/>`, chartLeft, chartLeft+chartPlotW, d.yL(0), d.yL(0))
}

// legend writes the totals at the top right.
func (d *chartCanvas) legend() {
	legend := fmt.Sprintf("%d sent in the hour · window %d / %d", d.c.Total, d.c.Used, d.c.Rule.Limit)
	if d.c.Booked > 0 {
		legend += fmt.Sprintf(" + %d booked", d.c.Booked)
	}
	fmt.Fprintf(&d.b, `<text x="%d" y="18" text-anchor="end" fill="%s">%s</text>`, chartLeft+chartPlotW, chartMuted, html.EscapeString(legend))
}

func minuteLabel(ago int) string {
	if ago == 0 {
		return "in the last minute"
	}
	return fmt.Sprintf("%d–%d minutes ago", ago, ago+1)
}
