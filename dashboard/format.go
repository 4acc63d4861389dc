package dashboard

import (
	"fmt"
	"html/template"
	"strings"
	"time"
)

// uiFuncs are the templates' helpers. Times are shown in UTC.
var uiFuncs = template.FuncMap{
	"asset":   func(name string) string { return "/ui/static/" + name + "?v=" + uiAssets[name] },
	"pct":     func(x float64) string { return fmt.Sprintf("%.2f", x) },
	"in":      relTime,
	"fromNow": func(t time.Time) string { return relTime(t, time.Now()) },
	"clock":   func(t time.Time) string { return t.UTC().Format("15:04:05") + " UTC" },
	"stamp":   stamp,
	"dur":     func(d time.Duration) string { return roundDur(d).String() },
	"reason":  reasonText,
	"join":    strings.Join,
}

// relTime says when t is from now's point of view: "now", "in 43.9s", "12s ago".
func relTime(t, now time.Time) string {
	if t.IsZero() {
		return "—"
	}
	d := t.Sub(now)
	switch {
	case d > -50*time.Millisecond && d <= 50*time.Millisecond:
		return "now"
	case d > 0:
		return "in " + roundDur(d).String()
	default:
		return roundDur(-d).String() + " ago"
	}
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05") + " UTC"
}

func roundDur(d time.Duration) time.Duration {
	switch {
	case d < time.Minute:
		return d.Round(100 * time.Millisecond)
	case d < time.Hour:
		return d.Round(time.Second)
	default:
		return d.Round(time.Minute)
	}
}

// reasonText names a waiting or archive reason for people.
func reasonText(r string) string {
	switch r {
	case "throttled":
		return "rate rule"
	case "quiet_hours":
		return "quiet hours"
	case "retry":
		return "provider retry"
	case "unavailable":
		return "Redis unavailable"
	case "shutdown":
		return "worker shut down"
	case "scheduled":
		return "scheduled by producer"
	case "dropped":
		return "dropped (drop rule full)"
	case "expired":
		return "expired unsent"
	case "outcome_unknown":
		return "outcome unknown (at-most-once)"
	case "invalid":
		return "invalid"
	case "unreadable":
		return "payload unreadable"
	case "permanent":
		return "provider refused"
	case "retry_budget":
		return "retries used up"
	case "suppressed":
		return "recipient suppressed"
	case "template":
		return "digest template past its limits"
	}
	return r
}

// WindowsPart is the live windows table of the page.
func (p uiTenantPage) WindowsPart(admin bool) uiWindowsPart {
	return uiWindowsPart{Tenant: p.Tenant, Windows: p.Windows, Now: p.Now, Admin: admin}
}
