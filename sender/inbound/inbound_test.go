package inbound_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/sender/inbound"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

type outbox struct {
	mu   sync.Mutex
	sent []tasks.Notification
}

func (o *outbox) enqueue(_ context.Context, n tasks.Notification) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sent = append(o.sent, n)
	return nil
}

func (o *outbox) all() []tasks.Notification {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]tasks.Notification(nil), o.sent...)
}

func setup(t *testing.T, rules string) (*inbound.Handler, *consent.Store, *outbox, *redis.Client) {
	t.Helper()
	_, rdb := redistest.New(t)
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte("inbound-test-secret-0123456789")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	store, err := consent.NewStore(rdb, lim, consent.Options{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := plans.Parse(rules)
	if err != nil {
		t.Fatal(err)
	}
	o := &outbox{}
	return inbound.New(store, func() plans.Policy { return p }, o.enqueue, slog.New(slog.DiscardHandler)), store, o, rdb
}

const rules = "sms:recipient=1/1m,sms:reply-stop=Acme: unsubscribed%2C reply START to resume,sms:reply-start=Acme: welcome back,sms:reply-help=Acme help: acme.example/help,acme/sms:keywords-stop=BASTA,acme/sms:inbound=+15005550006,globex/sms:inbound=+15005550007"

// STOP opts out of every category and gets one confirmation from the
// number texted, in the consent-reply category (exempt: the priority
// lane); a second STOP within the window records again but replies
// nothing; START lifts it; the tenant's own word works; HELP changes
// nothing and answers; a revocation in words is kept for review.
func TestInboundKeywords(t *testing.T) {
	t.Parallel()
	h, store, out, _ := setup(t, rules)
	ctx := context.Background()
	const from, to = "+14155550190", "+15005550006"
	send := func(body string) inbound.Outcome {
		t.Helper()
		o, err := h.Handle(ctx, inbound.Message{Tenant: "acme", From: from, To: to, Body: body, Ref: "SM1"})
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	blocked := func(cat string) bool {
		t.Helper()
		v, err := store.Check(ctx, "acme", tasks.SMS, from, cat, false)
		if err != nil {
			t.Fatal(err)
		}
		return v.Blocked()
	}

	o := send("  stop ")
	if o.Intent != consent.IntentOptOut || o.Reply == "" || !blocked("marketing") || !blocked("alerts") {
		t.Fatalf("STOP: %+v", o)
	}
	replies := out.all()
	if len(replies) != 1 || replies[0].To != from || replies[0].From != to || replies[0].Category != plans.ReplyCategory ||
		replies[0].Body != "Acme: unsubscribed, reply START to resume" {
		t.Fatalf("replies %+v", replies)
	}
	p, _ := plans.Parse(rules)
	if !p.Match("acme", tasks.SMS, plans.ReplyCategory).Exempt {
		t.Fatal("the reply category is not exempt: the confirmation would wait behind marketing")
	}
	if o := send("STOP"); o.Reply != "" || len(out.all()) != 1 {
		t.Fatalf("a second STOP within the window replied: %+v", o)
	}
	if o := send("Start"); o.Intent != consent.IntentOptIn || blocked("marketing") {
		t.Fatalf("START: %+v", o)
	}
	if o := send("basta"); o.Intent != consent.IntentOptOut || !blocked("marketing") {
		t.Fatalf("the tenant's own keyword: %+v", o)
	}
	if o := send("HELP"); o.Intent != consent.IntentHelp || o.Event.Action != "" || o.Reply == "" {
		t.Fatalf("HELP: %+v", o)
	}
	if o := send("please stop texting me"); o.Intent != consent.IntentReview || o.Event.Action != consent.Review {
		t.Fatalf("a revocation in words: %+v", o)
	}
	if o := send("thanks!"); o.Intent != consent.IntentNone || o.Event.Action != "" {
		t.Fatalf("no keyword: %+v", o)
	}
	ledger, err := store.Ledger(ctx, "acme", tasks.SMS, from)
	if err != nil {
		t.Fatal(err)
	}
	var actions []consent.Action
	for _, e := range ledger {
		actions = append(actions, e.Action)
		if e.Source != consent.SourceKeyword || e.Ref != "SM1" {
			t.Errorf("ledger event %+v", e)
		}
	}
	want := []consent.Action{consent.OptOut, consent.OptOut, consent.OptIn, consent.OptOut, consent.Review}
	if len(actions) != len(want) {
		t.Fatalf("ledger %v, want %v", actions, want)
	}
	for i := range want {
		if actions[i] != want[i] {
			t.Fatalf("ledger %v, want %v", actions, want)
		}
	}
	// globex has no BASTA.
	if o, _ := h.Handle(ctx, inbound.Message{Tenant: "globex", From: from, To: "+15005550007", Body: "BASTA"}); o.Intent == consent.IntentOptOut {
		t.Fatal("acme's keyword acts for globex")
	}
}

// Under sms:optout=category a STOP opts out of the category last sent to
// the recipient only; with none remembered, of every category.
func TestInboundOptOutByCategory(t *testing.T) {
	t.Parallel()
	h, store, _, rdb := setup(t, "sms:recipient=1/1m,sms:optout=category,acme/sms:inbound=MG0123")
	ctx := context.Background()
	const from = "+14155550191"
	if _, err := h.Handle(ctx, inbound.Message{Tenant: "acme", From: from, Body: "STOP", Profile: "MG0123"}); err != nil {
		t.Fatal(err)
	}
	if v, _ := store.Check(ctx, "acme", tasks.SMS, from, "alerts", false); v.Reason != consent.BlockedAll {
		t.Fatalf("no category remembered: %+v", v)
	}
	const other = "+14155550192"
	if err := rdb.Set(ctx, store.LastKey("acme", tasks.SMS, other), "promo", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Handle(ctx, inbound.Message{Tenant: "acme", From: other, Body: "STOP", Profile: "MG0123"}); err != nil {
		t.Fatal(err)
	}
	for cat, want := range map[string]consent.Reason{"promo": consent.BlockedCategory, "alerts": consent.NotBlocked} {
		if v, _ := store.Check(ctx, "acme", tasks.SMS, other, cat, false); v.Reason != want {
			t.Fatalf("%s: %+v, want %v", cat, v, want)
		}
	}
}

func TestInboundRefusesBadInput(t *testing.T) {
	t.Parallel()
	h, _, out, _ := setup(t, rules)
	for _, m := range []inbound.Message{
		{Tenant: "", From: "+14155550190", Body: "STOP"},
		{Tenant: "acme", From: "nope", Body: "STOP"},
		{Tenant: "a|b", From: "+14155550190", Body: "STOP"},
	} {
		if _, err := h.Handle(context.Background(), m); err == nil {
			t.Errorf("%+v accepted", m)
		}
	}
	if len(out.all()) != 0 {
		t.Fatal("a reply to a refused message")
	}
}

// An inbound message is the tenant's only when it was sent to one of the
// numbers or messaging profiles its sms:inbound entries name (issue 50: a
// STOP posted to another tenant's route opted the number out there too):
// another tenant's number, no number, or a tenant that names none is
// refused with ErrNotOwned, and nothing is recorded.
func TestInboundOnlyForItsOwner(t *testing.T) {
	t.Parallel()
	h, store, out, _ := setup(t, rules+",beta/sms:inbound=+15005550008|tx-profile-1")
	ctx := context.Background()
	const from = "+14155550192"
	for _, m := range []inbound.Message{
		{Tenant: "beta", From: from, To: "+15005550006", Body: "STOP"}, // acme's number
		{Tenant: "beta", From: from, Body: "STOP"},                     // none
		{Tenant: "beta", From: from, To: "+15005550006", Body: "STOP", Profile: "tx-profile-2"},
		{Tenant: "zeta", From: from, To: "+15005550006", Body: "STOP"}, // a tenant that names none
	} {
		if _, err := h.Handle(ctx, m); !errors.Is(err, inbound.ErrNotOwned) {
			t.Errorf("%+v: %v, want ErrNotOwned", m, err)
		}
		if st, _ := store.State(ctx, m.Tenant, tasks.SMS, from); !st.Empty() {
			t.Errorf("%+v recorded %+v", m, st)
		}
	}
	for _, m := range []inbound.Message{
		{Tenant: "beta", From: from, To: "+1 500 555 0008", Body: "STOP"},             // its number, written otherwise
		{Tenant: "beta", From: "+14155550193", Body: "STOP", Profile: "tx-profile-1"}, // its profile
	} {
		if o, err := h.Handle(ctx, m); err != nil || o.Intent != consent.IntentOptOut {
			t.Errorf("%+v: %+v, %v; want an opt-out", m, o, err)
		}
	}
	_ = out
}
