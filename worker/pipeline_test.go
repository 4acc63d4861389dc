package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/app"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/throttle"
)

// A burst of 50 to one recipient under 1 per 1 s (plus a tenant rule), two
// worker servers: each notification arrives exactly once, and the provider's
// timeline never has two sends within one window. (1 s, not 2 s: the burst's
// 100 s were the longest path of the package's tests, and of --quick.)
func TestBurstTwoWorkers(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	for _, tc := range []struct {
		ch         tasks.Channel
		reschedule string
	}{{tasks.SMS, "booked"}, {tasks.Email, "naive"}} {
		ch := tc.ch
		t.Run(string(ch)+"/"+tc.reschedule, func(t *testing.T) {
			t.Parallel()
			const n = 50
			const window = time.Second
			b := setup(t, "sms:recipient=1/1s,sms:tenant=1000/1h,email:recipient=1/1s,email:tenant=1000/1h")
			b.cfg.Reschedule = tc.reschedule
			// Sends are kept window + slack apart: 500 ms, for the send
			// latency of a race-detected test binary among others on two
			// cores while the rest of the suite compiles beside it (with
			// the default 100 ms the email case failed once in CI; with
			// 250 ms stop 48's CI failed the test, its assertion cut from
			// the output, while a test beside it saw a send ~100 ms late).
			b.cfg.SendSlack = 500 * time.Millisecond
			rec := b.sms.Recorder
			if ch == tasks.Email {
				rec = b.smtp.Recorder
			}
			w1, w2 := b.start(t, b.cfg), b.start(t, b.cfg)
			warm := warmUp(t, b, rec, ch, w1, w2)
			want := map[string]bool{}
			for i := 0; i < n; i++ {
				var note tasks.Notification
				if ch == tasks.SMS {
					note = tasks.NewSMS("acme", "+14155550100", fmt.Sprintf("burst %d", i))
				} else {
					note = tasks.NewEmail("acme", "burst@example.com", "Burst", fmt.Sprintf("burst %d", i))
				}
				want[note.ID] = true
				b.enqueue(t, note)
			}
			var got []fakes.Delivery
			for _, d := range rec.WaitCount(t, warm+n, 6*time.Minute) {
				if want[d.ID] {
					got = append(got, d) // the burst's (repeats included), not the warm-ups
				}
			}
			// Exactly once: every id, no repeats.
			seen := map[string]int{}
			for _, d := range got {
				seen[d.ID]++
			}
			for id := range want {
				if seen[id] != 1 {
					t.Errorf("notification %s delivered %d times", id, seen[id])
				}
			}
			if len(got) != n {
				t.Fatalf("%d deliveries for %d notifications", len(got), n)
			}
			// The limiter admits on Redis TIME; the provider stamps arrival a
			// send later. Loopback sends take milliseconds; we allow 100 ms of
			// send-latency jitter between two admissions' arrivals beyond the
			// slack's 500 ms.
			const tolerance = 100 * time.Millisecond
			var lateness []time.Duration
			for i := 1; i < len(got); i++ {
				gap := got[i].At.Sub(got[i-1].At)
				if gap < window-tolerance {
					t.Errorf("sends %d and %d arrived %v apart; limit is 1 per %v", i-1, i, gap, window)
				}
				lateness = append(lateness, gap-window)
			}
			calls := metric(t, w1.reg, "sluice_throttle_decisions_total", nil) + metric(t, w2.reg, "sluice_throttle_decisions_total", nil)
			slices.Sort(lateness)
			t.Logf("%s (%s): %d delivered by 2 workers in %v; limiter calls per delivered message %.2f; gap beyond the window min %v, p50 %v, max %v",
				ch, tc.reschedule, n, got[n-1].At.Sub(got[0].At).Round(time.Millisecond), calls/n, lateness[0].Round(time.Millisecond),
				lateness[len(lateness)/2].Round(time.Millisecond), lateness[len(lateness)-1].Round(time.Millisecond))
			if calls < n {
				t.Fatalf("only %v limiter calls for %d sends", calls, n)
			}
			qi := b.queueStats(t)
			if qi.Failed != 0 || qi.Archived != 0 {
				t.Fatalf("denials counted as failures: failed %d, archived %d", qi.Failed, qi.Archived)
			}
		})
	}
}

// Denied tasks are rescheduled, not failed: Asynq's stats and Retried do not
// move, a MaxRetry(0) task is delivered later, and a task with one real
// failure behind it keeps exactly its remaining budget.
func TestDeniedIsNotFailure(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms:recipient=1/3s")
	b.cfg.RetryBase = 3 * time.Second
	// Every denial goes back to Asynq: beside two CPU hogs B's first check
	// came so late after A's send that its slot fell within the in-process
	// wait (MAX_INLINE_WAIT), and B waited for it in the worker, never
	// rescheduled — the denial this test is about did not happen.
	b.cfg.MaxInlineWait = 0
	b.sms.SetReply(func(to, body string) (int, string) {
		if strings.Contains(body, "fail-once") {
			b.sms.SetReply(nil)
			return 503, ""
		}
		return 0, ""
	})
	r := b.start(t, b.cfg)
	ctx := context.Background()

	// 1. A takes the slot; B (MaxRetry 0) is denied and must still arrive.
	a := tasks.NewSMS("acme", "+14155550101", "A")
	bz := tasks.NewSMS("acme", "+14155550101", "B")
	b.enqueue(t, a)
	b.sms.WaitCount(t, 1, 10*time.Second)
	// Completed tasks are kept a minute here so their retry count can be read.
	b.enqueue(t, bz, asynq.MaxRetry(0), asynq.Retention(time.Minute))
	got := b.sms.WaitCount(t, 2, 15*time.Second)
	if got[1].ID != bz.ID {
		t.Fatalf("second delivery %s, want B", got[1].ID)
	}
	ti := b.waitTask(t, bz.ID, 5*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateCompleted })
	if ti.Retried != 0 {
		t.Fatalf("B: Retried = %d after denials, want 0", ti.Retried)
	}
	if resched := metric(t, r.reg, "sluice_rescheduled_total", nil); resched < 1 {
		t.Fatal("B was never rescheduled: the test did not test denial")
	}

	// 2. C fails once for real (503: not sent, slot released), then D takes
	// the slot, so C's retry is denied; C must arrive with Retried still 1.
	c := tasks.NewSMS("acme", "+14155550102", "C fail-once")
	d := tasks.NewSMS("acme", "+14155550102", "D")
	b.enqueue(t, c, asynq.MaxRetry(1), asynq.Retention(time.Minute))
	b.sms.WaitFor(t, 10*time.Second, "C's failed attempt", func([]fakes.Delivery) bool { return b.sms.Attempts() >= 3 })
	b.enqueue(t, d)
	got = b.sms.WaitCount(t, 4, 20*time.Second)
	if got[2].ID != d.ID || got[3].ID != c.ID {
		t.Fatalf("order %s, %s; want D then C (C's retry must meet the full quota)", got[2].ID, got[3].ID)
	}
	ti = b.waitTask(t, c.ID, 5*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateCompleted })
	if ti.Retried != 1 {
		t.Fatalf("C: Retried = %d, want exactly 1 (its one real failure)", ti.Retried)
	}
	budget := tasks.RetryBudget(asynq.NewTaskWithHeaders("", nil, ti.Headers), ti.MaxRetry)
	if budget != 1 {
		t.Fatalf("C's budget header = %d, want 1", budget)
	}
	qi := b.queueStats(t)
	if qi.Failed != 1 || qi.Archived != 0 {
		t.Fatalf("stats: failed %d (want the 1 real failure), archived %d", qi.Failed, qi.Archived)
	}
	_ = ctx
}

// A task built outside tasks.NewTask with MaxRetry(0) would be archived by
// Asynq on its first denial; the worker reschedules it as a copy.
func TestRawMaxRetryZeroIsRescheduled(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms:recipient=1/2s")
	b.start(t, b.cfg)
	first := tasks.NewSMS("acme", "+14155550103", "first")
	b.enqueue(t, first)
	b.sms.WaitCount(t, 1, 10*time.Second)
	raw := tasks.NewSMS("acme", "+14155550103", "raw")
	payload, err := tasks.Reseal(b.keys(t), raw, raw.ID, tasks.TypeSMS)
	if err != nil {
		t.Fatal(err)
	}
	// Its copy gets a new task id, so its sealed payload must be sealed again for it.
	if _, err := b.client.Enqueue(asynq.NewTask(tasks.TypeSMS, payload), asynq.Queue(b.cfg.Queue), asynq.MaxRetry(0), asynq.TaskID(raw.ID)); err != nil {
		t.Fatal(err)
	}
	got := b.sms.WaitCount(t, 2, 15*time.Second)
	if got[1].ID != raw.ID {
		t.Fatalf("second delivery %q, want the raw task", got[1].ID)
	}
	if qi := b.queueStats(t); qi.Archived != 0 || qi.Failed != 0 {
		t.Fatalf("archived %d, failed %d", qi.Archived, qi.Failed)
	}
}

// Poison payloads, invalid recipients and header injection are archived
// with a reason and never reach a sender.
func TestPoisonIsArchived(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=10/1m,email:recipient=10/1m")
	b.cfg.PayloadPlaintext = "accept" // raw JSON reaches the decoder
	b.start(t, b.cfg)
	good := `{"id":"%s","tenant":"acme","channel":"%s","to":"%s","subject":"%s","body":"%s"}`
	cases := []struct{ name, typ, payload, reason string }{
		{"BadJSON", tasks.TypeSMS, `{"id":`, "not a notification"},
		{"UnknownField", tasks.TypeSMS, `{"id":"u1","tenant":"acme","channel":"sms","to":"+14155550100","body":"x","evil":1}`, "unknown field"},
		{"BadNumber", tasks.TypeSMS, fmt.Sprintf(good, "p1", "sms", "12345", "", "hi"), "E.164"},
		{"BadAddress", tasks.TypeEmail, fmt.Sprintf(good, "p2", "email", "not-an-address", "S", "hi"), "RFC 5322"},
		{"SubjectInjection", tasks.TypeEmail, fmt.Sprintf(good, "p3", "email", "a@example.com", `S\r\nBcc: victim@example.com`, "hi"), "header injection"},
		{"ToInjection", tasks.TypeEmail, fmt.Sprintf(good, "p4", "email", `a@example.com\r\nBcc: v@example.com`, "S", "hi"), "header injection"},
		{"Oversize", tasks.TypeSMS, fmt.Sprintf(good, "p5", "sms", "+14155550100", "", strings.Repeat("x", tasks.MaxSMSRunes+1)), "SMS limit"},
		{"TenantWithBrace", tasks.TypeSMS, `{"id":"p6","tenant":"a}b","channel":"sms","to":"+14155550100","body":"x"}`, "tenant"},
		{"TypeMismatch", tasks.TypeEmail, fmt.Sprintf(good, "p7", "sms", "+14155550100", "", "hi"), "does not match task type"},
		{"UnknownChannel", tasks.TypeSMS, `{"id":"p8","tenant":"acme","channel":"fax","to":"+14155550100","body":"x"}`, "unknown channel"},
	}
	ids := map[string]string{}
	for _, c := range cases {
		info, err := b.client.Enqueue(asynq.NewTask(c.typ, []byte(c.payload)), asynq.Queue(b.cfg.Queue), asynq.MaxRetry(5))
		if err != nil {
			t.Fatal(err)
		}
		ids[c.name] = info.ID
	}
	for _, c := range cases {
		ti := b.waitTask(t, ids[c.name], 10*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateArchived })
		if ti.Retried != 0 || !strings.Contains(ti.LastErr, c.reason) {
			t.Errorf("%s: archived after %d retries with %q; want at once, reason containing %q", c.name, ti.Retried, ti.LastErr, c.reason)
		}
	}
	if n := b.sms.Attempts() + b.smtp.Attempts(); n != 0 {
		t.Fatalf("poison reached a provider %d times", n)
	}
}

// Payloads that are not sealed, sealed with a key the worker lacks, or
// sealed for another task are archived unsent with the reason.
func TestUnreadablePayloadsAreArchived(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=10/1m")
	r := b.start(t, b.cfg)
	other, _ := tasks.ParseKeyring(tasks.NewKeySpec("other"))
	n1, n2, n3 := tasks.NewSMS("acme", "+14155550130", "a"), tasks.NewSMS("acme", "+14155550131", "b"), tasks.NewSMS("acme", "+14155550132", "c")
	plain, _ := n1.Normalized().Encode()
	foreignKey, _ := tasks.Reseal(other, n2.Normalized(), n2.ID, tasks.TypeSMS)
	moved, _ := tasks.Reseal(b.keys(t), n3.Normalized(), "some-other-task", tasks.TypeSMS)
	cases := map[string]struct {
		id      string
		payload []byte
		reason  string
	}{
		"Plain":      {n1.ID, plain, "not sealed"},
		"ForeignKey": {n2.ID, foreignKey, `key "other" is not in SLUICE_PAYLOAD_KEYS`},
		"Moved":      {n3.ID, moved, "sealed for another task"},
	}
	for _, c := range cases {
		if _, err := b.client.Enqueue(asynq.NewTask(tasks.TypeSMS, c.payload), asynq.Queue(b.cfg.Queue), asynq.TaskID(c.id)); err != nil {
			t.Fatal(err)
		}
	}
	for name, c := range cases {
		ti := b.waitTask(t, c.id, 10*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateArchived })
		if ti.Retried != 0 || !strings.Contains(ti.LastErr, c.reason) {
			t.Errorf("%s: archived after %d retries with %q; want %q", name, ti.Retried, ti.LastErr, c.reason)
		}
	}
	if v := metric(t, r.reg, "sluice_archived_total", map[string]string{"reason": "unreadable"}); v != 3 {
		t.Errorf("archived{reason=unreadable} = %v, want 3", v)
	}
	if n := b.sms.Attempts(); n != 0 {
		t.Fatalf("unreadable payloads reached the provider %d times", n)
	}
}

// Provider errors: permanent ones archive at once and release the slot;
// transient ones retry (honouring Retry-After) and deliver.
func TestProviderErrors(t *testing.T) {
	sluicetest.Slow(t)
	t.Parallel()
	b := setup(t, "sms:recipient=1/1h,email:recipient=1/1h")
	r := b.start(t, b.cfg)

	b.sms.SetReply(func(to, _ string) (int, string) {
		switch to {
		case "+14155550110":
			return 400, ""
		case "+14155550111":
			b.sms.SetReply(nil)
			return 429, "1"
		}
		return 0, ""
	})
	perm := tasks.NewSMS("acme", "+14155550110", "rejected")
	b.enqueue(t, perm)
	ti := b.waitTask(t, perm.ID, 10*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateArchived })
	if !strings.Contains(ti.LastErr, "HTTP 400") {
		t.Fatalf("archived with %q", ti.LastErr)
	}
	// The slot was released: a second notification to that number is admitted
	// (it would be denied for an hour otherwise) — it reaches the provider.
	b.sms.SetReply(func(to, _ string) (int, string) {
		if to == "+14155550111" {
			b.sms.SetReply(nil)
			return 429, "1"
		}
		return 0, ""
	})
	again := tasks.NewSMS("acme", "+14155550110", "second try")
	b.enqueue(t, again)
	// 20 s: once (2026-12-02, the full suite) the worker did not take this
	// task up for 10 s, no log line of it at all: a wake-up the fair
	// dispatch missed (docs/development.md, fixed since). Kept as margin.
	b.sms.WaitFor(t, 20*time.Second, "the second notification", func(d []fakes.Delivery) bool {
		return slices.ContainsFunc(d, func(x fakes.Delivery) bool { return x.ID == again.ID })
	})
	limited := tasks.NewSMS("acme", "+14155550111", "rate limited once")
	b.enqueue(t, limited)
	b.sms.WaitFor(t, 15*time.Second, "the 429'd notification", func(d []fakes.Delivery) bool {
		return slices.ContainsFunc(d, func(x fakes.Delivery) bool { return x.ID == limited.ID })
	})

	b.smtp.SetReply(func(to, _ string) (int, string) {
		switch to {
		case "bounce@example.com":
			return 550, ""
		case "greylist@example.com":
			b.smtp.SetReply(func(to, _ string) (int, string) {
				if to == "bounce@example.com" {
					return 550, ""
				}
				return 0, ""
			})
			return 451, ""
		}
		return 0, ""
	})
	bounce := tasks.NewEmail("acme", "bounce@example.com", "Hi", "bounces")
	grey := tasks.NewEmail("acme", "greylist@example.com", "Hi", "greylisted once")
	b.enqueue(t, bounce)
	b.enqueue(t, grey)
	ti = b.waitTask(t, bounce.ID, 10*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateArchived })
	if !strings.Contains(ti.LastErr, "550") {
		t.Fatalf("bounce archived with %q", ti.LastErr)
	}
	b.smtp.WaitFor(t, 15*time.Second, "the greylisted email", func(d []fakes.Delivery) bool {
		return slices.ContainsFunc(d, func(x fakes.Delivery) bool { return x.ID == grey.ID })
	})
	if v := metric(t, r.reg, "sluice_sends_total", map[string]string{"result": "permanent"}); v != 2 {
		t.Fatalf("permanent sends metric = %v, want 2", v)
	}
}

// Running the handler twice with the same task sends once and counts once.
func TestRerunSendsOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=5/1m,sms:tenant=100/1h")
	b.cfg.PayloadPlaintext = "accept"
	r := b.start(t, b.cfg)
	n := tasks.NewSMS("acme", "+14155550120", "once")
	task, err := tasks.NewTask(n, nil) // plain: run outside Asynq, there is no task id to bind a seal to
	if err != nil {
		t.Fatal(err)
	}
	h := r.w.Handler()
	for i := 0; i < 3; i++ {
		if err := h.ProcessTask(context.Background(), task); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
	}
	if got := b.sms.Deliveries(); len(got) != 1 {
		t.Fatalf("%d sends for one notification", len(got))
	}
	var limits []throttle.Limit
	for _, e := range r.w.Policy().Match("acme", tasks.SMS, "").Rates {
		limits = append(limits, e.Limit(n.Normalized().To, "", ""))
	}
	us, err := r.w.Limiter().Usage(context.Background(), "acme", 0, limits...)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range us {
		if u.Used != 1 {
			t.Fatalf("%s counted %d times", u.Limit, u.Used)
		}
	}
	if v := metric(t, r.reg, "sluice_throttle_decisions_total", map[string]string{"result": "done"}); v != 2 {
		t.Fatalf("done decisions = %v, want 2", v)
	}
}

// A limit above Redis's zset-max-listpack-entries is named at start.
func TestWarnsAboutSkiplistLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=5/1m,sms:tenant=1000/1h")
	var logs sluicetest.LogBuffer
	w, err := app.NewWorker(b.cfg, app.WorkerOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	b.enqueue(t, tasks.NewSMS("acme", "+14155550180", "started"))
	b.sms.WaitCount(t, 1, 10*time.Second) // the worker is past its start checks
	cancel()
	<-done
	out := logs.String()
	if !strings.Contains(out, `rule=sms:tenant=1000/1h limit=1000 zset_max_listpack_entries=128`) && !strings.Contains(out, `rule="sms:tenant=1000/1h" limit=1000 zset_max_listpack_entries=128`) {
		t.Fatalf("no warning for the 1000-limit rule:\n%s", out)
	}
	if strings.Contains(out, "rule=sms:recipient=5/1m limit=") {
		t.Fatalf("a warning for a limit below the setting:\n%s", out)
	}
}

// warmUp has each of two workers send once, to recipients of their own,
// before a burst whose receipts are judged: a worker's first send dials
// the provider (for email, SMTP with STARTTLS), and under a full
// race-detected suite one took half a second, more than the slack, so two
// receipts of the burst arrived 735 ms apart. That latency is not what the
// burst tests. It returns how many it sent.
func warmUp(t *testing.T, b *bundle, rec *fakes.Recorder, ch tasks.Channel, w1, w2 *running) int {
	t.Helper()
	sent := func(w *running) float64 {
		return metric(t, w.reg, "sluice_sends_total", map[string]string{"result": "sent"})
	}
	for i := 0; i < 40; i++ {
		if sent(w1) > 0 && sent(w2) > 0 {
			return i
		}
		if ch == tasks.SMS {
			b.enqueue(t, tasks.NewSMS("acme", fmt.Sprintf("+1415555%04d", 9000+i), "warm"))
		} else {
			b.enqueue(t, tasks.NewEmail("acme", fmt.Sprintf("warm%d@example.com", i), "Warm", "warm"))
		}
		rec.WaitCount(t, i+1, time.Minute)
	}
	t.Fatal("40 sends and one of the two workers sent none")
	return 0
}
