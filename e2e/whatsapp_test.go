package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// WhatsApp's limits enforced before the send (issue 54), against a fake
// Cloud API that enforces them itself: a portfolio limit of 250 distinct
// users per 60 s (Meta's 24 h, shortened), two business numbers at 20
// messages a second each, one message per user every 6 s (the pair rate);
// 1,000 template messages to 400 users (each once, then 600 more to users
// drawn at random), two workers, one killed -9 mid-run and started again.
//
// Exactly 250 distinct users are served in the first window; messages to
// them keep going in it (repeats cost nothing); the other 150 wait for the
// window to free, the first of them as the first counted user leaves it;
// the fake refuses nothing (no 131056, no 130429) and drops nothing past
// its messaging limit; every receipt keeps every rule; nothing is lost.
func TestWhatsAppPortfolioLimit(t *testing.T) {
	t.Parallel()
	const limit, users, msgs = 250, 400, 1000
	window, pair := 60*time.Second, 6*time.Second
	e := newEnv(t, "whatsapp:tenant=250/60s@distinct, whatsapp:recipient=1/6s, whatsapp:sender=20/1s~10")
	wa := fakes.NewWhatsAppAPI(t, fakes.WhatsAppLimits{Portfolio: limit, Window: window, PairCount: 1, PairWindow: pair, Throughput: 20})
	wa.SetSlots(e.slotOf)
	numbers := []string{"106540352242922", "106540352242923"}
	// The fake refuses by arrival, with no tolerance, as Meta does: a send
	// slack of 1 s (sends kept window + slack apart by slot) is the latency
	// budget a full run beside two CPU hogs needs (at the harness's 250 ms
	// two messages to one user arrived less than 6 s apart: 131056).
	vars := map[string]string{"SLUICE_WHATSAPP_SENDER": "cloud", "SLUICE_WHATSAPP_BASE_URL": wa.URL,
		"SLUICE_WHATSAPP_ACCESS_TOKEN": wa.Token, "SLUICE_WHATSAPP_PHONE_NUMBER_ID": numbers[0],
		"SLUICE_SEND_SLACK": waSlack.String()}
	e.worker("w0", vars)
	w1 := e.worker("w1", vars)

	rng := rand.New(rand.NewPCG(54, 250))
	ids := map[string]string{}
	for i := range msgs {
		u := i
		if i >= users {
			u = rng.IntN(users)
		}
		to := fmt.Sprintf("+1415555%04d", u)
		n := tasks.NewWhatsAppTemplate("acme", to, "spring_sale", "en_US", "Ann", fmt.Sprint(i))
		n.From = numbers[i%2]
		if _, err := tasks.Enqueue(context.Background(), e.client, e.keys, n); err != nil {
			t.Fatalf("enqueue %d: %v", i, err)
		}
		ids[n.ID] = to
	}
	// Kill a worker mid-run, while the first window's repeats still flow and
	// it holds tasks (sends waiting in process for their slots).
	wa.WaitCount(t, 400, 2*time.Minute)
	held := 0
	// Servers' heartbeats name the tasks they hold every few seconds; under
	// the full suite's load w1 once showed none in 30 s (w0 took the lane's
	// batches): 90 s, well inside the run's 4 minutes.
	if err := sluicetest.Wait(90*time.Second, "w1 to hold tasks", func() bool {
		servers, err := e.insp.Servers()
		held = 0
		for _, srv := range servers {
			if err == nil && srv.PID == w1.cmd.Process.Pid {
				held += len(srv.ActiveWorkers)
			}
		}
		return held > 0
	}); err != nil {
		t.Fatalf("w1 held no task for 90 s: %v", err)
	}
	w1.kill()
	e.worker("w1-restart", vars)

	ds := wa.WaitFor(t, 4*time.Minute, fmt.Sprintf("all %d notifications", msgs), func(ds []fakes.Delivery) bool {
		seen := map[string]bool{}
		for _, d := range ds {
			seen[d.ID] = true
		}
		return len(seen) == len(ids)
	})
	if r := wa.Refused(); r[fakes.WACodePairRate] != 0 || r[fakes.WACodeThroughput] != 0 || len(r) != 0 {
		t.Errorf("the Cloud API refused %v (131056 pair rate, 130429 throughput): want nothing", r)
	}
	if n := wa.OverLimit(); n != 0 {
		t.Errorf("%d templates past the messaging limit, which Meta would not deliver", n)
	}
	for name, a := range map[string]report{
		"pair rate":  audit(ds, 1, pair, func(d fakes.Delivery) string { return d.From + "|" + d.To }),
		"throughput": audit(ds, 20, time.Second, func(d fakes.Delivery) string { return d.From }),
	} {
		if a.violations > 0 {
			t.Errorf("%s: %d spans over the rule; worst: %s", name, a.violations, a.worst)
		}
	}
	if at, most := distinctWorst(ds, window); most > limit {
		t.Errorf("%d distinct users in the window ending %v, limit %d", most, at, limit)
	}

	t0 := ds[0].At
	firstOf, lastIn1 := map[string]time.Time{}, map[string]time.Time{}
	for _, d := range ds {
		if _, ok := firstOf[d.To]; !ok {
			firstOf[d.To] = d.At
		}
		if !d.At.After(t0.Add(window)) {
			lastIn1[d.To] = d.At
		}
	}
	if len(lastIn1) != limit {
		t.Errorf("%d distinct users served in the first window, want exactly %d", len(lastIn1), limit)
	}
	// Repeats to counted users are not held by the portfolio limit: a
	// message to a user of the first window came in that window, or, where
	// the pair rate spaced that user's messages past its end (600 repeats
	// over 400 users, 6 s and the slack apart), one pair spacing after the
	// user's message before it, on a latency budget of 10 s (the takeover of
	// what the killed worker held included). Beside two CPU hogs a user's
	// second message came 27.5 s in and its seventh, held by the killed
	// worker, at 70.5 s, 14.9 s after its sixth. A repeat held for the
	// portfolio would wait for the first exit, 61 s after the first receipt.
	late := 0
	prev := map[string]time.Time{}
	for _, d := range ds {
		p, seen := prev[d.To]
		prev[d.To] = d.At
		if _, ok := lastIn1[d.To]; ok && d.At.After(t0.Add(window)) && (!seen || d.At.Sub(p) > pair+waSlack+10*time.Second) {
			late++
		}
	}
	if late > 0 {
		t.Errorf("%d messages to users counted in the first window came after it, later than a pair spacing and the latency budget after the one before", late)
		shown := 0
		for u := range lastIn1 {
			var at []string
			lateU := false
			for _, d := range ds {
				if d.To == u {
					at = append(at, d.At.Sub(t0).Round(10*time.Millisecond).String())
					lateU = lateU || d.At.After(t0.Add(window))
				}
			}
			if lateU && shown < 8 {
				shown++
				t.Logf("user %s: receipts at %v", u, at)
			}
		}
	}
	// The others waited for the window to free: the first as the first
	// counted user left it (its last message + the window + the slack).
	var exits []time.Time
	for _, at := range lastIn1 {
		exits = append(exits, at.Add(window+waSlack))
	}
	sort.Slice(exits, func(i, j int) bool { return exits[i].Before(exits[j]) })
	var newcomers []time.Time
	for u, at := range firstOf {
		if _, ok := lastIn1[u]; !ok {
			newcomers = append(newcomers, at)
		}
	}
	slices.SortFunc(newcomers, func(a, b time.Time) int { return a.Compare(b) })
	if len(newcomers) != users-limit {
		t.Fatalf("%d users waited for the second window, want %d", len(newcomers), users-limit)
	}
	if newcomers[0].Before(exits[0].Add(-waSlack)) || newcomers[0].After(exits[0].Add(3*time.Second)) {
		t.Errorf("the first user past the limit came %v after the first exit, want within 3 s of it", newcomers[0].Sub(exits[0]))
	}
	r := audit(ds, msgs, time.Nanosecond, func(fakes.Delivery) string { return "" })
	t.Logf("w1 killed holding %d tasks; %d receipts (%d notifications, %d sent again after the kill); first window: %d users; second window's first user %v after the first exit; last receipt %v after the first",
		held, r.receipts, r.delivered, r.duplicates, len(lastIn1), newcomers[0].Sub(exits[0]).Round(time.Millisecond), ds[len(ds)-1].At.Sub(t0).Round(time.Millisecond))
}

// waSlack is TestWhatsAppPortfolioLimit's SLUICE_SEND_SLACK.
const waSlack = time.Second

// distinctWorst is the most distinct users with a receipt in a window
// ending at any receipt, and that receipt's time.
func distinctWorst(ds []fakes.Delivery, window time.Duration) (time.Time, int) {
	var at time.Time
	most := 0
	for i, d := range ds {
		users := map[string]bool{}
		for j := i; j >= 0 && !ds[j].At.Before(d.At.Add(-window)); j-- {
			users[ds[j].To] = true
		}
		if len(users) > most {
			at, most = d.At, len(users)
		}
	}
	return at, most
}
