// Package inbound acts on the SMS recipients send back: an opt-out keyword
// (STOP and the FCC's other words, and the tenant's own) suppresses at
// once, START lifts it, HELP gets the tenant's help text, and a message
// that reads like a revocation without being a keyword ("please stop
// texting me") is recorded in the recipient's ledger for review — never
// ignored. It knows no provider: sender/twilio's inbound route parses and
// authenticates the provider's webhook and hands each message here.
//
// A reply (the tenant's reply-stop, reply-start or reply-help text) goes at
// most once per keyword and recipient within ReplyWindow, as one SMS of
// category plans.ReplyCategory from the number the recipient texted,
// through the priority lane: the FCC allows one confirmation of an opt-out
// (47 CFR 64.1200(a)(12)), and nothing else — never marketing.
package inbound

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
)

// PromotionsCategory is the category a WhatsApp "Stop promotions" tap opts
// the recipient out of.
const PromotionsCategory = "marketing"

// ReplyWindow is how long after a reply to a keyword no other reply to the
// same keyword goes to the same recipient.
const ReplyWindow = 5 * time.Minute

// ErrInvalid reports a message that cannot be acted on (no recipient, a
// bad tenant).
var ErrInvalid = errors.New("inbound: invalid message")

// ErrNotOwned reports a message sent to a number or messaging profile the
// tenant does not own (its sms:inbound entries do not name it): it is not
// the tenant's to act on, and nothing is done.
var ErrNotOwned = errors.New("inbound: not sent to one of the tenant's numbers or messaging profiles")

// Message is one SMS (or WhatsApp message) a recipient sent to a tenant's number.
type Message struct {
	Tenant string
	// Channel is what it came on: tasks.SMS (""), or tasks.WhatsApp, whose
	// keywords are the SMS ones and whose opt-outs hold for WhatsApp.
	Channel tasks.Channel
	// StopPromotions: the recipient tapped WhatsApp's "Stop promotions"
	// button of a marketing template: an opt-out of PromotionsCategory.
	StopPromotions bool
	// From is the recipient who wrote (E.164); To the tenant's number they
	// wrote to (the reply goes from it).
	From, To string
	// Profile is the messaging profile (Telnyx) or Messaging Service
	// (Twilio) the message came through, "" when the provider names none.
	Profile string
	Body    string
	// Ref is the provider's id of the message (the ledger's ref).
	Ref string
}

// Outcome is what Handle did.
type Outcome struct {
	Intent  consent.Intent
	Keyword string
	// Event is what was recorded in the ledger (zero when nothing was).
	Event consent.Event
	// Reply is the id of the reply enqueued, "" when none.
	Reply string
}

// Enqueuer puts a reply on its way (tasks.Enqueue into the queue the rules
// route it to).
type Enqueuer func(ctx context.Context, n tasks.Notification) error

// Handler acts on inbound messages.
type Handler struct {
	store   *consent.Store
	policy  func() plans.Policy
	enqueue Enqueuer
	log     *slog.Logger
}

// New returns a handler over store, under the rules policy gives, sending
// replies with enqueue (nil: no replies).
func New(store *consent.Store, policy func() plans.Policy, enqueue Enqueuer, log *slog.Logger) *Handler {
	return &Handler{store: store, policy: policy, enqueue: enqueue, log: log}
}

// Owns reports ErrNotOwned when m was sent to a number or messaging
// profile m.Tenant does not own: a route checks it before it spends the
// event's id on its replay guard.
func (h *Handler) Owns(m Message) error {
	if !h.policy().OwnsInbound(m.Tenant, m.To, m.Profile) {
		return fmt.Errorf("%w: tenant %s names neither %s nor the messaging profile %q in sms:inbound", ErrNotOwned, m.Tenant, tasks.Mask(tasks.NormalizePhone(m.To)), m.Profile)
	}
	return nil
}

// Handle classifies m and acts on it. A message that is no keyword and no
// revocation changes nothing; an SMS sent to a number or messaging profile
// the tenant does not own (plans: TENANT/sms:inbound=…) is refused with
// ErrNotOwned, whatever it says (DESIGN.md invariant 24). A WhatsApp
// message's webhook was bound to its tenant by the phone-number ids of the
// tenant's credentials (sender/whatsapp) before it got here.
func (h *Handler) Handle(ctx context.Context, m Message) (Outcome, error) {
	if err := tasks.CheckTenant(m.Tenant); err != nil {
		return Outcome{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	from := tasks.NormalizePhone(m.From)
	if !tasks.IsE164(from) {
		return Outcome{}, fmt.Errorf("%w: From is not an E.164 number", ErrInvalid)
	}
	ch := m.Channel
	if ch == "" {
		ch = tasks.SMS
	}
	p := h.policy()
	if ch == tasks.SMS { // a WhatsApp webhook is bound to the phone-number ids of the tenant's credentials
		if err := h.Owns(m); err != nil {
			return Outcome{}, err
		}
	}
	rules := p.Consent(m.Tenant, tasks.SMS) // the keywords and replies are the SMS ones
	c := consent.Classify(m.Body, rules.Keywords)
	if m.StopPromotions {
		c = consent.Classification{Intent: consent.IntentOptOut, Keyword: "STOP PROMOTIONS"}
	}
	out := Outcome{Intent: c.Intent, Keyword: c.Keyword}
	e, reply, err := h.event(ctx, m, ch, from, c, rules.OptOut)
	if err != nil || (e == nil && reply == "") {
		return out, err
	}
	if e != nil {
		rec, err := h.store.Record(ctx, m.Tenant, ch, from, *e)
		if err != nil {
			return out, err
		}
		out.Event = rec
		h.log.Info("inbound message recorded", "tenant", m.Tenant, "channel", string(ch), "intent", c.Intent.String(), "keyword", c.Keyword, "scope", rec.Scope.String())
	}
	text := rules.Replies[reply]
	if text == "" || h.enqueue == nil {
		return out, nil
	}
	first, err := h.store.Once(ctx, m.Tenant, ch, from, "reply-"+reply, ReplyWindow)
	if err != nil {
		return out, err
	}
	if !first {
		h.log.Info("inbound SMS: a reply to this keyword went to the recipient within the window; no other", "tenant", m.Tenant, "keyword", c.Keyword, "window", ReplyWindow)
		return out, nil
	}
	n := tasks.NewSMS(m.Tenant, from, text)
	if to := tasks.NormalizePhone(m.To); tasks.IsE164(to) {
		n.From = to
	}
	if ch == tasks.WhatsApp {
		// Inside the window the recipient's message just opened, from the
		// business number (its phone-number id) it wrote to.
		n = tasks.NewWhatsAppText(m.Tenant, from, text)
		n.From = m.To
	}
	n.Category = plans.ReplyCategory
	if err := h.enqueue(ctx, n); err != nil {
		return out, fmt.Errorf("inbound: reply: %w", err)
	}
	out.Reply = n.ID
	return out, nil
}

// event is what a classified message records and which reply it gets.
func (h *Handler) event(ctx context.Context, m Message, ch tasks.Channel, from string, c consent.Classification, optout string) (*consent.Event, string, error) {
	switch c.Intent {
	case consent.IntentOptOut:
		scope := consent.AllCategories()
		if m.StopPromotions {
			scope = consent.Categories(PromotionsCategory)
		} else if optout == plans.OptOutCategory {
			last, err := h.store.LastCategory(ctx, m.Tenant, ch, from)
			if err != nil {
				return nil, "", err
			}
			if last != "" {
				scope = consent.Categories(last)
			}
		}
		return &consent.Event{Action: consent.OptOut, Source: consent.SourceKeyword, Scope: scope, Keyword: c.Keyword, Ref: m.Ref}, plans.ReplyStop, nil
	case consent.IntentOptIn:
		return &consent.Event{Action: consent.OptIn, Source: consent.SourceKeyword, Scope: consent.AllCategories(), Keyword: c.Keyword, Ref: m.Ref}, plans.ReplyStart, nil
	case consent.IntentHelp:
		return nil, plans.ReplyHelp, nil
	case consent.IntentReview:
		return &consent.Event{Action: consent.Review, Source: consent.SourceKeyword, Keyword: c.Keyword, Ref: m.Ref}, "", nil
	}
	return nil, "", nil
}
