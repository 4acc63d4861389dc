package throttle_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// A WhatsApp campaign through the limiter alone, as the worker drives it
// (book, then ask again at the slot): a portfolio limit of 250 distinct
// users per 60 s beside a pair rate (1 per 6 s per user) and a throughput
// rule (20 per second per number, two numbers, bucketed: a log's search
// gives up past 64 full spans and books after the key's end, which a
// throughput rule's dense bookings reach); 1,000 messages to 400 users. Exactly 250 users are served in the first window, every message to
// them goes in it (repeats are free, the pair rate spaces them), the others
// wait for it to free; no window holds more than 250.
func TestDistinctCampaign(t *testing.T) {
	b := setup(t, true)
	ctx := context.Background()
	const users, msgs, limit = 400, 1000, 250
	window := 60 * time.Second
	slack := 250 * time.Millisecond
	rng := rand.New(rand.NewPCG(54, 250))
	type msg struct {
		id, to, from string
		at           int64 // slot while booked
	}
	var all []*msg
	for i := range msgs {
		u := i
		if i >= users {
			u = rng.IntN(users)
		}
		all = append(all, &msg{id: fmt.Sprint("m", i), to: fmt.Sprintf("+1415555%04d", u), from: fmt.Sprint("n", i%2)})
	}
	limits := func(m *msg) []throttle.Limit {
		return []throttle.Limit{
			{Scope: "whatsapp:tenant", Distinct: m.to, Rule: throttle.Rule{Limit: limit, Window: window, Distinct: true}},
			{Scope: "whatsapp:recipient", Subject: m.to, Rule: throttle.Rule{Limit: 1, Window: 6 * time.Second}},
			{Scope: "whatsapp:sender", Subject: m.from, Rule: throttle.Rule{Limit: 20, Window: time.Second, Buckets: 10}},
		}
	}
	model := newDistinctModel(limit, (window + slack).Milliseconds())
	sent := map[string]int64{}
	var waiting []*msg
	ask := func(m *msg) {
		t.Helper()
		d, err := b.lim.Reserve(ctx, b.group, m.id, throttle.ReserveOptions{Slack: slack, Horizon: 2 * time.Second, Book: true}, limits(m)...)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case d.Allowed:
			sent[m.id] = d.At.UnixMilli()
			model.sends[m.to] = append(model.sends[m.to], d.At.UnixMilli())
			if err := b.lim.MarkDone(ctx, b.group, m.id, d.Attempt, time.Hour); err != nil {
				t.Fatal(err)
			}
		case d.Booked:
			m.at = d.At.UnixMilli()
			waiting = append(waiting, m)
		default:
			t.Fatalf("%s: %v", m.id, d.Status)
		}
	}
	t0 := b.clock.Now().UnixMilli()
	for _, m := range all {
		b.clock.Add(time.Millisecond)
		ask(m)
	}
	for len(waiting) > 0 {
		sort.Slice(waiting, func(i, j int) bool { return waiting[i].at < waiting[j].at })
		m := waiting[0]
		waiting = waiting[1:]
		if m.at > b.clock.Now().UnixMilli() {
			b.clock.Set(time.UnixMilli(m.at))
		}
		ask(m)
	}
	if at, most := model.worst(); most > limit {
		t.Fatalf("%d distinct users in the window ending %d, limit %d", most, at, limit)
	}
	first := map[string]bool{}
	for _, m := range all {
		if sent[m.id]-t0 <= window.Milliseconds() {
			first[m.to] = true
		}
	}
	late := 0
	for _, m := range all {
		if first[m.to] && sent[m.id]-t0 > window.Milliseconds() {
			late++
			if late < 6 {
				t.Logf("%s to %s (from %s) sent at +%d ms", m.id, m.to, m.from, sent[m.id]-t0)
			}
		}
	}
	end := int64(0)
	for _, at := range sent {
		end = max(end, at-t0)
	}
	if len(first) != limit || late > 0 {
		t.Fatalf("first window: %d users (want %d), %d of their messages after it (want 0); last send at +%d ms", len(first), limit, late, end)
	}
	t.Logf("last send at +%d ms", end)
}
