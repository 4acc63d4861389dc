package main

import (
	"log"
	"sort"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/plans"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// The ideal of a backlog is what an exact scheduler would do with the same
// arrivals and rules: each message, in arrival order, is sent at the
// earliest instant at or after its arrival at which every rule it is
// subject to still holds — no span of Window ms (ends included, as in
// Sluice's log) holds more than Limit sends, the slots of the messages
// before it included. Time is in whole milliseconds, sends take no time and
// nothing is ever late: the drain of that schedule is the ideal. With slack
// > 0 every window is widened by it (what SLUICE_SEND_SLACK asks of Sluice),
// which gives the share of the ideal that the slack costs.

// arrival is one message of a backlog: when its enqueue returned.
type arrival struct {
	at time.Time
	n  tasks.Notification
}

// simRule is one window of the simulation, keyed like Sluice's keys.
type simRule struct {
	key    string
	limit  int
	window int64 // ms, slack included
}

// simulate returns the slot of every arrival (in order) under rules with
// windows widened by slack.
func simulate(rules string, arrivals []arrival, slack time.Duration) []time.Time {
	policy, err := plans.Parse(rules)
	if err != nil {
		log.Fatal(err)
	}
	logs := map[string][]int64{} // sorted slots per rule key
	out := make([]time.Time, len(arrivals))
	for i, a := range arrivals {
		var rs []simRule
		for _, e := range policy.Match(a.n.Tenant, a.n.Channel, a.n.Category).Rates {
			l := e.Limit(a.n.To, a.n.From, a.n.User)
			rs = append(rs, simRule{key: groupOf(a.n.Tenant, l) + "|" + l.Scope + "|" + l.Subject + "|" + strconv.FormatInt(l.Rule.Window.Milliseconds(), 10),
				limit: l.Rule.Limit, window: (l.Rule.Window + slack).Milliseconds()})
		}
		c := a.at.UnixMilli()
		for moved := true; moved; {
			moved = false
			for _, r := range rs {
				if x := earliestFit(logs[r.key], r.limit, r.window, c); x > c {
					c, moved = x, true
				}
			}
		}
		for _, r := range rs {
			e := logs[r.key]
			j := sort.Search(len(e), func(k int) bool { return e[k] > c })
			e = append(e, 0)
			copy(e[j+1:], e[j:])
			e[j] = c
			logs[r.key] = e
		}
		out[i] = time.UnixMilli(c)
	}
	return out
}

// earliestFit is the first instant >= c at which the sorted log e takes one
// more entry: no run of limit entries within w ms of each other may lie
// within w of it ([last − w, first + w] is blocked by such a run).
func earliestFit(e []int64, limit int, w, c int64) int64 {
	for i := 0; i+limit-1 < len(e); i++ {
		first, last := e[i], e[i+limit-1]
		if last-first > w {
			continue
		}
		if c >= last-w && c <= first+w {
			c = first + w + 1
		}
	}
	return c
}

// idealDrain is the time from start to the last slot of the exact schedule.
func idealDrain(rules string, arrivals []arrival, start time.Time, slack time.Duration) time.Duration {
	var last time.Time
	for _, s := range simulate(rules, arrivals, slack) {
		if s.After(last) {
			last = s
		}
	}
	return last.Sub(start)
}

// groupOf is the group a limit's key lives in: its own, else the tenant's.
func groupOf(tenant string, l throttle.Limit) string {
	if l.Group != "" {
		return l.Group
	}
	return tenant
}
