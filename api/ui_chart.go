package api

import (
	"bytes"
	"fmt"
	"html"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// The chart's geometry, in SVG user units.
const (
	chartW, chartH               = 720, 240
	chartLeft, chartRight        = 44, 150
	chartTop, chartBottom        = 34, 36
	chartPlotW                   = chartW - chartLeft - chartRight
	chartPlotH                   = chartH - chartTop - chartBottom
	chartBarColor, chartBarFull  = "#1f5fa8", "#0b3a70"
	chartLimitColor, chartMuted  = "#b3261e", "#595959"
	chartGridColor, chartNotKept = "#d9d9d9", "#efefef"
)

// perMinute is the rate a rule allows on average, per minute.
func perMinute(r throttle.Rule) float64 {
	return float64(r.Limit) * float64(time.Minute) / float64(r.Window)
}

// Title names the chart.
func (c uiChart) Title() string {
	return strings.ToUpper(c.Channel) + " sends per minute, last hour"
}

// Summary says in words what the chart shows (its alt text).
func (c uiChart) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s sends per minute over the last hour: %d in all, at most %d in one minute", strings.ToUpper(c.Channel), c.Total, c.Peak)
	if c.Booked > 0 {
		fmt.Fprintf(&b, "; %d booked ahead", c.Booked)
	}
	for _, r := range c.Rules {
		fmt.Fprintf(&b, "; limit %s, %s a minute on average", r, fmtRate(perMinute(r)))
	}
	if c.Kept < uiChartSpan {
		fmt.Fprintf(&b, "; the %s window keeps only its last %s", c.Window, throttle.FormatWindow(c.Kept))
	}
	return b.String() + "."
}

func fmtRate(x float64) string {
	if x >= 100 || x == math.Trunc(x) {
		return strconv.FormatFloat(math.Round(x), 'f', -1, 64)
	}
	return strconv.FormatFloat(x, 'f', 1, 64)
}

// niceCeil rounds x up to 1, 2 or 5 times a power of ten.
func niceCeil(x float64) float64 {
	if x <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(x)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= x {
			return m * p
		}
	}
	return 10 * p
}

// drawChart draws c as a standalone SVG: a bar per minute, a dashed line
// per tenant-wide rule at the rate it allows per minute, the span the
// window no longer keeps greyed out. Presentation attributes only: no
// style element, no script.
func drawChart(c uiChart) []byte {
	var b bytes.Buffer
	esc := html.EscapeString
	n := len(c.Counts)
	top := float64(c.Peak)
	for _, r := range c.Rules {
		top = max(top, perMinute(r))
	}
	yMax := niceCeil(top * 1.1)
	y := func(v float64) float64 { return chartTop + chartPlotH - v/yMax*chartPlotH }
	x := func(i int) float64 { return chartLeft + float64(i)*chartPlotW/float64(max(1, n)) }
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-labelledby="t d" font-family="system-ui, sans-serif" font-size="12">`,
		chartW, chartH, chartW, chartH)
	fmt.Fprintf(&b, `<title id="t">%s</title><desc id="d">%s</desc>`, esc(c.Title()), esc(c.Summary()))
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="#ffffff"/>`, chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="20" font-size="14" font-weight="600" fill="#1a1a1a">%s</text>`, chartLeft, esc(c.Title()))
	if c.Kept < uiChartSpan && n > 0 {
		kept := int(math.Ceil(float64(c.Kept) / float64(uiChartMinute)))
		if w := x(n - kept); w > chartLeft {
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`, chartLeft, chartTop, w-chartLeft, chartPlotH, chartNotKept)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" fill="%s">not kept by the %s window</text>`,
				(chartLeft+w)/2, chartTop+16, chartMuted, esc(c.Window.String()))
		}
	}
	// Grid and y labels: 0, half, top.
	for _, v := range []float64{0, yMax / 2, yMax} {
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s"/>`, chartLeft, chartLeft+chartPlotW, y(v), y(v), chartGridColor)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end" fill="%s">%s</text>`, chartLeft-6, y(v)+4, chartMuted, fmtRate(v))
	}
	// Bars.
	barW := float64(chartPlotW)/float64(max(1, n)) - 2
	for i, v := range c.Counts {
		if v == 0 {
			continue
		}
		color := chartBarColor
		if v == c.Peak {
			color = chartBarFull
		}
		minute := n - 1 - i
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%d sent %s</title></rect>`,
			x(i)+1, y(float64(v)), max(1, barW), y(0)-y(float64(v)), color, v, esc(minuteLabel(minute)))
	}
	// Limits, labelled on the right.
	for i, r := range c.Rules {
		ly := y(perMinute(r))
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="2" stroke-dasharray="6 4"/>`,
			chartLeft, chartLeft+chartPlotW, ly, ly, chartLimitColor)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" fill="%s">limit %s</text>`, chartLeft+chartPlotW+6, ly+4+float64(i%2)*14, chartLimitColor,
			esc(r.String()+" ≈ "+fmtRate(perMinute(r))+"/min"))
	}
	// X axis: minutes ago.
	for _, ago := range []int{60, 45, 30, 15, 0} {
		if ago > n {
			continue
		}
		px := x(n - ago)
		label := fmt.Sprintf("−%dm", ago)
		if ago == 0 {
			label = "now " + c.Now.UTC().Format("15:04") + " UTC"
		}
		anchor := "middle"
		if ago == 0 {
			anchor = "end"
		}
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="%s"/>`, px, px, chartTop+chartPlotH, chartTop+chartPlotH+4, chartMuted)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="%s" fill="%s">%s</text>`, px, chartTop+chartPlotH+18, anchor, chartMuted, esc(label))
	}
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#1a1a1a"/>`, chartLeft, chartLeft+chartPlotW, y(0), y(0))
	legend := fmt.Sprintf("%d sent in the hour", c.Total)
	if c.Booked > 0 {
		legend += fmt.Sprintf(", %d booked ahead", c.Booked)
	}
	fmt.Fprintf(&b, `<text x="%d" y="20" text-anchor="end" fill="%s">%s</text>`, chartLeft+chartPlotW, chartMuted, esc(legend))
	b.WriteString(`</svg>`)
	return b.Bytes()
}

func minuteLabel(ago int) string {
	if ago == 0 {
		return "in the last minute"
	}
	return fmt.Sprintf("%d–%d minutes ago", ago, ago+1)
}
