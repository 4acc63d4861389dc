package consent_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/tasks"
)

// The customer-service window runs 24 h from the latest inbound message; a
// free-form WhatsApp message outside it is refused, a template never; the
// key holds no number and lives as long as the window.
func TestServiceWindow(t *testing.T) {
	clock := &manualClock{t: time.UnixMilli(1_716_873_600_000)}
	b := setup(t, clock, consent.Options{})
	ctx := context.Background()
	to := "+14155550100"
	text := tasks.NewWhatsAppText(b.tenant, to, "hi")
	tmpl := tasks.NewWhatsAppTemplate(b.tenant, to, "hello_world", "")
	if err := b.store.CheckWindow(ctx, text, clock.Now()); !errors.Is(err, consent.ErrWindowClosed) {
		t.Fatalf("no inbound yet: %v, want ErrWindowClosed", err)
	}
	if err := b.store.CheckWindow(ctx, tmpl, clock.Now()); err != nil {
		t.Fatalf("a template: %v", err)
	}
	wrote := clock.Now().Add(-time.Hour)
	if err := b.store.RecordInbound(ctx, b.tenant, tasks.WhatsApp, "+1 415 555 0100", wrote); err != nil {
		t.Fatal(err)
	}
	// An older message does not move the window back.
	if err := b.store.RecordInbound(ctx, b.tenant, tasks.WhatsApp, to, wrote.Add(-2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	w, err := b.store.Window(ctx, b.tenant, tasks.WhatsApp, to)
	if err != nil || !w.LastInbound.Equal(wrote) || !w.Closes.Equal(wrote.Add(consent.ServiceWindow)) {
		t.Fatalf("window %+v, %v; want from %v", w, err, wrote)
	}
	if err := b.store.CheckWindow(ctx, text, clock.Now()); err != nil {
		t.Fatalf("inside the window: %v", err)
	}
	if err := b.store.CheckWindow(ctx, text, wrote.Add(consent.ServiceWindow)); !errors.Is(err, consent.ErrWindowClosed) {
		t.Fatalf("at its close: %v, want ErrWindowClosed", err)
	}
	key := b.store.InboundKey(b.tenant, tasks.WhatsApp, to)
	if strings.Contains(key, "4155550100") {
		t.Fatalf("key %q holds the number", key)
	}
	ttl := b.rdb.PTTL(ctx, key).Val()
	if want := consent.ServiceWindow - time.Hour; ttl > want || ttl < want-time.Minute {
		t.Fatalf("TTL %v, want about %v", ttl, want)
	}
	// SMS has no window: its notifications pass.
	if err := b.store.CheckWindow(ctx, tasks.NewSMS(b.tenant, to, "hi"), clock.Now()); err != nil {
		t.Fatal(err)
	}
}
