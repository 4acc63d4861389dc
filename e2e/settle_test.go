package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
)

// A worker killed with SIGKILL while its sends are in flight (the provider
// takes 300 ms a request): the provider accepted those requests and
// reported each with a status callback to `sluice api` within
// milliseconds, long before the surviving worker's sweep re-ran the tasks
// (SLUICE_ORPHAN_AFTER, 15 s). The re-run reads the report and sends
// nothing (issue 35, item 5): no notification reaches the provider twice,
// every receipt counted. A request the kill cut before it reached the
// provider has no report, and the re-run sends it, once.
func TestKilledWorkersSendsSettledByCallbacks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:recipient=100/1m,sms:tenant=100000/1h")
	addr := freeAddr(t)
	e.vars["SLUICE_SMS_STATUS_CALLBACK_URL"] = "http://" + addr
	e.sms.SetLatency(300 * time.Millisecond)
	e.sms.SetCallbacks(func(fakes.Delivery) []fakes.StatusUpdate { return []fakes.StatusUpdate{{Status: "sent"}} })
	e.startAPIAt(addr, nil, "acme")
	workers := []*proc{e.worker("w0", nil), e.worker("w1", nil)}
	ids := e.enqueueSMS(900, recipients(50), []string{"acme"})

	// Kill the worker Asynq's heartbeats (every 5 s) list with at least 5
	// tasks running; the backlog lasts long enough for them to show.
	e.sms.WaitCount(t, 20, time.Minute)
	victim, running := -1, 0
	if err := sluicetest.Wait(45*time.Second, "a worker running 5 sends", func() bool {
		servers, err := e.insp.Servers()
		if err != nil {
			return false
		}
		for i, w := range workers {
			n := 0
			for _, srv := range servers {
				if srv.PID == w.cmd.Process.Pid {
					n += len(srv.ActiveWorkers)
				}
			}
			if n >= 5 {
				victim, running = i, n
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatal(err)
	}
	inFlight := e.sms.InFlightFrom("+15005550006") // both workers' requests at the provider
	workers[victim].kill()
	survivor := workers[1-victim]

	e.waitAllDelivered(ids, 2*time.Minute)
	// Settled: nothing waiting, pending, running or due again, so a late
	// repeat would have come by now.
	sluicetest.EventuallyValueEvery(t, time.Minute, 100*time.Millisecond, "every task done", func() (int, bool) {
		qi, err := e.queueInfo()
		if err != nil {
			return -1, false
		}
		n := qi.Pending + qi.Active + qi.Scheduled + qi.Retry + qi.Aggregating
		return n, n == 0
	})
	ds := e.sms.Deliveries() // every receipt, repeats included
	per := map[string]int{}
	for _, d := range ds {
		per[d.ID]++
	}
	var repeats []string
	for id, n := range per {
		if n > 1 {
			repeats = append(repeats, id)
		}
	}
	settled := strings.Count(survivor.logText(), "an earlier attempt reached the provider")
	t.Logf("killed a worker with %d tasks running on it and %d requests at the provider; %d receipts of %d notifications; the re-run settled %d from their reports",
		running, inFlight, len(ds), len(ids), settled)
	if len(repeats) > 0 {
		t.Fatalf("%d notifications reached the provider twice (%v): their reports had come before the re-run", len(repeats), repeats)
	}
	if settled == 0 {
		t.Fatalf("no re-run read a report (%d tasks were running on the killed worker): the scenario did not test the settling", running)
	}
}
