package delivery_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/redistest"
	"github.com/sluicehq/sluice/throttle"
)

func newStore(t *testing.T) (*delivery.Store, *redistest.Server) {
	t.Helper()
	srv, rdb := redistest.New(t)
	lim, err := throttle.New(rdb, throttle.Options{Secret: []byte("delivery-test-secret"), CompactMembers: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return delivery.NewStore(rdb, lim), srv
}

// Statuses move only forward: a late or repeated callback changes nothing,
// the first final status stays, and each write starts the TTL again.
func TestStatusMovesOnlyForward(t *testing.T) {
	t.Parallel()
	s, srv := newStore(t)
	ctx := context.Background()
	rdb := srv.Client(t)
	const sid = "SM0123456789abcdef0123456789abcdef"
	steps := []struct {
		status  delivery.Status
		code    int
		applied bool
		want    delivery.Status // recorded afterwards
	}{
		{delivery.Queued, 0, true, delivery.Queued},
		{delivery.Sent, 0, true, delivery.Sent},
		{delivery.Queued, 0, false, delivery.Sent},
		{delivery.Delivered, 0, true, delivery.Delivered},
		{delivery.Sent, 0, false, delivery.Delivered},            // late
		{delivery.Delivered, 0, false, delivery.Delivered},       // repeated
		{delivery.Undelivered, 30007, false, delivery.Delivered}, // a second final status
		{delivery.Read, 0, true, delivery.Read},                  // read receipts come after
		{delivery.Failed, 30008, false, delivery.Read},
	}
	if r, err := s.Get(ctx, "acme", "n-1"); err != nil || r != nil {
		t.Fatalf("Get before any report = %+v, %v", r, err)
	}
	var last delivery.Status
	for i, st := range steps {
		applied, prev, err := s.Update(ctx, "acme", "n-1", delivery.Record{Status: st.status, ErrorCode: st.code, MessageSID: sid}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if applied != st.applied {
			t.Fatalf("step %d (%s): applied %v, want %v", i, st.status, applied, st.applied)
		}
		if (prev == nil) != (i == 0) || prev != nil && prev.Status != last {
			t.Fatalf("step %d (%s): previous record %+v, want status %q", i, st.status, prev, last)
		}
		r, err := s.Get(ctx, "acme", "n-1")
		if err != nil || r == nil || r.Status != st.want || r.MessageSID != sid || r.At.IsZero() || time.Since(r.At) > time.Minute {
			t.Fatalf("step %d (%s): recorded %+v, %v; want %s", i, st.status, r, err, st.want)
		}
		last = r.Status
	}
	if ttl := rdb.PTTL(ctx, s.Key("acme", "n-1")).Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("record TTL %v, want up to 1h", ttl)
	}
	// Another tenant's notification of the same id is another record.
	if r, _ := s.Get(ctx, "globex", "n-1"); r != nil {
		t.Fatalf("globex sees acme's record: %+v", r)
	}
}

// An undelivered report keeps its error code; the record names no recipient.
func TestRecordKeepsTheErrorCode(t *testing.T) {
	t.Parallel()
	s, srv := newStore(t)
	ctx := context.Background()
	if _, _, err := s.Update(ctx, "acme", "n-2", delivery.Record{Status: delivery.Undelivered, ErrorCode: 30007, MessageSID: "SMabc"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	r, err := s.Get(ctx, "acme", "n-2")
	if err != nil || r == nil || r.Status != delivery.Undelivered || r.ErrorCode != 30007 || r.Status.Outcome() != "undelivered" {
		t.Fatalf("record %+v, %v", r, err)
	}
	raw := srv.Client(t).Get(ctx, s.Key("acme", "n-2")).Val()
	if !strings.HasPrefix(raw, "5:") || !strings.HasSuffix(raw, ":undelivered:30007:SMabc") {
		t.Fatalf("stored %q", raw)
	}
}

// A Telnyx message id (a UUID) is recorded and read back as it is.
func TestUpdateTakesUUIDs(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	const id = "40385f64-5717-4562-b3fc-2c963f66afa6"
	if _, _, err := s.Update(ctx, "acme", "n-uuid", delivery.Record{Status: delivery.Delivered, MessageSID: id}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Get(ctx, "acme", "n-uuid"); err != nil || r == nil || r.MessageSID != id {
		t.Fatalf("read back %+v, %v", r, err)
	}
}

// What cannot be recorded is refused before Redis is asked.
func TestUpdateRefusesBadReports(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	for _, r := range []delivery.Record{
		{Status: "bounced"},
		{Status: delivery.Failed, ErrorCode: -1},
		{Status: delivery.Failed, ErrorCode: 1000000},
		{Status: delivery.Sent, MessageSID: "SM:1"},
		{Status: delivery.Sent, MessageSID: strings.Repeat("a", 65)},
		{Status: delivery.Sent, MessageSID: strings.Repeat("-", 65)},
		{Status: delivery.Sent, MessageSID: "40385f64 5717"},
	} {
		if _, _, err := s.Update(context.Background(), "acme", "n-3", r, time.Hour); !errors.Is(err, delivery.ErrInvalid) {
			t.Errorf("Update(%+v) = %v, want ErrInvalid", r, err)
		}
	}
}

// A suppressed recipient is found under any spelling of its number, only in
// its tenant's list, by a key that does not contain it; it expires, and can
// be taken off.
func TestSuppressionList(t *testing.T) {
	t.Parallel()
	s, srv := newStore(t)
	ctx := context.Background()
	rdb := srv.Client(t)
	if err := s.Suppress(ctx, "acme", tasks.SMS, "+14155550100", 30005, time.Hour); err != nil {
		t.Fatal(err)
	}
	if code, ok, err := s.Suppressed(ctx, "acme", tasks.SMS, "+1 (415) 555-0100"); err != nil || !ok || code != 30005 {
		t.Fatalf("Suppressed = %d, %v, %v; want 30005", code, ok, err)
	}
	if _, ok, _ := s.Suppressed(ctx, "globex", tasks.SMS, "+14155550100"); ok {
		t.Fatal("globex's list holds acme's suppression")
	}
	if _, ok, _ := s.Suppressed(ctx, "acme", tasks.SMS, "+14155550101"); ok {
		t.Fatal("another number is suppressed")
	}
	keys := rdb.Keys(ctx, "*").Val()
	if len(keys) != 1 || strings.Contains(keys[0], "4155550100") || !strings.Contains(keys[0], "{acme}") {
		t.Fatalf("keys %v: want one key in acme's slot without the number", keys)
	}
	if ttl := rdb.PTTL(ctx, keys[0]).Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("TTL %v", ttl)
	}
	if was, err := s.Unsuppress(ctx, "acme", tasks.SMS, "+14155550100"); err != nil || !was {
		t.Fatalf("Unsuppress = %v, %v", was, err)
	}
	if _, ok, _ := s.Suppressed(ctx, "acme", tasks.SMS, "+14155550100"); ok {
		t.Fatal("still suppressed after Unsuppress")
	}
}

func TestCodeClass(t *testing.T) {
	t.Parallel()
	for code, want := range map[int]string{0: "none", 21211: "recipient", 30005: "recipient", 30003: "recipient", 30007: "filtered", 30008: "other", 11200: "other"} {
		if got := delivery.CodeClass(code); got != want {
			t.Errorf("CodeClass(%d) = %q, want %q", code, got, want)
		}
	}
}

func TestStatuses(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]string{"queued": "", "sent": "", "delivered": "delivered", "read": "delivered", "undelivered": "undelivered",
		"partially_delivered": "undelivered", "failed": "failed", "canceled": "failed"} {
		st, err := delivery.ParseStatus(s)
		if err != nil || st.Outcome() != want || st.Final() != (want != "") {
			t.Errorf("%s: %q, final %v, %v; want outcome %q", s, st.Outcome(), st.Final(), err, want)
		}
	}
	for _, s := range []string{"", "Delivered", "receiving", "received", "bounced"} {
		if _, err := delivery.ParseStatus(s); !errors.Is(err, delivery.ErrInvalid) {
			t.Errorf("ParseStatus(%q) = %v, want ErrInvalid", s, err)
		}
	}
}
