package consent

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/tasks"
)

// Report is an event as a caller or a provider words it: what POST
// /v1/events takes, and what a provider's webhook (an SES bounce, a
// SendGrid spamreport) is mapped onto. Event turns it into the Event to
// record, so every door into the store gives one word one meaning.
type Report struct {
	// Type is what happened: out, in, undeliverable, or a provider's word:
	// bounce (a hard bounce), complaint, unsubscribe, resubscribe.
	Type string
	// Scope ("*" or categories separated by commas) or Category (one), not
	// both; neither is every category.
	Scope, Category string
	// Until, when set, is when the mark lapses; a bounce without one lapses
	// after the channel's suppression TTL.
	Until *time.Time
	Code  int
	Ref   string
}

// The words of Report.Type.
const (
	TypeOut           = "out"
	TypeIn            = "in"
	TypeUndeliverable = "undeliverable"
	TypeBounce        = "bounce"
	TypeComplaint     = "complaint"
	TypeUnsubscribe   = "unsubscribe"
	TypeResubscribe   = "resubscribe"
)

// Event returns the event r stands for: out and unsubscribe opt out
// (source api), in and resubscribe opt in (source api), undeliverable marks
// the recipient undeliverable (source api), bounce too (source bounce,
// lapsing after undeliverableFor unless Until), complaint opts out (source
// complaint). On error, field names the field at fault (type, scope,
// category, until, code, ref) and the error wraps ErrInvalid.
func (r Report) Event(undeliverableFor time.Duration, now time.Time) (e Event, field string, err error) {
	e = Event{Source: SourceAPI, Code: r.Code, Ref: r.Ref}
	scope, field, err := r.scope()
	if err != nil {
		return e, field, err
	}
	switch r.Type {
	case TypeOut, TypeUnsubscribe:
		e.Action, e.Scope = OptOut, scope
	case TypeIn, TypeResubscribe:
		e.Action, e.Scope = OptIn, scope
	case TypeUndeliverable, TypeBounce:
		e.Action = Undeliverable
		if r.Type == TypeBounce {
			e.Source = SourceBounce
			if r.Until == nil {
				e.Until = now.Add(undeliverableFor)
			}
		}
		if r.Scope != "" || r.Category != "" {
			return e, "scope", fmt.Errorf("%w: an undeliverable mark covers every category", ErrInvalid)
		}
	case TypeComplaint:
		e.Action, e.Source, e.Scope = OptOut, SourceComplaint, scope
	default:
		return e, "type", fmt.Errorf("%w: %q: want out, in, undeliverable, bounce, complaint, unsubscribe or resubscribe", ErrInvalid, r.Type)
	}
	if r.Until != nil {
		if !r.Until.After(now) {
			return e, "until", fmt.Errorf("%w: must be in the future", ErrInvalid)
		}
		e.Until = *r.Until
	}
	if err := e.Validate(); err != nil {
		return e, fieldOf(err), err
	}
	return e, "", nil
}

// scope reads Scope or Category.
func (r Report) scope() (Scope, string, error) {
	if r.Scope != "" && r.Category != "" {
		return Scope{}, "category", fmt.Errorf("%w: give scope or category, not both", ErrInvalid)
	}
	if r.Scope != "" {
		sc, err := ParseScope(r.Scope)
		if err != nil {
			return Scope{}, "scope", err
		}
		return sc, "", nil
	}
	if r.Category != "" {
		if err := tasks.CheckCategory(r.Category); err != nil {
			return Scope{}, "category", fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return Categories(r.Category), "", nil
	}
	return AllCategories(), "", nil
}

// fieldOf names the Report field an Event.Validate error is about.
func fieldOf(err error) string {
	for _, f := range []string{"code", "ref", "until", "scope"} {
		if strings.Contains(err.Error(), ": "+f) {
			return f
		}
	}
	return "type"
}
