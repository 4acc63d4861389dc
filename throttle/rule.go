package throttle

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Bounds on rules. A sliding log keeps one entry per admission, so its
// memory grows with the limit: limits past MaxLimit belong to a counter, not
// to a log (docs/throttling.md, "When to use a sliding log — and when not").
const (
	MaxLimit     = 1_000_000
	MaxWindow    = 400 * 24 * time.Hour
	MinWindow    = time.Millisecond
	MaxRules     = 16
	maxMemberLen = 128
)

var (
	// ErrInvalidRule reports a rule with a bad limit or window, or a rule
	// string that does not parse.
	ErrInvalidRule = errors.New("throttle: invalid rule")
	// ErrInvalidKey reports an empty or malformed group, scope, subject or member.
	ErrInvalidKey = errors.New("throttle: invalid key")
	// ErrTooManyRules reports a check with no rules or more than MaxRules.
	ErrTooManyRules = errors.New("throttle: too many rules")
)

// Rule is a quota: at most Limit admissions in any Window-long span.
type Rule struct {
	// Limit is the number of admissions allowed in any window; 1..MaxLimit.
	Limit int
	// Window is the span the limit applies to; whole milliseconds, MinWindow..MaxWindow.
	Window time.Duration
}

// PerSecond returns a rule of n admissions per second.
func PerSecond(n int) Rule { return Rule{Limit: n, Window: time.Second} }

// PerMinute returns a rule of n admissions per minute.
func PerMinute(n int) Rule { return Rule{Limit: n, Window: time.Minute} }

// PerHour returns a rule of n admissions per hour.
func PerHour(n int) Rule { return Rule{Limit: n, Window: time.Hour} }

// PerDay returns a rule of n admissions per 24 hours.
func PerDay(n int) Rule { return Rule{Limit: n, Window: 24 * time.Hour} }

// Validate reports whether the rule is usable.
func (r Rule) Validate() error {
	switch {
	case r.Limit < 1 || r.Limit > MaxLimit:
		return fmt.Errorf("%w: limit %d must be between 1 and %d", ErrInvalidRule, r.Limit, MaxLimit)
	case r.Window < MinWindow || r.Window > MaxWindow:
		return fmt.Errorf("%w: window %v must be between %v and %v", ErrInvalidRule, r.Window, MinWindow, MaxWindow)
	case r.Window%time.Millisecond != 0:
		return fmt.Errorf("%w: window %v must be whole milliseconds", ErrInvalidRule, r.Window)
	}
	return nil
}

// String prints the rule in the form ParseRule reads, e.g. "10/1m" or "5/1d".
func (r Rule) String() string {
	return strconv.Itoa(r.Limit) + "/" + FormatWindow(r.Window)
}

// FormatWindow prints a window in the largest unit that divides it exactly:
// "1d", "24h" is printed as "1d", "90s", "1500ms".
func FormatWindow(d time.Duration) string {
	units := []struct {
		suffix string
		d      time.Duration
	}{{"d", 24 * time.Hour}, {"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}}
	for _, u := range units {
		if d >= u.d && d%u.d == 0 {
			return strconv.FormatInt(int64(d/u.d), 10) + u.suffix
		}
	}
	return d.String()
}

// ParseRule reads "LIMIT/WINDOW", where WINDOW is a Go duration ("90s",
// "1h30m", "1500ms") or a whole number of days ("1d"); a bare unit means one
// of it ("10/m" is "10/1m").
func ParseRule(s string) (Rule, error) {
	lim, win, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Rule{}, fmt.Errorf("%w: %q: want LIMIT/WINDOW, e.g. 10/1m", ErrInvalidRule, s)
	}
	n, err := strconv.Atoi(strings.TrimSpace(lim))
	if err != nil {
		return Rule{}, fmt.Errorf("%w: %q: limit %q is not a whole number", ErrInvalidRule, s, lim)
	}
	d, err := parseWindow(strings.TrimSpace(win))
	if err != nil {
		return Rule{}, fmt.Errorf("%w: %q: %v", ErrInvalidRule, s, err)
	}
	r := Rule{Limit: n, Window: d}
	if err := r.Validate(); err != nil {
		return Rule{}, fmt.Errorf("%q: %w", s, err)
	}
	return r, nil
}

func parseWindow(s string) (time.Duration, error) {
	switch s {
	case "":
		return 0, errors.New("window is empty")
	case "ms", "s", "m", "h", "d":
		s = "1" + s
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 || n > int(MaxWindow/(24*time.Hour)) {
			return 0, fmt.Errorf("window %q: want a whole number of days up to %d", s, MaxWindow/(24*time.Hour))
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("window %q: %v", s, err)
	}
	return d, nil
}
