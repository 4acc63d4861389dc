package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/delivery"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/throttle"
	"github.com/sluicehq/sluice/worker"
)

// withBackup is cfg with a second SMS provider, "backup", at fake f, after
// the default one.
func withBackup(cfg worker.Config, f *fakes.SMSAPI, kv ...string) worker.Config {
	cfg = withEnv(cfg, append([]string{
		"SLUICE_PROVIDER_BACKUP_SMS_SENDER", "http",
		"SLUICE_PROVIDER_BACKUP_SMS_BASE_URL", f.URL,
		"SLUICE_PROVIDER_BACKUP_SMS_ACCOUNT_SID", f.AccountSID,
		"SLUICE_PROVIDER_BACKUP_SMS_AUTH_TOKEN", f.AuthToken,
	}, kv...)...)
	cfg.SMSProviders = []string{worker.DefaultProvider, "backup"}
	cfg.FailoverGrace = time.Second
	return cfg
}

// The primary's listener is gone: a priority-lane SMS goes to the backup in
// the same run (nothing is put back), each is sent once, the failures mark
// the primary down for every worker, and later OTPs pass it over without
// a request. The primary comes back: after the cooldown one send probes
// it, and traffic returns to it.
func TestPriorityFailsOverAtOnceAndComesBack(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms.otp:exempt")
	backup := fakes.NewSMSAPI(t)
	cfg := withBackup(b.cfg, backup)
	cfg.ProviderCooldown = 2 * time.Second
	// "At once" against the grace standard sends wait (the default 10 s,
	// from the primary's mark): a send that waited for it would reach the
	// backup at least 5 s after its enqueue, while each OTP reaches it
	// within a latency budget of 3 s (about 0.2 s alone; 1.05 s beside two
	// CPU hogs, which the 1 s bound of a 1 s grace counted as a failure).
	cfg.FailoverGrace = 10 * time.Second
	const budget = 3 * time.Second
	b.sms.Down(t)
	r := b.start(t, cfg)
	b.serving(t)
	var at []time.Time
	var ids []string
	for i := range 5 {
		n := tasks.NewSMS("acme", "+1415555020"+string(rune('0'+i)), "code")
		n.Category = "otp"
		ids = append(ids, n.ID)
		at = append(at, time.Now())
		b.enqueue(t, n)
		ds := backup.WaitCount(t, i+1, 10*time.Second)
		if d := ds[i].At.Sub(at[i]); d > budget {
			t.Errorf("OTP %d reached the backup %v after its enqueue; want within %v, well short of the %v grace", i, d, budget, cfg.FailoverGrace)
		}
	}
	if got := metric(t, r.reg, "sluice_failovers_total", map[string]string{"from": "default"}); got < 3 {
		t.Errorf("sluice_failovers_total{from=default} = %v; want one per OTP the primary refused (at least the 3 that marked it down)", got)
	}
	if got := metric(t, r.reg, "sluice_provider_sends_total", map[string]string{"provider": "backup"}); got != 5 {
		t.Errorf("sluice_provider_sends_total{provider=backup} = %v, want 5", got)
	}
	if qs := b.queueStats(t); qs.Retry != 0 || qs.Archived != 0 {
		t.Errorf("retried %d, archived %d: a failover is neither", qs.Retry, qs.Archived)
	}
	// Which provider took each is recorded (GET /v1/notifications/{id} shows it).
	lim, err := throttle.New(b.rdb, throttle.Options{Secret: []byte(b.cfg.SubjectSecret), CompactMembers: b.cfg.CompactMembers})
	if err != nil {
		t.Fatal(err)
	}
	store := delivery.NewStore(b.rdb, lim)
	sluicetest.Eventually(t, 5*time.Second, "every OTP's provider recorded", func() bool {
		for _, id := range ids {
			if p, err := store.Provider(context.Background(), "acme", id); err != nil || p != "backup" {
				return false
			}
		}
		return true
	})
	// Back: after the cooldown a send probes the primary and traffic returns.
	b.sms.Up(t)
	sluicetest.Eventually(t, 15*time.Second, "an OTP to reach the primary again", func() bool {
		n := tasks.NewSMS("acme", "+14155550299", "code")
		n.Category = "otp"
		before := len(backup.Deliveries())
		b.enqueue(t, n)
		sluicetest.Eventually(t, 10*time.Second, "the OTP at either provider", func() bool {
			return len(b.sms.Deliveries()) > 0 || len(backup.Deliveries()) > before
		})
		return len(b.sms.Deliveries()) > 0
	})
	seen := map[string]int{}
	for _, d := range append(b.sms.Deliveries(), backup.Deliveries()...) {
		seen[d.ID]++
		if seen[d.ID] > 1 {
			t.Errorf("%s accepted twice", d.ID)
		}
	}
}

// A permanent refusal (Twilio 21211, an invalid number) is not a provider
// failure: the notification is archived, the backup never sees it, and
// the primary is not marked down however many there are.
func TestPermanentRefusalDoesNotFailOver(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms.otp:exempt")
	backup := fakes.NewSMSAPI(t)
	b.sms.SetReply(func(string, string) (int, string) { return 21211, "" })
	r := b.start(t, withBackup(b.cfg, backup))
	var ids []string
	for i := range 4 {
		n := tasks.NewSMS("acme", "+1415555030"+string(rune('0'+i)), "code")
		if i%2 == 0 {
			n.Category = "otp"
		}
		ids = append(ids, n.ID)
		b.enqueue(t, n)
	}
	for _, id := range ids {
		b.waitTask(t, id, 10*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateArchived })
	}
	if n := backup.Attempts(); n != 0 {
		t.Errorf("the backup got %d requests for notifications the primary refused permanently", n)
	}
	if got := metric(t, r.reg, "sluice_failovers_total", nil); got != 0 {
		t.Errorf("sluice_failovers_total = %v after permanent refusals", got)
	}
	if got := gauges(t, r.reg, "sluice_provider_up", "provider")["default"]; got != 1 {
		t.Errorf("sluice_provider_up{provider=default} = %v: permanent refusals marked it down", got)
	}
}

// A standard send waits the failover grace for a primary that is down
// before it goes to the backup (a blip does not move bulk traffic to a
// dearer provider); no retry budget is spent meanwhile.
func TestStandardWaitsTheGraceThenFailsOver(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "")
	backup := fakes.NewSMSAPI(t)
	cfg := withBackup(b.cfg, backup)
	cfg.FailoverGrace = 3 * time.Second
	cfg.ProviderFailures = 1
	b.sms.Down(t)
	b.start(t, cfg)
	start := time.Now()
	n := tasks.NewSMS("acme", "+14155550400", "hello")
	b.enqueue(t, n, asynq.MaxRetry(0))
	ds := backup.WaitCount(t, 1, 20*time.Second)
	if d := ds[0].At.Sub(start); d < 3*time.Second {
		t.Errorf("a standard send reached the backup %v after the primary refused it; want after the 3 s grace", d)
	}
	// MaxRetry(0): one spent retry would have archived it.
	if qs := b.queueStats(t); qs.Archived != 0 || qs.Retry != 0 {
		t.Errorf("archived %d, retrying %d: a failover spent the retry budget", qs.Archived, qs.Retry)
	}
	if n := b.sms.Attempts(); n != 0 {
		t.Errorf("the primary, whose listener was gone, counted %d requests", n)
	}
}

// A tenant's plan orders its providers: acme's SMS go through the backup
// (sms:providers=backup), globex's through the configured list's first.
func TestPlanOrdersProviders(t *testing.T) {
	t.Parallel()
	b := setup(t, "acme/sms:providers=backup")
	backup := fakes.NewSMSAPI(t)
	b.start(t, withBackup(b.cfg, backup))
	acme := tasks.NewSMS("acme", "+14155550500", "hi")
	globex := tasks.NewSMS("globex", "+14155550501", "hi")
	b.enqueue(t, acme)
	b.enqueue(t, globex)
	if ds := backup.WaitCount(t, 1, 10*time.Second); ds[0].ID != acme.ID {
		t.Errorf("the backup got %s; want acme's", ds[0].ID)
	}
	if ds := b.sms.WaitCount(t, 1, 10*time.Second); ds[0].ID != globex.ID {
		t.Errorf("the primary got %s; want globex's", ds[0].ID)
	}
}

// breakerOf reads the default SMS provider's breaker from Redis: when the
// workers marked it down (Since), and when its cooldown ends and a probe
// may go (Until) — the instants they plan the move and the return on.
func breakerOf(t *testing.T, b *bundle) throttle.Breaker {
	t.Helper()
	lim, err := throttle.New(b.rdb, throttle.Options{Secret: []byte(b.cfg.SubjectSecret), CompactMembers: b.cfg.CompactMembers})
	if err != nil {
		t.Fatal(err)
	}
	bs, _, err := lim.ProviderStates(context.Background(), []string{lim.BreakerKey("sms", worker.DefaultProvider)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return bs[0]
}

// onTime is the budget of a move to the backup and of the return, from
// the instant the workers plan it (the grace's end, the probe's) to the
// request's arrival at the fake. Issue 53 asks for 100 ms; alone these
// tests measure 2-19 ms. In the full suite's package phase (race detector,
// four test binaries at once on two cores) a move came 117 ms and a return
// 210 ms after it: latency, not a decision, so the budget is 400 ms. Before
// the re-plan the sends waited for Asynq's next whole second, landing
// anywhere in 0-1 s late (0.24 and 0.54 s measured): most such runs fail.
const onTime = 400 * time.Millisecond

// moveOnTime is the move's latency budget. Beside two CPU hogs a move
// planned for the grace's end to the ms (its wait logged "until" that
// instant) reached the backup 442 ms after it, its admission late for its
// slot and asked again. The decision is judged exactly, from the log; the
// budget only bounds the latency.
const moveOnTime = 1500 * time.Millisecond

// A standard send whose primary is marked down goes to the backup at the
// grace's end, counted from the mark Redis holds, not at Asynq's next
// whole second; the primary back, the sends waiting for their slots at
// the backup plan again at the cooldown's end (the probe) and the first
// reaches the primary then, not at its next wake-up.
func TestFailoverAtTheGraceAndBackAtTheProbe(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	// Each provider 1 send a second: a backlog waits for its slots at the backup.
	b := setup(t, "sms:provider=1/1s")
	backup := fakes.NewSMSAPI(t)
	cfg := withBackup(b.cfg, backup)
	cfg.FailoverGrace = 1500 * time.Millisecond
	cfg.ProviderFailures = 1
	cfg.ProviderCooldown = 4 * time.Second
	b.sms.Down(t)
	logs := sluicetest.FailureLog(t, 150)
	b.startOpts(t, cfg, app.WorkerOptions{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	b.serving(t)
	b.enqueue(t, tasks.NewSMS("acme", "+14155550600", "hello"))
	first := backup.WaitCount(t, 1, 20*time.Second)[0]
	br := breakerOf(t, b) // still open: its cooldown is longer than the grace
	if !br.Open {
		t.Fatalf("the primary's breaker is not open at the move: %+v", br)
	}
	graceEnd := br.Since.Add(cfg.FailoverGrace)
	// The decision, exactly: the send waited in process until the grace's
	// end, to the ms Redis holds the mark at (not Asynq's next second).
	if want := "until=" + graceEnd.UTC().Format("2006-01-02T15:04:05.000Z07:00"); !strings.Contains(logs.String(), want) {
		t.Errorf("no wait for the backup until the grace's end (%s) in the log", want)
	}
	move := first.At.Sub(graceEnd)
	if move < 0 || move > moveOnTime {
		t.Errorf("the move to the backup came %v after the grace's end (marked down at %v, grace %v); want 0-%v",
			move, br.Since.Format("15:04:05.000"), cfg.FailoverGrace, moveOnTime)
	}
	// The primary is back; a backlog waits for its slots at the backup.
	b.sms.Up(t)
	for i := range 6 {
		b.enqueue(t, tasks.NewSMS("acme", fmt.Sprintf("+141555506%02d", 10+i), "hello"))
	}
	ds := b.sms.WaitCount(t, 1, 20*time.Second)
	back := ds[0].At.Sub(br.Until)
	if back < 0 || back > onTime {
		t.Errorf("the first send at the primary came %v after the probe's instant (cooldown end %v); want 0-%v",
			back, br.Until.Format("15:04:05.000"), onTime)
	}
	t.Logf("moved to the backup %v after the grace's end (budget %v); back on the primary %v after the probe's instant (budget %v)",
		move.Round(time.Millisecond), moveOnTime, back.Round(time.Millisecond), onTime)
}

// The primary answers 429 with Retry-After: 30 to the 6 requests in
// flight at once (it answers none until all arrived): the first begins a
// hold and the other 5, already on their way, leave it as it is
// (hold="in_flight", none "extended": docs/rules.md). Every worker shows
// the primary down while it is held — one that sent nothing too — in
// sluice_provider_up and /readyz, and up again when the hold ends.
func TestHoldShownOnEveryWorkerNotExtendedByInFlightAnswers(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "")
	backup := fakes.NewSMSAPI(t)
	const inFlight = 6
	var mu sync.Mutex
	arrived, all := 0, make(chan struct{})
	b.sms.SetReply(func(string, string) (int, string) {
		mu.Lock()
		if arrived++; arrived == inFlight {
			close(all)
		}
		mu.Unlock()
		select {
		case <-all:
		case <-time.After(10 * time.Second):
		}
		return 429, "3"
	})
	cfg := withBackup(b.cfg, backup)
	r := b.start(t, cfg)
	b.serving(t)
	// A second worker on other queues: it sends nothing, and shows what Redis holds.
	idle := cfg
	idle.Queue = "idle"
	ri := b.start(t, idle)
	for i := range inFlight {
		b.enqueue(t, tasks.NewSMS("acme", fmt.Sprintf("+141555507%02d", i), "hello"))
	}
	backup.WaitCount(t, inFlight, 20*time.Second)
	for name, reg := range map[string]*prometheus.Registry{"the sending worker": r.reg, "the idle worker": ri.reg} {
		if got := gauges(t, reg, "sluice_provider_up", "channel", "provider")["sms/default"]; got != 0 {
			t.Errorf("%s: sluice_provider_up{provider=default} = %v during the hold; want 0", name, got)
		}
	}
	rec := httptest.NewRecorder()
	ri.w.HTTPHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/readyz", nil))
	if !strings.Contains(rec.Body.String(), "sms provider default down or held") {
		t.Errorf("the idle worker's /readyz during the hold:\n%s", rec.Body.String())
	}
	for state, want := range map[string]float64{"begun": 1, "in_flight": inFlight - 1, "extended": 0} {
		if got := metric(t, r.reg, "sluice_provider_holds_total", map[string]string{"hold": state}); got != want {
			t.Errorf("sluice_provider_holds_total{hold=%s} = %v, want %v", state, got, want)
		}
	}
	// The hold lifts by itself: every worker shows the primary up again.
	for name, reg := range map[string]*prometheus.Registry{"the sending worker": r.reg, "the idle worker": ri.reg} {
		sluicetest.Eventually(t, 10*time.Second, name+" to show the primary up after its hold", func() bool {
			return gauges(t, reg, "sluice_provider_up", "channel", "provider")["sms/default"] == 1
		})
	}
}

// A backup with a number of its own (SLUICE_PROVIDER_BACKUP_SMS_FROM):
// what goes through it is posted with that From, what goes through the
// primary with the deployment's SLUICE_SMS_FROM; a notification naming
// its own from keeps it at either.
func TestBackupSendsWithItsOwnFrom(t *testing.T) {
	t.Parallel()
	b := setup(t, "acme/sms:providers=backup")
	backup := fakes.NewSMSAPI(t)
	b.start(t, withBackup(b.cfg, backup, "SLUICE_PROVIDER_BACKUP_SMS_FROM", "+15005550099"))
	acme := tasks.NewSMS("acme", "+14155550800", "hi")
	named := tasks.NewSMS("acme", "+14155550801", "hi")
	named.From = "+15005550077"
	globex := tasks.NewSMS("globex", "+14155550802", "hi")
	for _, n := range []tasks.Notification{acme, named, globex} {
		b.enqueue(t, n)
	}
	from := map[string]string{}
	for _, d := range backup.WaitCount(t, 2, 10*time.Second) {
		from[d.ID] = "backup " + d.From
	}
	for _, d := range b.sms.WaitCount(t, 1, 10*time.Second) {
		from[d.ID] = "primary " + d.From
	}
	for id, want := range map[string]string{acme.ID: "backup +15005550099", named.ID: "backup +15005550077", globex.ID: "primary +15005550006"} {
		if from[id] != want {
			t.Errorf("%s: posted as %q, want %q", id, from[id], want)
		}
	}
}

// A grace longer than MAX_INLINE_WAIT (the default 10 s is; 5 s here, over
// the 2 s): the send held back by a 429 goes back to Asynq, woken a lead
// before the grace's end to wait the rest in process, and reaches the
// backup at the grace's end counted from the hold's start in Redis, not at
// Asynq's next whole second after it (issue 53: 10.30-10.99 s for 10 s).
func TestLongGraceMovesAtItsEnd(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "")
	backup := fakes.NewSMSAPI(t)
	b.sms.SetReply(func(string, string) (int, string) { return 429, "60" })
	cfg := withBackup(b.cfg, backup)
	cfg.FailoverGrace = 5 * time.Second
	b.start(t, cfg)
	b.serving(t)
	b.enqueue(t, tasks.NewSMS("acme", "+14155550900", "hello"))
	first := backup.WaitCount(t, 1, 20*time.Second)[0]
	lim, err := throttle.New(b.rdb, throttle.Options{Secret: []byte(b.cfg.SubjectSecret), CompactMembers: b.cfg.CompactMembers})
	if err != nil {
		t.Fatal(err)
	}
	_, hs, err := lim.ProviderStates(context.Background(), []string{""}, []string{lim.HoldKey("sms:provider", "")})
	if err != nil || hs[0].Since.IsZero() {
		t.Fatalf("the primary's hold: %+v, %v", hs, err)
	}
	move := first.At.Sub(hs[0].Since.Add(cfg.FailoverGrace))
	if move < 0 || move > onTime {
		t.Errorf("the send reached the backup %v after the grace's end (held since %v); want 0-%v", move, hs[0].Since.Format("15:04:05.000"), onTime)
	}
	t.Logf("moved %v after the 5 s grace's end (budget %v)", move.Round(time.Millisecond), onTime)
}

// A send booked at the primary that the primary's outage moves to the
// backup takes its booking at the primary out with it: the primary's
// window holds only the bookings of sends that will go there, so after
// its return the first sends are not booked behind sends that went
// elsewhere (issue 53: the return came 0.6-0.8 s after the probe).
func TestMovedSendLeavesNoBookingAtThePrimary(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms:provider=1/4s,sms.otp:exempt")
	backup := fakes.NewSMSAPI(t)
	cfg := withBackup(b.cfg, backup)
	cfg.FailoverGrace = 300 * time.Millisecond
	cfg.ProviderFailures = 1
	cfg.ProviderCooldown = time.Minute
	b.start(t, cfg)
	b.serving(t)
	b.enqueue(t, tasks.NewSMS("acme", "+14155550800", "first"))
	b.sms.WaitCount(t, 1, 20*time.Second)
	moved := tasks.NewSMS("acme", "+14155550801", "booked at the primary, 4 s out")
	b.enqueue(t, moved)
	lim, err := throttle.New(b.rdb, throttle.Options{Secret: []byte(b.cfg.SubjectSecret), CompactMembers: b.cfg.CompactMembers})
	if err != nil {
		t.Fatal(err)
	}
	primary := throttle.Limit{Scope: "sms:provider", Group: "~shared", Rule: throttle.Rule{Limit: 1, Window: 4 * time.Second}}
	booked := func() int {
		u, err := lim.Usage(context.Background(), "acme", 0, primary)
		if err != nil {
			t.Fatal(err)
		}
		return u[0].Booked
	}
	for deadline := time.Now().Add(10 * time.Second); booked() != 1; time.Sleep(20 * time.Millisecond) { // polling Redis: no signal for a booking
		if time.Now().After(deadline) {
			t.Fatalf("the second send was not booked at the primary")
		}
	}
	// The primary goes away; an OTP finds it so and marks it down.
	b.sms.Down(t)
	otp := tasks.NewSMS("acme", "+14155550802", "code 1")
	otp.Category = "otp"
	b.enqueue(t, otp)
	ds := backup.WaitCount(t, 2, 20*time.Second)
	for _, d := range ds {
		if d.ID == moved.ID {
			if n := booked(); n != 0 {
				t.Errorf("the send moved to the backup still holds %d booking(s) at the primary", n)
			}
			return
		}
	}
	t.Fatalf("the booked send did not reach the backup: %v", ds)
}
