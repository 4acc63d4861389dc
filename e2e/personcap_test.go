package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// A cap per person across channels, *.marketing:user=3/1d: a person's
// marketing email and SMS, 10 each and interleaved, reach the two fake
// providers 3 times in all; the other 17 wait for the person's window
// (booked, none lost). Another person's 2 and a notification that names
// no person go out (the cap is per person, and counts only the
// notifications that name one). On one node and on a 3-master Cluster.
func TestPersonCapAcrossChannels(t *testing.T) {
	// Not parallel: it runs alone, before the parallel tests start, so its
	// load (two workers each) does not starve the fault and soak tests'
	// audits, which allow no tolerance beyond the send slack (a run with it
	// beside them saw receipts 234 ms late), nor they its timing.
	for _, topology := range []string{"node", "cluster"} {
		t.Run(topology, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, "*.marketing:user=3/1d")
			if topology == "cluster" {
				e.onCluster(0)
			}
			smtp := fakes.NewSMTPServer(t)
			smtp.SetSlots(e.slotOf)
			mail := smtpVars(smtp, "news@example.com", nil)
			e.worker("w0", mail)
			e.worker("w1", mail)

			person := map[string]string{} // notification id → its user ("" none)
			enqueue := func(n tasks.Notification, user string) {
				n.Category, n.User = "marketing", user
				person[n.ID] = user
				e.enqueue(n)
			}
			for i := 0; i < 10; i++ {
				enqueue(tasks.NewEmail("acme", "jane@example.com", "Sale "+strconv.Itoa(i), "50% off"), "u-jane")
				enqueue(tasks.NewSMS("acme", "+14155550300", "Sale "+strconv.Itoa(i)), "u-jane")
			}
			enqueue(tasks.NewEmail("acme", "omar@example.com", "Sale", "50% off"), "u-omar")
			enqueue(tasks.NewSMS("acme", "+14155550301", "Sale"), "u-omar")
			enqueue(tasks.NewSMS("acme", "+14155550302", "Sale"), "")

			// Settled: nothing pending or running, every other task booked
			// for its slot (the window is a day: none of them is due here).
			type counts struct{ Pending, Active, Scheduled, Retry, Archived, Completed int }
			sluicetest.EventuallyValueEvery(t, time.Minute, 50*time.Millisecond, "every task sent or booked", func() (counts, bool) {
				qi, err := e.queueInfo()
				if err != nil {
					return counts{}, false
				}
				c := counts{qi.Pending, qi.Active, qi.Scheduled, qi.Retry, qi.Archived, qi.Completed}
				return c, c.Pending == 0 && c.Active == 0 && c.Scheduled+c.Retry == 17
			})
			// Each waits for the person's window, a day away (a booked task is
			// put back through Asynq's retry set, its budget unspent).
			for _, q := range e.knownQueues() {
				for _, list := range []func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error){e.insp.ListScheduledTasks, e.insp.ListRetryTasks} {
					ts, err := list(q)
					if err != nil {
						t.Fatal(err)
					}
					for _, ti := range ts {
						if time.Until(ti.NextProcessAt) < time.Hour {
							t.Errorf("task %s waits only until %v (last error %q); want the person's window, a day", ti.ID, ti.NextProcessAt, ti.LastErr)
						}
					}
				}
			}
			got := map[string]int{}
			var lines []string
			for _, ds := range [][]fakes.Delivery{smtp.Deliveries(), e.sms.Deliveries()} {
				for _, d := range ds {
					u, ok := person[d.ID]
					if !ok {
						t.Errorf("a receipt of no notification of this test: %+v", d)
					}
					got[u]++
					lines = append(lines, fmt.Sprintf("%s %s (user %q)", d.At.Format("15:04:05.000"), d.To, u))
				}
			}
			t.Logf("%s: receipts per person %v:\n%s", topology, got, strings.Join(lines, "\n"))
			if got["u-jane"] != 3 {
				t.Errorf("u-jane received %d messages across email and SMS, want exactly 3 (*.marketing:user=3/1d)", got["u-jane"])
			}
			if got["u-omar"] != 2 || got[""] != 1 {
				t.Errorf("u-omar received %d (want 2), the notification without a user %d (want 1)", got["u-omar"], got[""])
			}
			if qi, err := e.queueInfo(); err != nil || qi.Archived != 0 {
				t.Errorf("archived: %+v, %v; want none (the rest wait for the window)", qi, err)
			}
		})
	}
}
