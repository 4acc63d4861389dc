package throttle

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
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

// Rule is a quota: at most Limit admissions in any Window-long span — or,
// with Calendar set, in each calendar period of Zone.
type Rule struct {
	// Limit is the number of admissions allowed in any window; 1..MaxLimit.
	Limit int
	// Window is the span the limit applies to; whole milliseconds, MinWindow..MaxWindow.
	// For a calendar rule it is the period's nominal length (Period.Nominal).
	Window time.Duration
	// Calendar, when set, makes the rule a fixed counter per calendar period
	// (minute, hour, day, week from Monday, month) of Zone: the count resets
	// at the zone's boundary, DST included. Memory: one counter per period.
	Calendar Period
	// Zone is the IANA zone of a calendar rule's boundaries; "" is UTC.
	Zone string
	// Buckets, when above 0, keeps a sliding window as counts per bucket of
	// Window/Buckets instead of one entry per admission (2..MaxBuckets): memory
	// per key bounded by the buckets, never admitting more than the exact log,
	// under-admitting by at most one bucket's worth (docs/throttling.md).
	Buckets int
	// Distinct, when set, counts distinct subjects instead of sends: at most
	// Limit distinct subjects (Limit.Distinct, e.g. recipients) sent to in
	// any Window-long span, a subject sent to again within its window costing
	// nothing (limiter_distinct.lua). Memory: one entry per distinct subject.
	Distinct bool
}

// DistinctSuffix ends a distinct-count rule's string: "250/1d@distinct".
const DistinctSuffix = "@distinct"

// Period is a calendar period of a calendar rule (Rule.Calendar).
type Period string

// The calendar periods.
const (
	Minute Period = "m"
	Hour   Period = "h"
	Day    Period = "d"
	Week   Period = "w" // from Monday 00:00
	Month  Period = "mo"
)

// MaxBuckets bounds Rule.Buckets; DefaultBuckets is what "~" alone asks for.
const (
	MaxBuckets     = 1000
	DefaultBuckets = 60
)

// Nominal is the period's length on a day without a DST change (a month: 31 days).
func (p Period) Nominal() time.Duration {
	switch p {
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 31 * 24 * time.Hour
	}
	return 0
}

// Counter reports whether the rule keeps counts (calendar or bucketed)
// rather than one entry per admission.
func (r Rule) Counter() bool { return r.Calendar != "" || r.Buckets > 0 }

// PerCalendar returns a rule of n admissions per calendar period of zone ("" UTC).
func PerCalendar(n int, p Period, zone string) Rule {
	return Rule{Limit: n, Window: p.Nominal(), Calendar: p, Zone: zone}
}

// Bucketed returns r kept as counts in b buckets.
func (r Rule) Bucketed(b int) Rule { r.Buckets = b; return r }

var zones sync.Map // zone name → *time.Location

// Location returns a calendar rule's zone.
func (r Rule) Location() (*time.Location, error) {
	if r.Zone == "" {
		return time.UTC, nil
	}
	if r.Zone == "Local" {
		return nil, fmt.Errorf("%w: zone Local: name an IANA zone (the host's zone differs between workers)", ErrInvalidRule)
	}
	if l, ok := zones.Load(r.Zone); ok {
		return l.(*time.Location), nil
	}
	l, err := time.LoadLocation(r.Zone)
	if err != nil {
		return nil, fmt.Errorf("%w: zone %q: %v", ErrInvalidRule, r.Zone, err)
	}
	zones.Store(r.Zone, l)
	return l, nil
}

// keyPart is the rule's part of its key: the window in ms for a log,
// "<ms>~<buckets>" bucketed, "<period>@<zone>" calendar (the kinds never share a key).
func (r Rule) keyPart() string {
	var b strings.Builder
	r.writeKeyPart(&b)
	return b.String()
}

// writeKeyPart writes keyPart to b, its numbers formatted in place: a check
// names its keys on every call, and a part made as a string of its own cost
// one to three allocations each time.
func (r Rule) writeKeyPart(b *strings.Builder) {
	if r.Calendar != "" {
		z := r.Zone
		if z == "" {
			z = "UTC"
		}
		b.WriteString(string(r.Calendar))
		b.WriteByte('@')
		b.WriteString(z)
		return
	}
	var num [20]byte
	b.Write(strconv.AppendInt(num[:0], r.Window.Milliseconds(), 10))
	if r.Distinct {
		b.WriteByte('d')
	}
	if r.Buckets > 0 {
		b.WriteByte('~')
		b.Write(strconv.AppendInt(num[:0], int64(r.Buckets), 10))
	}
}

// Same reports whether two rules count in the same key (same window kind
// and length), whatever their limits.
func (r Rule) Same(o Rule) bool { return r.keyPart() == o.keyPart() }

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
	case r.Buckets < 0 || r.Buckets == 1 || r.Buckets > MaxBuckets:
		return fmt.Errorf("%w: %d buckets: want 2 to %d (0: a sliding log)", ErrInvalidRule, r.Buckets, MaxBuckets)
	case r.Buckets > 0 && r.Window.Milliseconds() < int64(r.Buckets):
		return fmt.Errorf("%w: window %v is shorter than %d buckets of 1ms", ErrInvalidRule, r.Window, r.Buckets)
	case r.Calendar == "" && r.Zone != "":
		return fmt.Errorf("%w: zone %q without a calendar period", ErrInvalidRule, r.Zone)
	}
	if r.Distinct && (r.Calendar != "" || r.Buckets > 0) {
		return fmt.Errorf("%w: a distinct-count rule is a sliding window: no calendar period, no buckets", ErrInvalidRule)
	}
	if r.Calendar != "" {
		if r.Buckets > 0 {
			return fmt.Errorf("%w: a calendar rule keeps one counter per period, not buckets", ErrInvalidRule)
		}
		if r.Calendar.Nominal() == 0 {
			return fmt.Errorf("%w: calendar period %q: want m, h, d, w or mo", ErrInvalidRule, r.Calendar)
		}
		if r.Window != r.Calendar.Nominal() {
			return fmt.Errorf("%w: a calendar rule's window is its period's nominal length %v, not %v", ErrInvalidRule, r.Calendar.Nominal(), r.Window)
		}
		if _, err := r.Location(); err != nil {
			return err
		}
	}
	return nil
}

// String prints the rule in the form ParseRule reads, e.g. "10/1m" or "5/1d".
// A calendar rule prints "2000/1d@America/Los_Angeles", a bucketed one "10000/1h~60".
func (r Rule) String() string {
	if r.Calendar != "" {
		z := r.Zone
		if z == "" {
			z = "UTC"
		}
		return strconv.Itoa(r.Limit) + "/1" + string(r.Calendar) + "@" + z
	}
	s := strconv.Itoa(r.Limit) + "/" + FormatWindow(r.Window)
	if r.Buckets > 0 {
		s += "~" + strconv.Itoa(r.Buckets)
	}
	if r.Distinct {
		s += DistinctSuffix
	}
	return s
}

// WindowString prints the window alone: "1m", "1d@America/New_York", "1h~60".
func (r Rule) WindowString() string {
	s := r.String()
	return s[strings.IndexByte(s, '/')+1:]
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
// of it ("10/m" is "10/1m"). Two forms keep counts instead of a log:
//
//	LIMIT/1P@ZONE     a calendar period P (m, h, d, w, mo) of an IANA zone ("@UTC" or no zone: UTC)
//	LIMIT/WINDOW~B    a sliding window in B buckets ("~" alone: DefaultBuckets)
//
// and LIMIT/WINDOW@distinct counts distinct subjects in a sliding window
// (Rule.Distinct).
func ParseRule(s string) (Rule, error) {
	if head, ok := strings.CutSuffix(strings.TrimSpace(s), DistinctSuffix); ok {
		if strings.ContainsAny(head, "@~") {
			return Rule{}, fmt.Errorf("%w: %q: a distinct-count rule is LIMIT/WINDOW@distinct, a sliding window", ErrInvalidRule, s)
		}
		r, err := ParseRule(head)
		if err != nil {
			return Rule{}, err
		}
		r.Distinct = true
		return r, nil
	}
	if i := strings.IndexByte(s, '@'); i >= 0 || strings.HasSuffix(strings.TrimSpace(s), "/1mo") || strings.HasSuffix(strings.TrimSpace(s), "/mo") || strings.HasSuffix(strings.TrimSpace(s), "/1w") || strings.HasSuffix(strings.TrimSpace(s), "/w") {
		return parseCalendar(s)
	}
	if head, b, ok := strings.Cut(s, "~"); ok {
		r, err := ParseRule(head)
		if err != nil {
			return Rule{}, err
		}
		r.Buckets = DefaultBuckets
		if b = strings.TrimSpace(b); b != "" {
			n, err := strconv.Atoi(b)
			if err != nil {
				return Rule{}, fmt.Errorf("%w: %q: buckets %q is not a whole number", ErrInvalidRule, s, b)
			}
			r.Buckets = n
		}
		if err := r.Validate(); err != nil {
			return Rule{}, fmt.Errorf("%q: %w", s, err)
		}
		return r, nil
	}
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

// parseCalendar reads LIMIT/1P[@ZONE].
func parseCalendar(s string) (Rule, error) {
	body, zone, _ := strings.Cut(strings.TrimSpace(s), "@")
	lim, per, ok := strings.Cut(body, "/")
	if !ok {
		return Rule{}, fmt.Errorf("%w: %q: want LIMIT/1PERIOD@ZONE, e.g. 2000/1d@America/Los_Angeles", ErrInvalidRule, s)
	}
	n, err := strconv.Atoi(strings.TrimSpace(lim))
	if err != nil {
		return Rule{}, fmt.Errorf("%w: %q: limit %q is not a whole number", ErrInvalidRule, s, lim)
	}
	p := Period(strings.TrimPrefix(strings.TrimSpace(per), "1"))
	if p.Nominal() == 0 {
		return Rule{}, fmt.Errorf("%w: %q: calendar period %q: want 1m, 1h, 1d, 1w or 1mo", ErrInvalidRule, s, per)
	}
	zone = strings.TrimSpace(zone)
	if zone == "UTC" {
		zone = ""
	}
	r := PerCalendar(n, p, zone)
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
