package e2e

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
)

// backupVars configure a second Twilio-compatible provider, "backup", after
// the default one (the env's fake), with a 2 s failover grace.
func backupVars(backup *fakes.SMSAPI) map[string]string {
	return map[string]string{
		"SLUICE_SMS_PROVIDERS":                   "default,backup",
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
// above); standard traffic moves to the backup after the grace, and back
// to the primary within 6 s of its return (cooldown 3 s; 1.3-2.5 s measured,
// 2.5-8.7 s before a booked probe was given back).
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
	if !strings.Contains(logs, "provider marked down") {
		t.Errorf("no worker marked the primary down")
	}
	t.Logf("failover: %d notifications, primary %d / backup %d (%d standard); OTPs of the outage p50 %v, slowest %v; standard on the backup %v after the outage began; back on the primary %v after its return",
		len(ids), len(e.sms.Deliveries()), len(backup.Deliveries()), len(standard(backup.Deliveries())),
		otpDelay[len(otpDelay)/2].Round(time.Millisecond), otpDelay[len(otpDelay)-1].Round(time.Millisecond),
		firstBackupStd.Sub(down).Round(time.Millisecond), firstPrimaryAfter.Sub(up).Round(time.Millisecond))
}

// The primary answers 429 with Retry-After: 30 from the first request on:
// standard sends move to the backup after the 2 s grace instead of waiting
// the 30 s out; none is archived, no retry budget is spent, none reaches
// the primary during its hold but the requests already in flight.
func TestLongHoldMovesStandardTrafficToTheBackup(t *testing.T) {
	t.Parallel()
	e := newEnv(t, "sms:provider=50/1s")
	backup := fakes.NewSMSAPI(t)
	backup.SetSlots(e.slotOf)
	var mu sync.Mutex
	var first time.Time
	e.sms.SetReply(func(string, string) (int, string) {
		mu.Lock()
		defer mu.Unlock()
		if first.IsZero() {
			first = time.Now()
		}
		return 429, "30"
	})
	vars := backupVars(backup)
	w0, w1 := e.worker("w0", vars), e.worker("w1", vars)
	ids := e.enqueueSMS(60, recipients(10), []string{"acme"})
	ds := backup.WaitFor(t, time.Minute, "all 60 at the backup", func(ds []fakes.Delivery) bool {
		seen := map[string]bool{}
		for _, d := range ds {
			seen[d.ID] = true
		}
		return len(seen) == len(ids)
	})
	mu.Lock()
	start := first
	mu.Unlock()
	if len(ds) != len(ids) {
		t.Errorf("%d receipts at the backup for %d notifications", len(ds), len(ids))
	}
	slices.SortFunc(ds, func(a, b fakes.Delivery) int { return a.At.Compare(b.At) })
	if got := ds[0].At.Sub(start); got < 2*time.Second || got > 10*time.Second {
		t.Errorf("first send at the backup %v after the first 429; want after the 2 s grace, well before the 30 s hold ends", got)
	}
	if n := e.sms.Attempts(); n > 2*8 {
		t.Errorf("%d requests reached the held primary; at most the ones in flight when the hold began (2 workers × 8)", n)
	}
	if qi, err := e.queueInfo(); err != nil || qi.Archived != 0 {
		t.Errorf("archived: %+v %v", qi, err)
	}
	if logs := w0.logText() + w1.logText(); strings.Contains(logs, "transient send failure") {
		t.Errorf("a throttling answer spent a retry:\n%s", tail(logs, 20))
	}
	t.Logf("a 30 s hold: %d requests reached the primary; the backup's first send %v after the first 429, its last %v",
		e.sms.Attempts(), ds[0].At.Sub(start).Round(time.Millisecond), ds[len(ds)-1].At.Sub(start).Round(time.Millisecond))
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
