package telnyx_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/consent"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/sender/telnyx"
	"github.com/sluicehq/sluice/services"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/redistest"
)

// The sender speaks Telnyx's wire format (the fake checks the bearer key
// and reads the JSON), asks for its delivery reports per notification, and
// classifies refusals: 429 holds the provider, a suppress code marks the
// number.
func TestSend(t *testing.T) {
	t.Parallel()
	f := fakes.NewTelnyxAPI(t)
	s, err := telnyx.NewSender(telnyx.Config{BaseURL: f.URL, APIKey: f.APIKey, From: "+15005550006", MessagingProfileID: "prof-1",
		WebhookURL: "https://sluice.example.com/", Suppress: map[int]bool{40300: true}, SuppressFor: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	n := tasks.NewSMS("acme", "+14155550100", "hi")
	if err := s.Send(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	d := f.Deliveries()[0]
	if d.ID != n.ID || d.To != n.To || d.From != "+15005550006" || d.Body != "hi" || d.StatusCallback != "https://sluice.example.com/v1/callbacks/telnyx/acme/"+n.ID {
		t.Fatalf("the fake received %+v", d)
	}
	for _, c := range []struct {
		code      int
		throttled bool
		permanent bool
		suppress  bool
	}{{429, true, false, false}, {503, false, false, false}, {40300, false, true, true}, {40012, false, true, false}} {
		f.SetReply(func(string, string) (int, string) { return c.code, "2" })
		err := s.Send(context.Background(), tasks.NewSMS("acme", "+14155550100", "hi"))
		var se *sender.SendError
		if !errors.As(err, &se) || se.Throttled != c.throttled || se.Permanent != c.permanent || se.Suppress != c.suppress || (c.code > 1000 && se.Code != c.code) {
			t.Errorf("answer %d: %+v", c.code, se)
		}
	}
	f.SetReply(nil)
	mss := tasks.NewSMS("acme", "+14155550100", "hi")
	mss.MessagingServiceSID = "MG0123456789abcdef0123456789abcdef"
	var se *sender.SendError
	if err := s.Send(context.Background(), mss); !errors.As(err, &se) || !se.Permanent {
		t.Errorf("a Twilio Messaging Service through Telnyx: %v", err)
	}
}

type routes struct {
	f    *fakes.TelnyxAPI
	srv  *httptest.Server
	deps *services.Set
}

// setup mounts the routes as `sluice api` does, on a real redis-server.
func setup(t *testing.T) *routes {
	t.Helper()
	redis, rdb := redistest.New(t)
	f := fakes.NewTelnyxAPI(t)
	env := map[string]string{"SLUICE_REDIS_URL": redis.URL(), "SLUICE_SUBJECT_SECRET": "telnyx-test-secret-0123", "SLUICE_PAYLOAD_KEYS": tasks.NewKeySpec("t"),
		"SLUICE_TELNYX_PUBLIC_KEY": f.PublicKey, "SLUICE_TELNYX_WEBHOOK_URL": "https://sluice.example.com", "SLUICE_RULES": "sms:recipient=10/1m,acme/sms:inbound=+15005550006"}
	var base config.Base
	if err := config.Read(env, &base); err != nil {
		t.Fatal(err)
	}
	deps, err := services.Open(base, services.Options{Redis: rdb, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(deps.Close)
	st, err := telnyx.WebhookSettings(env)
	if err != nil {
		t.Fatal(err)
	}
	h, err := telnyx.NewWebhooks(st, base, telnyx.Deps{Redis: rdb, Limiter: deps.Limiter, Consent: deps.Consent, Log: deps.Log,
		Registry: deps.Registry, Policy: deps.Plans.Policy, Enqueue: func(context.Context, tasks.Notification) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc(telnyx.CallbackRoute, h.Callback)
	mux.HandleFunc(telnyx.InboundRoute, h.Inbound)
	r := &routes{f: f, srv: httptest.NewServer(mux), deps: deps}
	t.Cleanup(r.srv.Close)
	return r
}

type muxMounter struct{ *http.ServeMux }

func (m muxMounter) Mount(p string, h http.Handler) { m.Handle(p, h) }

// sent records what a worker records when the provider took notification
// id to number: the limiter's done record and whom it went to.
func (r *routes) sent(t *testing.T, id, number string) fakes.Delivery {
	t.Helper()
	ctx := context.Background()
	lim := r.deps.Limiter
	if err := r.deps.Redis.Set(ctx, lim.StateKey("acme", id), fmt.Sprintf("d1:%d", time.Now().UnixMilli()), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	note := delivery.NewStore(r.deps.Redis, lim).RecipientNote("acme", id, number, time.Hour)
	if err := r.deps.Redis.Set(ctx, note.Key, note.Value, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	return fakes.Delivery{ID: id, To: number, From: "+15005550006", Body: "sale", SID: "40385f64-5717-4562-b3fc-2c963f66afa6",
		StatusCallback: r.srv.URL + telnyx.CallbackPath("acme", id)}
}

func TestDeliveryReports(t *testing.T) {
	t.Parallel()
	r := setup(t)
	ctx := context.Background()
	store := delivery.NewStore(r.deps.Redis, r.deps.Limiter)
	unknown := fakes.Delivery{ID: "never-sent", SID: "x", To: "+14155550100", StatusCallback: r.srv.URL + telnyx.CallbackPath("acme", "never-sent")}
	if code, _ := r.f.Report(ctx, unknown, "delivered", 0); code != http.StatusNotFound {
		t.Errorf("a report about no notification: %d", code)
	}
	d := r.sent(t, "n-1", "+14155550100")
	body := []byte(`{"data":{"event_type":"message.finalized","id":"ev-1","payload":{"id":"m-1","to":[{"phone_number":"+14155550100","status":"delivered"}]}}}`)
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	for name, code := range map[string]func() (int, error){
		"Unsigned": func() (int, error) { return r.f.Post(ctx, d.StatusCallback, body, time.Time{}) },
		"OtherKey": func() (int, error) { return r.f.PostWith(ctx, d.StatusCallback, body, time.Now(), other) },
		"Stale": func() (int, error) {
			return r.f.Post(ctx, d.StatusCallback, body, time.Now().Add(-telnyx.Tolerance-time.Minute))
		},
		"Future": func() (int, error) {
			return r.f.Post(ctx, d.StatusCallback, body, time.Now().Add(telnyx.Tolerance+time.Minute))
		},
	} {
		if c, err := code(); err != nil || c != http.StatusForbidden {
			t.Errorf("%s: %d %v, want 403", name, c, err)
		}
	}
	if rec, _ := store.Get(ctx, "acme", "n-1"); rec != nil {
		t.Fatalf("a refused report was recorded: %+v", rec)
	}
	for _, st := range []string{"sent", "delivered", "sent"} {
		if c, err := r.f.Report(ctx, d, st, 0); err != nil || c != http.StatusNoContent {
			t.Fatalf("%s: %d %v", st, c, err)
		}
	}
	if rec, err := store.Get(ctx, "acme", "n-1"); err != nil || rec == nil || rec.Status != delivery.Delivered || rec.MessageSID != d.SID {
		t.Fatalf("record %+v, %v; want delivered with Telnyx's id", rec, err)
	}
	// The same signed webhook again changes nothing.
	if c, _ := r.f.Post(ctx, d.StatusCallback, body, time.Now()); c != http.StatusNoContent {
		t.Fatalf("first: %d", c)
	}
	if c, _ := r.f.Post(ctx, d.StatusCallback, body, time.Now()); c != http.StatusOK {
		t.Fatalf("replay: %d, want 200 (duplicate)", c)
	}

	// A final failure whose code is a suppress code marks the number.
	d2 := r.sent(t, "n-2", "+14155550101")
	if c, err := r.f.Report(ctx, d2, "delivery_failed", 40300); err != nil || c != http.StatusNoContent {
		t.Fatalf("delivery_failed: %d %v", c, err)
	}
	st, err := r.deps.Consent.State(ctx, "acme", tasks.SMS, "+14155550101")
	if err != nil || st.Undeliverable == nil || st.Undeliverable.Source != consent.SourceProvider || st.Undeliverable.Code != 40300 {
		t.Fatalf("state %+v, %v", st, err)
	}
}

func TestInboundStop(t *testing.T) {
	t.Parallel()
	r := setup(t)
	ctx := context.Background()
	url := r.srv.URL + "/v1/inbound/telnyx/acme"
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	body := []byte(`{"data":{"event_type":"message.received","id":"ev-in-1","payload":{"id":"m-in-1","from":{"phone_number":"+14155550102"},"to":[{"phone_number":"+15005550006"}],"text":"STOP"}}}`)
	if c, _ := r.f.PostWith(ctx, url, body, time.Now(), other); c != http.StatusForbidden {
		t.Fatalf("a forged STOP: %d", c)
	}
	if st, _ := r.deps.Consent.State(ctx, "acme", tasks.SMS, "+14155550102"); !st.Empty() {
		t.Fatalf("a forged STOP recorded %+v", st)
	}
	if c, err := r.f.Inbound(ctx, url, "+14155550102", "+15005550006", "Stop"); err != nil || c != http.StatusOK {
		t.Fatalf("STOP: %d %v", c, err)
	}
	st, err := r.deps.Consent.State(ctx, "acme", tasks.SMS, "+14155550102")
	if err != nil || st.All == nil || st.All.Source != consent.SourceKeyword {
		t.Fatalf("after STOP: %+v, %v", st, err)
	}
	l, _ := r.deps.Consent.Ledger(ctx, "acme", tasks.SMS, "+14155550102")
	if len(l) != 1 || l[0].Keyword != "STOP" || l[0].Ref == "" {
		t.Fatalf("ledger %+v", l)
	}
}

func FuzzParseEvent(f *testing.F) {
	f.Add([]byte(`{"data":{"event_type":"message.finalized","id":"e","payload":{"id":"m","to":[{"phone_number":"+1","status":"delivered"}],"errors":[{"code":"40300"}]}}}`))
	f.Add([]byte(`{"data":{"event_type":"message.received","id":"e","payload":{"errors":[{"code":40001}]}}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		e, err := telnyx.ParseEvent(body)
		if err != nil {
			return
		}
		if e.Type == "" || e.ID == "" {
			t.Fatalf("parsed %+v", e)
		}
		if c := e.Message.ErrorCode(); c < 0 || c > delivery.MaxErrorCode {
			t.Fatalf("error code %d", c)
		}
		_, st := e.Message.Recipient()
		if s, ok := telnyx.Status(st); ok {
			if _, err := delivery.ParseStatus(string(s)); err != nil {
				t.Fatalf("status %q maps to %q", st, s)
			}
		}
	})
}
