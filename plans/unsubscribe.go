package plans

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/tasks"
)

// ErrUnsubscribeRequired reports bulk mail (a category marked
// email[.CATEGORY]:bulk) that carries no List-Unsubscribe and gets no
// default from an unsubscribe= rule. It comes together with a
// *tasks.FieldError naming list_unsubscribe, whose message the error
// carries, so errors.Is(err, tasks.ErrInvalid) holds too.
var ErrUnsubscribeRequired = errors.New("bulk mail needs a List-Unsubscribe")

// HostedUnsubscribe is the unsubscribe= target that asks for Sluice's own
// one-click unsubscribe link (package unsubscribe, served by sluice api).
const HostedUnsubscribe = "hosted"

// Hosted reports whether emails of this match carry Sluice's own
// one-click unsubscribe link (email[.CATEGORY]:unsubscribe=hosted),
// besides any List-Unsubscribe of their own.
func (m Match) Hosted() bool { return m.Unsubscribe == HostedUnsubscribe }

// ListUnsubscribe is the List-Unsubscribe an email of this match is sent
// with, before a hosted link is added: its own, else the unsubscribe=
// default with {id} replaced by the notification id, else "".
func (m Match) ListUnsubscribe(n tasks.Notification) string {
	if n.ListUnsubscribe != "" || m.Unsubscribe == "" || m.Hosted() {
		return n.ListUnsubscribe
	}
	return strings.ReplaceAll(m.Unsubscribe, "{id}", n.ID)
}

// CheckUnsubscribe reports whether the email n may be sent under this
// match: bulk mail needs a List-Unsubscribe (RFC 8058; Gmail and Yahoo
// require it), its own or the default of an unsubscribe= rule. The error
// wraps ErrUnsubscribeRequired and a *tasks.FieldError for
// list_unsubscribe. Producers (the API, sluice enqueue) check it before
// enqueueing; the worker checks it again before sending, under the plans
// then in force.
func (m Match) CheckUnsubscribe(n tasks.Notification) error {
	if n.Channel != tasks.Email || !m.Bulk || m.Hosted() || m.ListUnsubscribe(n) != "" {
		return nil
	}
	cat := n.CategoryOrDefault()
	rule := "email:bulk"
	if cat != tasks.DefaultCategory {
		rule = "email." + cat + ":bulk"
	}
	fe := &tasks.FieldError{Field: "list_unsubscribe", Reason: fmt.Sprintf(
		"is required: category %s is bulk mail (%s); give an https URL and/or a mailto: URI, or a default with an unsubscribe= rule", cat, rule)}
	return unsubscribeError{fe}
}

// ErrUserRequired: the rules require the notification to name its person
// (CHANNEL[.CATEGORY]:user=required) and it does not.
var ErrUserRequired = errors.New("plans: user required")

// CheckUser reports whether n names its person where the rules require it:
// a *tasks.FieldError on user that is ErrUserRequired too.
func (m Match) CheckUser(n tasks.Notification) error {
	if !m.RequireUser || n.User != "" {
		return nil
	}
	fe := &tasks.FieldError{Field: "user", Reason: fmt.Sprintf(
		"is required: the rules cap %s %s per person (user=required); give the person's id", n.Channel, n.CategoryOrDefault())}
	return userError{fe}
}

type userError struct{ fe *tasks.FieldError }

func (e userError) Error() string   { return e.fe.Error() }
func (e userError) Unwrap() []error { return []error{e.fe, ErrUserRequired} }

// CheckNotification is every check of n the rules make before it is
// queued: CheckUnsubscribe, then CheckUser.
func (m Match) CheckNotification(n tasks.Notification) error {
	if err := m.CheckUnsubscribe(n); err != nil {
		return err
	}
	return m.CheckUser(n)
}

// unsubscribeError is a *tasks.FieldError that is ErrUnsubscribeRequired too.
type unsubscribeError struct{ fe *tasks.FieldError }

func (e unsubscribeError) Error() string   { return e.fe.Error() }
func (e unsubscribeError) Unwrap() []error { return []error{e.fe, ErrUnsubscribeRequired} }

// UsesHostedUnsubscribe reports whether an entry asks for hosted one-click
// unsubscribe links (the deployment then needs SLUICE_UNSUBSCRIBE_URL).
func (p Policy) UsesHostedUnsubscribe() bool {
	for _, e := range p.entries {
		if e.Kind == KindUnsubscribe && e.Target == HostedUnsubscribe {
			return true
		}
	}
	return false
}
