package consent

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/tasks"
)

// ErrInvalid is wrapped by every error about an event, scope, keyword list
// or recipient that cannot be recorded; the message names the field.
var ErrInvalid = errors.New("consent: invalid")

// ErrUnreadable reports a stored value this version cannot read: the
// format changed under it, or something else wrote the key.
var ErrUnreadable = errors.New("consent: unreadable record")

// Action is what an event does to a recipient's suppressions.
type Action string

// The actions.
const (
	// OptOut withdraws consent for the event's scope: every category, or
	// the named ones.
	OptOut Action = "out"
	// OptIn gives it again: for every category it lifts every mark,
	// undeliverable included; for named categories it lifts their opt-outs
	// and, while an opt-out of every category stands, lets them through.
	OptIn Action = "in"
	// Undeliverable marks the recipient as one that cannot take messages
	// (a hard bounce, an invalid or unreachable number, a carrier-level
	// block): every category is blocked, exempt ones too. Usually with an
	// Until, since numbers and mailboxes are reassigned.
	Undeliverable Action = "undeliverable"
	// Review records a message that reads like a revocation without being
	// a keyword ("please stop texting me"): nothing is blocked, a person
	// decides.
	Review Action = "review"
)

func (a Action) check() error {
	switch a {
	case OptOut, OptIn, Undeliverable, Review:
		return nil
	}
	return fmt.Errorf("%w: action %q: want out, in, undeliverable or review", ErrInvalid, string(a))
}

// Source is what carried an event.
type Source string

// The sources.
const (
	SourceKeyword   Source = "keyword"   // an inbound SMS keyword (STOP, START) or a reply for review
	SourceOneClick  Source = "one-click" // an RFC 8058 one-click unsubscribe POST
	SourceBounce    Source = "bounce"    // a permanent delivery failure: SMTP 5xx on RCPT or DATA, a bounce report
	SourceComplaint Source = "complaint" // a spam complaint (a feedback loop's report)
	SourceAPI       Source = "api"       // the suppressions API, a provider webhook mapped to it, a bulk import
	SourceCLI       Source = "cli"       // sluice suppression
	SourceProvider  Source = "provider"  // an SMS provider's error code (21610 unsubscribed, 21211 invalid number, ...)
)

var sources = []Source{SourceKeyword, SourceOneClick, SourceBounce, SourceComplaint, SourceAPI, SourceCLI, SourceProvider}

func (s Source) check() error {
	if !slices.Contains(sources, s) {
		return fmt.Errorf("%w: source %q: want keyword, one-click, bounce, complaint, api, cli or provider", ErrInvalid, string(s))
	}
	return nil
}

// MaxScopeCategories bounds the categories one event names.
const MaxScopeCategories = 16

// Scope is what an opt-out or opt-in covers: every category of the
// channel, or the named ones. The zero Scope names nothing and is invalid
// for OptOut and OptIn; Undeliverable and Review always cover every
// category.
type Scope struct {
	All        bool
	Categories []string // sorted, no repeats; each as tasks.CheckCategory allows
}

// AllCategories is the scope of every category of the channel.
func AllCategories() Scope { return Scope{All: true} }

// Categories is the scope of the named categories.
func Categories(cats ...string) Scope {
	c := slices.Clone(cats)
	slices.Sort(c)
	return Scope{Categories: slices.Compact(c)}
}

// String writes the scope as the ledger stores it: "*" or "a,b".
func (s Scope) String() string {
	if s.All {
		return "*"
	}
	return strings.Join(s.Categories, ",")
}

// ParseScope reads what String writes: "*", or categories separated by
// commas (spaces around them allowed).
func ParseScope(text string) (Scope, error) {
	text = strings.TrimSpace(text)
	if text == "*" {
		return AllCategories(), nil
	}
	var cats []string
	for _, c := range strings.Split(text, ",") {
		cats = append(cats, strings.TrimSpace(c))
	}
	s := Categories(cats...)
	return s, s.check()
}

func (s Scope) check() error {
	if s.All {
		if len(s.Categories) > 0 {
			return fmt.Errorf("%w: scope: every category, or named ones, not both", ErrInvalid)
		}
		return nil
	}
	if len(s.Categories) == 0 {
		return fmt.Errorf("%w: scope: name categories, or every category (*)", ErrInvalid)
	}
	if len(s.Categories) > MaxScopeCategories {
		return fmt.Errorf("%w: scope: %d categories, at most %d", ErrInvalid, len(s.Categories), MaxScopeCategories)
	}
	for i, c := range s.Categories {
		if err := tasks.CheckCategory(c); err != nil {
			return fmt.Errorf("%w: scope: %w", ErrInvalid, err)
		}
		if i > 0 && s.Categories[i-1] >= c {
			return fmt.Errorf("%w: scope: categories must be sorted without repeats (use Categories)", ErrInvalid)
		}
	}
	return nil
}

// Event is one opt-out, opt-in, undeliverable mark or message for review
// of one recipient.
type Event struct {
	Action Action
	Source Source
	// Scope is what an OptOut or OptIn covers; Undeliverable and Review
	// always cover every category (a zero Scope is taken as that).
	Scope Scope
	// At is when it was recorded, by the Redis server's clock (Record sets
	// it; the caller's is ignored).
	At time.Time
	// Until, when set, is when the mark lapses (an undeliverable number
	// may be reassigned). Zero: never. An opt-out usually has none: it
	// holds until an opt-in.
	Until time.Time
	// Code is the provider's error code (21610) or the SMTP reply code
	// (550) that carried it; 0 for none.
	Code int
	// Ref is the id of what carried it — the notification id of the
	// message replied to or bounced, the provider's message SID of an
	// inbound reply, the API request id: up to 64 of A-Z a-z 0-9 . _ -.
	// Empty for none.
	Ref string
	// Keyword is the keyword an inbound reply matched, canonical as
	// Classify gives it ("STOP", "OPT OUT"); empty for none.
	Keyword string
}

// MaxCode bounds Event.Code.
const MaxCode = 999999

// MaxRefLen bounds Event.Ref.
const MaxRefLen = 64

// Validate reports why e cannot be recorded (an error wrapping
// ErrInvalid that names the field), or nil.
func (e Event) Validate() error {
	_, err := e.normalized()
	return err
}

// normalized returns e with the scope of Undeliverable and Review set, or
// why it cannot be recorded.
func (e Event) normalized() (Event, error) {
	if err := e.Action.check(); err != nil {
		return e, err
	}
	if err := e.Source.check(); err != nil {
		return e, err
	}
	if (e.Action == Undeliverable || e.Action == Review) && !e.Scope.All {
		if len(e.Scope.Categories) > 0 {
			return e, fmt.Errorf("%w: scope: %s always covers every category", ErrInvalid, e.Action)
		}
		e.Scope = AllCategories()
	}
	if err := e.Scope.check(); err != nil {
		return e, err
	}
	if e.Code < 0 || e.Code > MaxCode {
		return e, fmt.Errorf("%w: code %d is not in 0..%d", ErrInvalid, e.Code, MaxCode)
	}
	if e.Ref != "" {
		if err := tasks.CheckID(e.Ref); err != nil {
			return e, fmt.Errorf("%w: ref: %w", ErrInvalid, err)
		}
	}
	if e.Keyword != "" && (len(e.Keyword) > MaxKeywordLen || Normalize(e.Keyword) != e.Keyword) {
		return e, fmt.Errorf("%w: keyword %q: want a canonical keyword (Classify's), at most %d bytes", ErrInvalid, e.Keyword, MaxKeywordLen)
	}
	if e.Action == OptIn && !e.Until.IsZero() {
		return e, fmt.Errorf("%w: until: an opt-in does not lapse", ErrInvalid)
	}
	if !e.Until.IsZero() && e.Until.UnixMilli() <= 0 {
		return e, fmt.Errorf("%w: until %v is before 1970", ErrInvalid, e.Until)
	}
	return e, nil
}

// encode writes e as a ledger entry (record.lua builds the same from its
// arguments; tests compare).
func (e Event) encode() string {
	return strings.Join([]string{
		strconv.FormatInt(e.At.UnixMilli(), 10), string(e.Action), string(e.Source), e.Scope.String(),
		strconv.Itoa(e.Code), strconv.FormatInt(untilMS(e.Until), 10), e.Ref, e.Keyword,
	}, "|")
}

func untilMS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromMS(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// decodeEvent reads a ledger entry.
func decodeEvent(s string) (Event, error) {
	f := strings.Split(s, "|")
	if len(f) != 8 {
		return Event{}, fmt.Errorf("%w: ledger entry of %d fields", ErrUnreadable, len(f))
	}
	at, ok1 := decimal(f[0])
	code, ok2 := decimal(f[4])
	until, ok3 := decimal(f[5])
	if !ok1 || !ok2 || !ok3 {
		return Event{}, fmt.Errorf("%w: ledger entry %q", ErrUnreadable, s)
	}
	scope, err := ParseScope(f[3])
	if err == nil && scope.String() != f[3] {
		err = errors.New("scope not as written")
	}
	if err != nil {
		return Event{}, fmt.Errorf("%w: ledger entry %q: %w", ErrUnreadable, s, err)
	}
	e := Event{Action: Action(f[1]), Source: Source(f[2]), Scope: scope, At: time.UnixMilli(at).UTC(),
		Until: fromMS(until), Code: int(code), Ref: f[6], Keyword: f[7]}
	if _, err := e.normalized(); err != nil {
		return Event{}, fmt.Errorf("%w: ledger entry %q: %w", ErrUnreadable, s, err)
	}
	return e, nil
}

// decimal reads a non-negative integer written canonically (no sign, no
// leading zero), up to 16 digits.
func decimal(s string) (int64, bool) {
	if s == "" || len(s) > 16 || (len(s) > 1 && s[0] == '0') || strings.Trim(s, "0123456789") != "" {
		return 0, false // ParseInt would take a sign ("+000")
	}
	v, err := strconv.ParseInt(s, 10, 64)
	return v, err == nil && v >= 0
}

// Mark is one field of a recipient's suppression hash: the latest event
// that set it.
type Mark struct {
	At     time.Time // when that event was recorded
	Until  time.Time // when the mark lapses; zero: never
	Source Source
	Code   int
}

// live reports whether the mark counts at now.
func (m Mark) live(now time.Time) bool { return m.Until.IsZero() || m.Until.After(now) }

// parseMark reads a field value "<until_ms>:<at_ms>:<source>:<code>".
func parseMark(v string) (Mark, error) {
	f := strings.Split(v, ":")
	if len(f) != 4 {
		return Mark{}, fmt.Errorf("%w: mark %q", ErrUnreadable, v)
	}
	until, ok1 := decimal(f[0])
	at, ok2 := decimal(f[1])
	code, ok3 := decimal(f[3])
	src := Source(f[2])
	if !ok1 || !ok2 || !ok3 || src.check() != nil {
		return Mark{}, fmt.Errorf("%w: mark %q", ErrUnreadable, v)
	}
	return Mark{At: time.UnixMilli(at).UTC(), Until: fromMS(until), Source: src, Code: int(code)}, nil
}

// State is what a recipient's suppression hash holds.
type State struct {
	// Undeliverable is set while the recipient cannot take messages.
	Undeliverable *Mark
	// All is set while the recipient is opted out of every category.
	All *Mark
	// OptedOut are the categories the recipient opted out of one by one.
	OptedOut map[string]Mark
	// OptedIn are the categories the recipient opted back in to while All
	// stands.
	OptedIn map[string]Mark
}

// Empty reports whether nothing is suppressed.
func (s State) Empty() bool {
	return s.Undeliverable == nil && s.All == nil && len(s.OptedOut) == 0 && len(s.OptedIn) == 0
}

// Reason is why a send is blocked; NotBlocked when it is not.
type Reason int

// The reasons, as the consent rule returns them (scripts/consent.lua).
const (
	NotBlocked           Reason = 0
	BlockedUndeliverable Reason = 1 // "!": the recipient cannot take messages
	BlockedCategory      Reason = 2 // "c:<category>": opted out of this category
	BlockedAll           Reason = 3 // "*": opted out of every category, and this one is not exempt
)

func (r Reason) String() string {
	switch r {
	case NotBlocked:
		return "not blocked"
	case BlockedUndeliverable:
		return "undeliverable"
	case BlockedCategory:
		return "opted out of the category"
	case BlockedAll:
		return "opted out of every category"
	}
	return "Reason(" + strconv.Itoa(int(r)) + ")"
}

// Blocks is the consent rule's decision (scripts/consent.lua) in Go, for
// a reader that holds a State: why a send of category (the default
// category's name when it has none) is blocked at now, with exempt telling
// whether the tenant declares the category one an opt-out of every
// category lets through. Sends are decided by the script (Store.Check, the
// limiter's check); TestCheckScriptAgreesWithBlocks holds both to one
// answer on random histories.
func (s State) Blocks(category string, exempt bool, now time.Time) Reason {
	if s.Undeliverable != nil && s.Undeliverable.live(now) {
		return BlockedUndeliverable
	}
	if m, ok := s.OptedOut[category]; ok && m.live(now) {
		return BlockedCategory
	}
	if s.All != nil && s.All.live(now) && !exempt {
		if m, ok := s.OptedIn[category]; !ok || !m.live(now) {
			return BlockedAll
		}
	}
	return NotBlocked
}

// Verdict is the answer of Store.Check.
type Verdict struct {
	Reason Reason
	// Mark is the mark that blocks; nil when not blocked, or when the
	// mark is unreadable (which blocks: fail closed).
	Mark *Mark
}

// Blocked reports whether the send is blocked.
func (v Verdict) Blocked() bool { return v.Reason != NotBlocked }
