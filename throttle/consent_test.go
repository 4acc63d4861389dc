package throttle_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// A consent check inside Reserve: a booking made before the opt-out is
// released when its task asks again (nothing stays counted for a send that
// will not happen), the decision names the reason, the mark's code and
// when it was recorded, and an admission remembers the category in the
// last-category key.
func TestReserveConsent(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	ctx := context.Background()
	store, err := consent.NewStore(b.client, b.lim, consent.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const to = "+14155550100"
	rule := throttle.Limit{Scope: "sms:recipient", Subject: to, Rule: throttle.Rule{Limit: 1, Window: time.Minute}}
	last := b.lim.SubjectKey(b.group, "last:sms", to)
	cc := &throttle.ConsentCheck{Key: store.Key(b.group, tasks.SMS, to), Category: "marketing", LastKey: last, LastTTL: time.Hour}
	opts := throttle.ReserveOptions{Policy: throttle.AtLeastOnce, Book: true, Consent: cc}
	first, err := b.lim.Reserve(ctx, b.group, uuid.NewString(), opts, rule)
	if err != nil || first.Status != throttle.StatusAdmitted {
		t.Fatalf("first: %+v, %v", first, err)
	}
	if got := b.client.Get(ctx, last).Val(); got != "marketing" {
		t.Fatalf("last-category key holds %q, want marketing", got)
	}
	id := uuid.NewString()
	booked, err := b.lim.Reserve(ctx, b.group, id, opts, rule)
	if err != nil || booked.Status != throttle.StatusBooked {
		t.Fatalf("second: %+v, %v; want booked", booked, err)
	}
	e, err := store.Record(ctx, b.group, tasks.SMS, to, consent.Event{Action: consent.OptOut, Source: consent.SourceKeyword, Scope: consent.AllCategories(), Keyword: "STOP", Code: 7})
	if err != nil {
		t.Fatal(err)
	}
	d, err := b.lim.Reserve(ctx, b.group, id, opts, rule)
	if err != nil || d.Status != throttle.StatusBlocked || d.BlockReason != throttle.BlockedAll || d.BlockValue != 7 || !d.BlockedSince.Equal(e.At) {
		t.Fatalf("after the opt-out: %+v, %v; want blocked (every category), code 7, since %v", d, err, e.At)
	}
	key, _ := b.lim.Key(b.group, rule)
	if n := b.client.ZCard(ctx, key).Val(); n != 1 {
		t.Fatalf("the window holds %d entries after the blocked booking, want 1 (the booking released)", n)
	}
	// An exempt category still goes; an opt-out of it by name blocks it even so.
	ex := *cc
	ex.Category, ex.Exempt = "otp", true
	otp := throttle.Limit{Scope: "sms.otp:recipient", Subject: to, Rule: throttle.Rule{Limit: 5, Window: time.Minute}}
	if d, err := b.lim.Reserve(ctx, b.group, uuid.NewString(), throttle.ReserveOptions{Policy: throttle.AtLeastOnce, Consent: &ex}, otp); err != nil || d.Status != throttle.StatusAdmitted {
		t.Fatalf("exempt category after an opt-out of every category: %+v, %v; want admitted", d, err)
	}
	if _, err := store.Record(ctx, b.group, tasks.SMS, to, consent.Event{Action: consent.OptOut, Source: consent.SourceAPI, Scope: consent.Categories("otp")}); err != nil {
		t.Fatal(err)
	}
	if d, err := b.lim.Reserve(ctx, b.group, uuid.NewString(), throttle.ReserveOptions{Policy: throttle.AtLeastOnce, Consent: &ex}, otp); err != nil || d.BlockReason != throttle.BlockedCategory {
		t.Fatalf("exempt category opted out by name: %+v, %v; want blocked (category)", d, err)
	}
	// A consent check needs a whole spec.
	for _, bad := range []throttle.ReserveOptions{
		{Policy: throttle.AtLeastOnce, Consent: &throttle.ConsentCheck{Key: cc.Key}},
		{Policy: throttle.AtLeastOnce, Consent: &throttle.ConsentCheck{Key: cc.Key, Category: "x", LastKey: last}},
	} {
		if _, err := b.lim.Reserve(ctx, b.group, uuid.NewString(), bad, rule); err == nil {
			t.Errorf("Reserve accepted %+v", bad.Consent)
		}
	}
}
