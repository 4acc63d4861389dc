package plans

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ErrBadQuietHours is wrapped by every error of ParseQuietHours and
// QuietHours.Validate.
var ErrBadQuietHours = errors.New("plans: bad quiet hours")

// MinutesPerDay is the number of Clock values: 00:00 through 23:59.
const MinutesPerDay = 24 * 60

// Clock is a local wall-clock time of day in minutes after midnight,
// 0 (00:00) through 1439 (23:59).
type Clock int

// ClockAt returns the Clock for hour:minute. It does not check the range;
// see Valid.
func ClockAt(hour, minute int) Clock { return Clock(hour*60 + minute) }

// Valid reports whether c is in 0..1439.
func (c Clock) Valid() bool { return c >= 0 && c < MinutesPerDay }

// String formats c as "HH:MM"; an invalid Clock as "Clock(N)".
func (c Clock) String() string {
	if !c.Valid() {
		return fmt.Sprintf("Clock(%d)", int(c))
	}
	return fmt.Sprintf("%02d:%02d", c/60, c%60)
}

// QuietHours is a daily span of local wall-clock time in which nothing is
// sent, from Start (inclusive) to End (exclusive), or a Preset. Start > End
// crosses midnight (21:00–08:00 is quiet from 21:00 until 08:00 the next
// morning); Start == End is invalid, since it could mean never or always.
// How the span is read on days when the clock jumps is in the package
// documentation.
type QuietHours struct {
	Start, End Clock
	// Preset, when set, stands for quiet hours that depend on where the
	// recipient is and on the day of the week (PresetTCPA); Start and End
	// are then zero. See the package documentation.
	Preset Preset
}

// Validate reports why q is unusable: a Clock out of range, Start == End,
// or an unknown preset. The zero QuietHours is invalid.
func (q QuietHours) Validate() error {
	if q.Preset != "" {
		if _, ok := presets[q.Preset]; !ok {
			return fmt.Errorf("%w: unknown preset %q (known: %s)", ErrBadQuietHours, string(q.Preset), presetNames())
		}
		if q.Start != 0 || q.End != 0 {
			return fmt.Errorf("%w: preset %s takes no start or end", ErrBadQuietHours, q.Preset)
		}
		return nil
	}
	switch {
	case !q.Start.Valid():
		return fmt.Errorf("%w: start %v is not in 00:00..23:59", ErrBadQuietHours, q.Start)
	case !q.End.Valid():
		return fmt.Errorf("%w: end %v is not in 00:00..23:59", ErrBadQuietHours, q.End)
	case q.Start == q.End:
		return fmt.Errorf("%w: start and end are both %v (never or always quiet?)", ErrBadQuietHours, q.Start)
	}
	return nil
}

// String formats q as "HH:MM-HH:MM", or a preset by its name ("tcpa"),
// which ParseQuietHours reads back.
func (q QuietHours) String() string {
	if q.Preset != "" {
		return string(q.Preset)
	}
	return q.Start.String() + "-" + q.End.String()
}

// MarshalText writes q as String does; an invalid q is an error.
func (q QuietHours) MarshalText() ([]byte, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	return []byte(q.String()), nil
}

// UnmarshalText reads what ParseQuietHours reads, so QuietHours can be set
// from configuration (environment, JSON, flags).
func (q *QuietHours) UnmarshalText(text []byte) error {
	v, err := ParseQuietHours(string(text))
	if err != nil {
		return err
	}
	*q = v
	return nil
}

// maxQuietHoursLen bounds the input ParseQuietHours looks at; the longest
// accepted form, " 23:59 – 24:00 " with some spacing, is far shorter.
const maxQuietHoursLen = 64

// ParseQuietHours reads "START-END" where each side is H, HH, H:MM or HH:MM
// on a 24-hour clock (hours 0..23, minutes 00..59), e.g. "21:00-08:00",
// "21-8" or "9:30-17". The end may also be "24:00" (or "24"), meaning
// midnight. Spaces around either side are ignored, and an en dash (–) may
// stand for the hyphen. 12-hour forms ("9pm") are not accepted: "12am" is
// too easy to get wrong for a rule that keeps people's phones quiet.
//
// A name instead reads a preset, in any case: "tcpa" (PresetTCPA).
//
// Errors wrap ErrBadQuietHours and name the part that is wrong.
func ParseQuietHours(s string) (QuietHours, error) {
	if len(s) > maxQuietHoursLen {
		return QuietHours{}, fmt.Errorf("%w: %d bytes, at most %d", ErrBadQuietHours, len(s), maxQuietHoursLen)
	}
	if name := strings.TrimSpace(s); name != "" && isLetter(name[0]) {
		p := Preset(strings.ToLower(name))
		if _, ok := presets[p]; !ok {
			return QuietHours{}, fmt.Errorf("%w %q: not a preset (known: %s) nor START-END, e.g. 21:00-08:00", ErrBadQuietHours, s, presetNames())
		}
		return QuietHours{Preset: p}, nil
	}
	norm := strings.ReplaceAll(s, "–", "-")
	if strings.Count(norm, "-") != 1 {
		return QuietHours{}, fmt.Errorf("%w %q: want START-END, e.g. 21:00-08:00", ErrBadQuietHours, s)
	}
	startText, endText, _ := strings.Cut(norm, "-")
	start, err := parseClock(startText, false)
	if err != nil {
		return QuietHours{}, fmt.Errorf("%w %q: start %q: %v", ErrBadQuietHours, s, strings.TrimSpace(startText), err)
	}
	end, err := parseClock(endText, true)
	if err != nil {
		return QuietHours{}, fmt.Errorf("%w %q: end %q: %v", ErrBadQuietHours, s, strings.TrimSpace(endText), err)
	}
	if start == end {
		return QuietHours{}, fmt.Errorf("%w %q: start and end are both %v (never or always quiet?)", ErrBadQuietHours, s, start)
	}
	return QuietHours{Start: start, End: end}, nil
}

// parseClock reads H, HH, H:MM or HH:MM; "24:00" only if end is true.
func parseClock(s string, end bool) (Clock, error) {
	s = strings.TrimSpace(s)
	hourText, minuteText, hasMinutes := strings.Cut(s, ":")
	if len(hourText) < 1 || len(hourText) > 2 || !allDigits(hourText) {
		return 0, errors.New("want H, HH, H:MM or HH:MM")
	}
	if hasMinutes && (len(minuteText) != 2 || !allDigits(minuteText)) {
		return 0, errors.New("minutes must be two digits")
	}
	hour, minute := atoi(hourText), 0
	if hasMinutes {
		minute = atoi(minuteText)
	}
	switch {
	case minute > 59:
		return 0, fmt.Errorf("minute %d is not in 00..59", minute)
	case hour == 24 && minute == 0 && end:
		return 0, nil // 24:00, the midnight that ends a day
	case hour > 23:
		return 0, fmt.Errorf("hour %d is not in 0..23", hour)
	}
	return ClockAt(hour, minute), nil
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func allDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// atoi converts at most two ASCII digits.
func atoi(s string) int {
	n := 0
	for _, r := range s {
		n = n*10 + int(r-'0')
	}
	return n
}

// Span is the span of instants [Start, End).
type Span struct{ Start, End time.Time }

// Contains reports whether Start <= t < End.
func (s Span) Contains(t time.Time) bool { return !t.Before(s.Start) && t.Before(s.End) }

// String formats s as "START–END" in RFC 3339.
func (s Span) String() string {
	return s.Start.Format(time.RFC3339Nano) + "–" + s.End.Format(time.RFC3339Nano)
}

// Closed returns the spans in [from, from+horizon) during which q holds in
// at least one of zones: sorted, non-overlapping, not touching (adjacent
// spans are merged), clipped to the horizon, as instants in UTC. The
// result is nil if q is invalid, horizon is not positive or zones is empty;
// a nil entry of zones stands for UTC. Days on which the clock jumps are
// read as the package documentation says. The work grows with the horizon
// times the number of zones.
//
// A preset knows no phone number here, so it takes the strictest rule of
// every place it covers; ClosedFor reads the recipient's state from its
// number.
func (q QuietHours) Closed(from time.Time, horizon time.Duration, zones []*time.Location) []Span {
	return q.ClosedFor(from, horizon, zones, "")
}

// ClosedFor is Closed for the recipient with the phone number phone (E.164,
// e.g. "+13055550100"; "" when there is none, as for email). A daily span
// ignores phone; a preset reads from it where the recipient is (for
// PresetTCPA, the US state: USStates) and may add that place's zones to
// zones (see the package documentation).
func (q QuietHours) ClosedFor(from time.Time, horizon time.Duration, zones []*time.Location, phone string) []Span {
	if q.Validate() != nil || horizon <= 0 || len(zones) == 0 {
		return nil
	}
	night, zones := q.nights(zones, phone)
	from = from.UTC() // also drops any monotonic reading
	to := from.Add(horizon)
	var spans []Span
	for _, loc := range zones {
		z := newZone(loc)
		for day, last := z.day(from)-2, z.day(to)+2; day <= last; day++ {
			s, ok := z.span(night(day))
			if !ok {
				continue
			}
			if s.Start.Before(from) {
				s.Start = from
			}
			if s.End.After(to) {
				s.End = to
			}
			if s.Start.Before(s.End) {
				spans = append(spans, s)
			}
		}
	}
	return merge(spans)
}

// Quiet reports whether q holds at t in at least one of zones: exactly when
// t lies in a span that Closed returns for a horizon covering t. It is
// false if q is invalid or zones is empty; a nil entry of zones stands for
// UTC.
func (q QuietHours) Quiet(t time.Time, zones []*time.Location) bool {
	return q.QuietFor(t, zones, "")
}

// QuietFor is Quiet for the recipient with the phone number phone, as
// ClosedFor reads it: exactly when t lies in a span ClosedFor returns.
func (q QuietHours) QuietFor(t time.Time, zones []*time.Location, phone string) bool {
	if q.Validate() != nil {
		return false
	}
	night, zones := q.nights(zones, phone)
	for _, loc := range zones {
		z := newZone(loc)
		d := z.day(t)
		// A quiet span starts on its local day or the day before (when it
		// crosses midnight); a clock set back across midnight can show an
		// earlier date still. Two days either side are plenty.
		for day := d - 2; day <= d+2; day++ {
			if s, ok := z.span(night(day)); ok && s.Contains(t) {
				return true
			}
		}
	}
	return false
}

// nightFunc gives the quiet span that begins on a local day (days since
// 1970-01-01) as two wall times (see wall.go): it runs from the first
// instant the clock reads startWall or later to the last instant it reads
// endWall or earlier.
type nightFunc func(day int64) (startWall, endWall int64)

// nights returns how q's quiet spans fall on each day for the recipient
// with phone, and the zones to read them in: zones itself for a daily
// span, zones and its place's for a preset.
func (q QuietHours) nights(zones []*time.Location, phone string) (nightFunc, []*time.Location) {
	if q.Preset != "" {
		return presets[q.Preset].nights(zones, phone)
	}
	return q.night, zones
}

// night is the nightFunc of a daily span: from Start on day to End on day,
// or on day+1 when q crosses midnight.
func (q QuietHours) night(day int64) (startWall, endWall int64) {
	endDay := day
	if q.End < q.Start {
		endDay++
	}
	return day*secondsPerDay + int64(q.Start)*60, endDay*secondsPerDay + int64(q.End)*60
}

// merge sorts spans and joins those that overlap or touch.
func merge(spans []Span) []Span {
	if len(spans) == 0 {
		return nil
	}
	slices.SortFunc(spans, func(a, b Span) int { return a.Start.Compare(b.Start) })
	out := spans[:1]
	for _, s := range spans[1:] {
		last := &out[len(out)-1]
		if s.Start.After(last.End) {
			out = append(out, s)
		} else if s.End.After(last.End) {
			last.End = s.End
		}
	}
	return out
}
