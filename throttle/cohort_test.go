package throttle_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// scriptCalls counts the limiter library's calls Redis ran since the last
// CONFIG RESETSTAT.
func scriptCalls(t *testing.T, b *testBundle) int {
	t.Helper()
	info := b.client.Info(context.Background(), "commandstats").Val()
	n := 0
	for _, line := range strings.Split(info, "\n") {
		for _, name := range []string{"cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), name); ok {
				calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				c, _ := strconv.Atoi(calls)
				n += c
			}
		}
	}
	return n
}

// The members of a cohort go to Redis as one call once every one has
// asked, and their checks run in seat order: of five competing for three
// places, seats 0–2 get them, though the members ask in reverse order.
func TestCohortChecksInOneCallInSeatOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	ctx := context.Background()
	lim := throttle.Limit{Scope: "sms:recipient", Subject: "+14155550100", Rule: throttle.Rule{Limit: 3, Window: time.Minute}}
	if _, err := b.lim.Allow(ctx, b.group, member(), throttle.Limit{Scope: "warm", Rule: throttle.Rule{Limit: 10, Window: time.Second}}); err != nil {
		t.Fatal(err) // the library loaded before the count
	}
	for trial := range 10 {
		b.client.ConfigResetStat(ctx)
		subject := fmt.Sprintf("+1415555%04d", trial)
		l := lim
		l.Subject = subject
		c := b.lim.NewCohort(5, time.Hour) // only the members can send it
		got := make([]throttle.Decision, 5)
		var wg sync.WaitGroup
		for i := 4; i >= 0; i-- {
			asked := make(chan struct{})
			wg.Go(func() {
				close(asked)
				d, err := b.lim.Reserve(ctx, b.group, fmt.Sprintf("n%d-%d", trial, i), throttle.ReserveOptions{Seat: c.Seat(i)}, l)
				if err != nil {
					t.Error(err)
				}
				got[i] = d
			})
			<-asked
			time.Sleep(time.Millisecond) // a nudge towards reverse order; the assertion does not rely on it
		}
		wg.Wait()
		for i, d := range got {
			want := throttle.StatusAdmitted
			if i >= 3 {
				want = throttle.StatusDenied
			}
			if d.Status != want {
				t.Fatalf("trial %d seat %d: %v, want %v (seat order)", trial, i, d.Status, want)
			}
		}
		if n := scriptCalls(t, b); n != 1 {
			t.Fatalf("trial %d: %d calls of the limiter, want the cohort's one", trial, n)
		}
	}
}

// A member that leaves (its task ended before its check) lets the others
// go at once; one that never comes holds them only for the cohort's wait;
// one that asks after its cohort went is answered alone.
func TestCohortLeaveWaitAndLateMember(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	lim := throttle.Limit{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 100, Window: time.Minute}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a failure detector, not a measurement
	defer cancel()

	c := b.lim.NewCohort(3, time.Hour)
	c.Seat(1).Leave()
	done := make(chan error, 2)
	for _, i := range []int{0, 2} {
		go func() {
			d, err := b.lim.Reserve(ctx, b.group, member(), throttle.ReserveOptions{Seat: c.Seat(i)}, lim)
			if err == nil && d.Status != throttle.StatusAdmitted {
				err = fmt.Errorf("status %v", d.Status)
			}
			done <- err
		}()
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("a member whose cohort lost one to Leave: %v (a context deadline means it waited for the leaver)", err)
		}
	}

	c = b.lim.NewCohort(2, 50*time.Millisecond)
	d, err := b.lim.Reserve(ctx, b.group, member(), throttle.ReserveOptions{Seat: c.Seat(0)}, lim)
	if err != nil || d.Status != throttle.StatusAdmitted {
		t.Fatalf("the member whose peer never came: %v, %v", d.Status, err)
	}
	d, err = b.lim.Reserve(ctx, b.group, member(), throttle.ReserveOptions{Seat: c.Seat(1)}, lim)
	if err != nil || d.Status != throttle.StatusAdmitted {
		t.Fatalf("the member that came after its cohort went: %v, %v", d.Status, err)
	}
	c.Seat(1).Leave() // after it asked: nothing
	if _, err := b.lim.Reserve(ctx, b.group, member(), throttle.ReserveOptions{Seat: c.Seat(1)}, lim); err != nil {
		t.Fatalf("a seat used twice goes alone: %v", err)
	}
}
