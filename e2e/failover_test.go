package e2e

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
	"github.com/sluicehq/sluice/testkit/sluicetest"
	"github.com/sluicehq/sluice/throttle"
)

// backupVars configure a second Twilio-compatible provider, "backup", after
// the default one (the env's fake), with a number of its own (backupFrom)
// and a 2 s failover grace.
func backupVars(backup *fakes.SMSAPI) map[string]string {
	return map[string]string{
		"SLUICE_SMS_PROVIDERS":                   "default,backup",
		"SLUICE_PROVIDER_BACKUP_SMS_FROM":        backupFrom,
		"SLUICE_PROVIDER_BACKUP_SMS_SENDER":      "http",
		"SLUICE_PROVIDER_BACKUP_SMS_BASE_URL":    backup.URL,
		"SLUICE_PROVIDER_BACKUP_SMS_ACCOUNT_SID": backup.AccountSID,
		"SLUICE_PROVIDER_BACKUP_SMS_AUTH_TOKEN":  backup.AuthToken,
		"SLUICE_FAILOVER_GRACE":                  "2s",
		"SLUICE_PROVIDER_COOLDOWN":               "3s",
	}
}

// Two workers drain standard SMS over two providers, the default first,
// paced by a provider rule that counts each provider on its own. Mid-drain
// the primary's listener goes away (connections refused) for 5 s while
// OTPs arrive, then comes back. Audited at both fakes: every notification
// received, none by both providers (nor twice by one), each provider's
// windows within the rule, each recipient's too; the OTPs of the outage
// reach the backup within 1 s of their enqueue (the slowest of 40: p99 and
// above); standard traffic moves to the backup at the grace's end after
// the mark the workers log (within moveBudget), and back to the primary
// within returnBudget of the instant it could take a send again (the
// probe's, or the first its window had room at) and 6 s of its return
// (cooldown 3 s); the backup posts its own From.
func TestFailoverToABackupSMSProvider(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:provider=20/1s,sms:recipient=30/1m,sms.otp:exempt,sms.otp:recipient=10/1h")
	backup := fakes.NewSMSAPI(t)
	backup.SetSlots(e.slotOf)
	vars := backupVars(backup)
	w0, w1 := e.worker("w0", vars), e.worker("w1", vars)
	ids := e.enqueueSMS(260, recipients(20), []string{"acme"})
	e.sms.WaitCount(t, 60, time.Minute)
	down := time.Now()
	e.sms.Down(t)
	otpAt := map[string]time.Time{}
	for i := range 40 {
		n := tasks.NewSMS("acme", fmt.Sprintf("+1415666%04d", i), fmt.Sprintf("your code %d", i))
		n.Category = "otp"
		otpAt[n.ID] = time.Now()
		e.enqueue(n)
		ids[n.ID] = n.To
		time.Sleep(100 * time.Millisecond) // a stream of OTPs across the outage, not a signal
	}
	for time.Since(down) < 5*time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	up := time.Now()
	e.sms.Up(t)
	type probed struct {
		at  time.Time
		w   windowAt
		err error
	}
	atProbe := make(chan probed, 1)
	go func() {
		at, w, err := e.probeWindow(up, w0, w1)
		atProbe <- probed{at, w, err}
	}()

	var all []fakes.Delivery
	var mu sync.Mutex
	collect := func() []fakes.Delivery {
		mu.Lock()
		defer mu.Unlock()
		all = append(slices.Clone(e.sms.Deliveries()), backup.Deliveries()...)
		return all
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		seen := map[string]bool{}
		for _, d := range collect() {
			if _, ok := ids[d.ID]; ok {
				seen[d.ID] = true
			}
		}
		if len(seen) == len(ids) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d delivered in 2 minutes (primary %d, backup %d); logs:\n%s", len(seen), len(ids),
				len(e.sms.Deliveries()), len(backup.Deliveries()), tail(w0.logText(), 40))
		}
		select {
		case <-e.sms.Changed():
		case <-backup.Changed():
		case <-time.After(200 * time.Millisecond):
		}
	}
	ds := collect()

	// At most one provider, once: across both sinks, every id once.
	byID := map[string][]string{}
	for _, d := range e.sms.Deliveries() {
		byID[d.ID] = append(byID[d.ID], "primary")
	}
	for _, d := range backup.Deliveries() {
		byID[d.ID] = append(byID[d.ID], "backup")
	}
	for id, at := range byID {
		if len(at) > 1 {
			t.Errorf("%s accepted %d times: %v", id, len(at), at)
		}
	}
	// Each provider's windows, and each recipient's across both.
	standard := func(ds []fakes.Delivery) []fakes.Delivery {
		return slices.DeleteFunc(slices.Clone(ds), func(d fakes.Delivery) bool { _, otp := otpAt[d.ID]; return otp })
	}
	one := func(fakes.Delivery) string { return "provider" }
	for name, got := range map[string][]fakes.Delivery{"primary": e.sms.Deliveries(), "backup": backup.Deliveries()} {
		if r := audit(standard(got), 20, time.Second, one); r.violations != 0 {
			t.Errorf("%s: provider rule 20/1s exceeded: %s", name, r.worst)
		}
	}
	if r := audit(ds, 30, time.Minute, byRecipient); r.violations != 0 || r.duplicates != 0 {
		t.Errorf("recipient rule: %d violations (%s), %d duplicates", r.violations, r.worst, r.duplicates)
	}
	// The outage's OTPs, at the backup within 1 s of their enqueue.
	var otpDelay []time.Duration
	onBackup := 0
	for _, d := range backup.Deliveries() {
		if at, ok := otpAt[d.ID]; ok {
			otpDelay = append(otpDelay, d.At.Sub(at))
			onBackup++
		}
	}
	slices.Sort(otpDelay)
	if onBackup != len(otpAt) {
		t.Errorf("%d of the %d OTPs of the outage went to the backup", onBackup, len(otpAt))
	}
	if len(otpDelay) > 0 && otpDelay[len(otpDelay)-1] > time.Second {
		t.Errorf("OTP delays during the outage: p50 %v, slowest %v; want ≤ 1 s", otpDelay[len(otpDelay)/2], otpDelay[len(otpDelay)-1])
	}
	// Standard traffic: on the backup during the outage (after the grace),
	// back on the primary within 6 s of its return.
	var firstBackupStd, firstPrimaryAfter time.Time
	for _, d := range standard(backup.Deliveries()) {
		if firstBackupStd.IsZero() || d.At.Before(firstBackupStd) {
			firstBackupStd = d.At
		}
	}
	for _, d := range e.sms.Deliveries() {
		if d.At.After(up) && (firstPrimaryAfter.IsZero() || d.At.Before(firstPrimaryAfter)) {
			firstPrimaryAfter = d.At
		}
	}
	if firstBackupStd.IsZero() {
		t.Errorf("no standard send went to the backup during a 5 s outage (grace 2 s)")
	}
	if firstPrimaryAfter.IsZero() || firstPrimaryAfter.Sub(up) > 6*time.Second {
		t.Errorf("the primary returned at +%v; its first send after: %v (want within 6 s)", up.Sub(down).Round(time.Millisecond), firstPrimaryAfter)
	}
	if qi, err := e.queueInfo(); err != nil || qi.Archived != 0 {
		t.Errorf("archived: %+v %v", qi, err)
	}
	logs := w0.logText() + w1.logText()
	marks := logInstants(t, logs, "provider marked down", "down_since")
	if len(marks) == 0 {
		t.Fatalf("no worker marked the primary down")
	}
	// The move, from the instant the workers plan it: the grace's end
	// after the first mark (the breaker's down_since, which they log).
	mark := slices.MinFunc(marks, time.Time.Compare)
	move := firstBackupStd.Sub(mark.Add(2 * time.Second))
	if move < 0 || move > moveBudget {
		t.Errorf("the first standard send at the backup came %v after the grace's end (marked down at %v); want 0-%v",
			move.Round(time.Millisecond), mark.Format("15:04:05.000"), moveBudget)
	}
	// The return, from the instant planned: the first cooldown end (the
	// probe's instant, probe_at of each mark) at or after the primary's
	// return, or the return itself when the breaker was half-open by then
	// — or, when the primary's window had no room then (bookings made
	// before the outage by sends still to come), the first instant it had:
	// the earlier of its first booking from the probe on and the first
	// instant it took one more send, from Redis's own read of it at the
	// probe (exact: the limiter's rule, window + send slack, no tolerance).
	probe := up
	if at, ok := firstInstant(logInstants(t, logs, "provider marked down", "probe_at"), up); ok {
		probe = at
	}
	pr := <-atProbe
	if pr.err != nil {
		t.Fatalf("reading the primary's window at the probe: %v", pr.err)
	}
	allowed, why := probe, "the probe's instant"
	if pr.at.Equal(probe) && !pr.w.at.After(probe) {
		at := sluicetest.EarliestFit(pr.w.slots, 20, time.Second+sendSlack, probe)
		if b, ok := firstAtOrAfter(pr.w.slots, probe); ok && b.Before(at) {
			at = b
		}
		if at.After(probe) {
			allowed, why = at, fmt.Sprintf("the first instant the primary's window had room, %v after the probe's (%d entries at the probe)", at.Sub(probe).Round(time.Millisecond), len(pr.w.slots))
		}
	}
	// Never before the probe; at most returnBudget after the instant
	// allowed (earlier is fine: sends that planned again gave bookings back).
	back := firstPrimaryAfter.Sub(probe)
	if back < 0 || firstPrimaryAfter.Sub(allowed) > returnBudget {
		t.Errorf("the first send at the primary after its return came %v after the probe's instant %v, %v after %s (returned %v); want from the probe's instant to %v after the later; the workers' provider lines:\n%s",
			back.Round(time.Millisecond), probe.Format("15:04:05.000"), firstPrimaryAfter.Sub(allowed).Round(time.Millisecond), why, up.Format("15:04:05.000"), returnBudget, providerLines(logs))
	}
	// Standard sends still at the backup once the primary took traffic again.
	var after []time.Duration
	for _, d := range standard(backup.Deliveries()) {
		if d.At.After(firstPrimaryAfter) {
			after = append(after, d.At.Sub(firstPrimaryAfter))
		}
	}
	// Each account sends as its own number.
	for name, want := range map[string]string{"primary": "+15005550006", "backup": backupFrom} {
		sink := e.sms
		if name == "backup" {
			sink = backup
		}
		for _, d := range sink.Deliveries() {
			if d.From != want {
				t.Errorf("%s: %s posted with From %q, want %q", name, d.ID, d.From, want)
				break
			}
		}
	}
	t.Logf("failover: %d notifications, primary %d / backup %d (%d standard); OTPs of the outage p50 %v, slowest %v; standard on the backup %v after the outage began, %v after the grace's end; back on the primary %v after its return, %v after the probe's instant (allowed from %s); standard sends at the backup after that: %v",
		len(ids), len(e.sms.Deliveries()), len(backup.Deliveries()), len(standard(backup.Deliveries())),
		otpDelay[len(otpDelay)/2].Round(time.Millisecond), otpDelay[len(otpDelay)-1].Round(time.Millisecond),
		firstBackupStd.Sub(down).Round(time.Millisecond), move.Round(time.Millisecond),
		firstPrimaryAfter.Sub(up).Round(time.Millisecond), back.Round(time.Millisecond), why, after)
}

// The primary answers 429 with Retry-After: 30 from the first request on
// (it holds its first answers 300 ms, so the requests the workers send at
// once are all on their way before the hold begins): standard sends move
// to the backup at the grace's end (2 s after the hold began, within
// moveBudget), all of them within 10 s, instead of waiting the 30 s out; none is archived, no retry
// budget is spent, none reaches the primary during its hold but the
// requests already in flight, and those do not extend it. Both workers
// show the primary down (sluice_provider_up 0) while it is held.
func TestLongHoldMovesStandardTrafficToTheBackup(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:provider=50/1s")
	backup := fakes.NewSMSAPI(t)
	backup.SetSlots(e.slotOf)
	var mu sync.Mutex
	var first, answered time.Time
	var late int             // requests that arrived after the first answer left the fake
	var arrivals []time.Time // every request's arrival at the primary
	e.sms.SetReply(func(string, string) (int, string) {
		mu.Lock()
		now := time.Now()
		arrivals = append(arrivals, now)
		if first.IsZero() {
			first = now
		}
		if !answered.IsZero() && now.After(answered) {
			late++
		}
		wait := time.Until(first.Add(300 * time.Millisecond))
		mu.Unlock()
		time.Sleep(wait) // the fake's latency for the first requests: a scenario, not a signal
		mu.Lock()
		if answered.IsZero() {
			answered = time.Now()
		}
		mu.Unlock()
		return 429, "30"
	})
	vars := backupVars(backup)
	addrs := []string{freeAddr(t), freeAddr(t)}
	var ws []*proc
	for i, a := range addrs {
		v := maps.Clone(vars)
		v["SLUICE_HTTP_ADDR"] = a
		ws = append(ws, e.worker(fmt.Sprintf("w%d", i), v))
	}
	for _, a := range addrs {
		waitStatus(t, a, 200, 10*time.Second)
	}
	ids := e.enqueueSMS(60, recipients(10), []string{"acme"})
	ds := backup.WaitFor(t, time.Minute, "all 60 at the backup", func(ds []fakes.Delivery) bool {
		seen := map[string]bool{}
		for _, d := range ds {
			seen[d.ID] = true
		}
		return len(seen) == len(ids)
	})
	// During the hold (30 s): every worker shows the primary down.
	for i, a := range addrs {
		if up := scrape(t, a, "sluice_provider_up", `channel="sms"`, `provider="default"`); up != 0 {
			t.Errorf("w%d: sluice_provider_up{provider=default} = %v during the hold; want 0", i, up)
		}
	}
	lim, err := throttle.New(e.rdb, throttle.Options{Secret: []byte(secret), CompactMembers: true})
	if err != nil {
		t.Fatal(err)
	}
	_, hs, err := lim.ProviderStates(context.Background(), []string{""}, []string{lim.HoldKey("sms:provider", "")})
	if err != nil || hs[0].Since.IsZero() {
		t.Fatalf("the primary's hold: %+v, %v", hs, err)
	}
	mu.Lock()
	start, lateRequests, arrived := first, late, slices.Clone(arrivals)
	mu.Unlock()
	if len(ds) != len(ids) {
		t.Errorf("%d receipts at the backup for %d notifications", len(ds), len(ids))
	}
	slices.SortFunc(ds, func(a, b fakes.Delivery) int { return a.At.Compare(b.At) })
	move := ds[0].At.Sub(hs[0].Since.Add(2 * time.Second))
	if move < 0 || move > moveBudget {
		t.Errorf("first send at the backup %v after the grace's end (the hold began at %v); want 0-%v", move, hs[0].Since.Format("15:04:05.000"), moveBudget)
	}
	// Every one moved, not only the first: 60 sends at 50/1s take 1.2 s
	// after the grace; a send whose pick read the primary up just before
	// the hold began is picked again, not booked behind the hold (those
	// went at the hold's end, 29.5 s, before).
	if last := ds[len(ds)-1].At.Sub(start); last > 10*time.Second {
		t.Errorf("the last send at the backup came %v after the first 429; want within 10 s, well before the 30 s hold ends", last)
	}
	// The requests that reached the primary before its first answer were
	// all on their way at once: at most the standard lanes' concurrency
	// (2 workers × 8). Later ones were picked before a worker had written
	// the hold (a 429 answered, not yet recorded); none may come once it
	// is in Redis, beyond the latency budget (a pick read just before).
	var before, afterHold int
	for _, at := range arrived {
		if !at.After(start.Add(300 * time.Millisecond)) {
			before++
		}
		if at.After(hs[0].Since.Add(latencyBudget)) {
			afterHold++
		}
	}
	if before > 2*8 || afterHold != 0 {
		t.Errorf("%d requests reached the primary: %d before its first answer (want at most 2 workers × 8 in flight), %d more than %v after the hold began at %v (want 0)",
			len(arrived), before, afterHold, latencyBudget, hs[0].Since.Format("15:04:05.000"))
	}
	var begun, extended, inFlight float64
	for _, a := range addrs {
		begun += scrape(t, a, "sluice_provider_holds_total", `hold="begun"`)
		extended += scrape(t, a, "sluice_provider_holds_total", `hold="extended"`)
		inFlight += scrape(t, a, "sluice_provider_holds_total", `hold="in_flight"`)
	}
	// Only a request that left after the hold began may extend it: one
	// that arrived after the fake's first answer left.
	if begun != 1 || extended > float64(lateRequests) {
		t.Errorf("holds: begun %v, extended %v, in_flight %v; want 1 begun and at most %d extended (the requests that reached the primary after its first answer)",
			begun, extended, inFlight, lateRequests)
	}
	if qi, err := e.queueInfo(); err != nil || qi.Archived != 0 {
		t.Errorf("archived: %+v %v", qi, err)
	}
	if logs := ws[0].logText() + ws[1].logText(); strings.Contains(logs, "transient send failure") {
		t.Errorf("a throttling answer spent a retry:\n%s", tail(logs, 20))
	}
	t.Logf("a 30 s hold: %d requests reached the primary (%d after its first answer); holds begun %v, in_flight %v, extended %v; the backup's first send %v after the first 429, %v after the grace's end, its last %v",
		e.sms.Attempts(), lateRequests, begun, inFlight, extended, ds[0].At.Sub(start).Round(time.Millisecond), move.Round(time.Millisecond), ds[len(ds)-1].At.Sub(start).Round(time.Millisecond))
}

// backupFrom is the backup account's own number (SLUICE_PROVIDER_BACKUP_SMS_FROM);
// the primary sends as the env's SLUICE_SMS_FROM.
const backupFrom = "+15005550199"

// moveBudget is the budget of a move to the backup, from the instant the
// workers plan it (the grace's end after the mark) to the request's
// arrival at the fake. Issue 53 asks for 100 ms (they landed 0.19-0.7 s
// late, at Asynq's next whole second); unloaded the move comes 2-10 ms
// after it, and the worker test TestFailoverAtTheGraceAndBackAtTheProbe
// holds it to 100 ms. Here, beside the other e2e tests at once, a move
// came 102 ms after it: this is latency, not exactness (the limiter's
// audits judge that by slot), so the e2e budget is 1 s.
const moveBudget = time.Second

// returnBudget is the budget of the return: from the instant the primary
// could take a send again to the first send's arrival there. That instant
// is the probe's (the cooldown's end the workers log), unless the
// primary's window had no room then: before the outage the drain booked
// sends still to come at the rule's full rate, 20 per window + slack
// (1.25 s), in runs of 20 a few ms apart, each 1.25 s after the last, so
// no instant before the last of them took one more (scripts/limiter_log.lua).
// Then the first send at the primary may come at the first of those
// bookings, and no earlier than Redis's own read of the window at the
// probe allows: measured, 5-25 ms after the probe's instant where it had
// room (12 runs of 19) and 244-781 ms after it where it had none (before
// the first booking, 1.15-1.2 s on: sends that planned again gave theirs
// back). Latency, not exactness (the audits above judge every window by
// slot): 1 s, as the move's. The worker test
// TestFailoverAtTheGraceAndBackAtTheProbe, without bookings, holds the
// return to 100 ms.
const returnBudget = time.Second

// logInstants are the times that key= carries on the log lines containing
// msg (slog's text format, RFC 3339).
func logInstants(t *testing.T, logs, msg, key string) []time.Time {
	t.Helper()
	out, err := parseInstants(logs, msg, key)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// parseInstants is logInstants for a goroutine of the test's (no t).
func parseInstants(logs, msg, key string) ([]time.Time, error) {
	re := regexp.MustCompile(`\b` + regexp.QuoteMeta(key) + `=(\S+)`)
	var out []time.Time
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, msg) {
			continue
		}
		if m := re.FindStringSubmatch(line); m != nil {
			at, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				return nil, fmt.Errorf("%s=%q in %q: %w", key, m[1], line, err)
			}
			out = append(out, at)
		}
	}
	return out, nil
}

// probeWindow waits for the probe's instant the workers plan at or after
// up (the earliest probe_at at or after it that a mark of the primary
// logs; up itself when none is logged within 6 s: the breaker was
// half-open by then) and reads the primary's window until that instant:
// the last read Redis made at or before it is what the primary could take
// when its probe came.
func (e *env) probeWindow(up time.Time, procs ...*proc) (time.Time, windowAt, error) {
	probe := up
	for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var logs string
		for _, p := range procs {
			logs += p.logText()
		}
		marks, err := parseInstants(logs, "provider marked down", "probe_at")
		if err != nil {
			return time.Time{}, windowAt{}, err
		}
		if at, ok := firstInstant(marks, up); ok {
			probe = at
			break
		}
	}
	time.Sleep(time.Until(probe.Add(-50 * time.Millisecond)))
	var last windowAt
	for {
		w, err := readProviderWindow(context.Background(), e.rdb)
		if err != nil {
			return time.Time{}, windowAt{}, err
		}
		if w.at.After(probe) {
			if last.at.IsZero() {
				last = w // read after the probe's instant: the caller judges by it strictly
			}
			return probe, last, nil
		}
		last = w
		time.Sleep(5 * time.Millisecond)
	}
}

// firstInstant is the earliest of ts at or after from.
func firstInstant(ts []time.Time, from time.Time) (time.Time, bool) {
	var first time.Time
	for _, u := range ts {
		if !u.Before(from) && (first.IsZero() || u.Before(first)) {
			first = u
		}
	}
	return first, !first.IsZero()
}

// scrape sums the samples of a worker's /metrics whose line starts with
// name and holds every one of labels (e.g. `provider="default"`).
func scrape(t *testing.T, addr, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sum := 0.0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
next:
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(line, l) {
				continue next
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// providerLines are the log lines about providers' states: what a
// failure of the move or the return is read against.
func providerLines(logs string) string {
	var out []string
	for _, line := range strings.Split(logs, "\n") {
		for _, m := range []string{"marked down", "probing", "back in service", "gave back a provider's probe", "changed state"} {
			if strings.Contains(line, m) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
