package throttle_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/throttle"
)

// Series counts each step's admissions, the window's fill as it grew and
// the bookings ahead, with the boundaries Allow uses: a step is (end−step,
// end], the window [now−window, now], booked after now.
func TestSeriesCountsStepsWindowAndBookings(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := throttle.Limit{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 100, Window: 2 * time.Minute}}
	key := b.key(t, lim)
	now := b.clock.Now().UnixMilli()
	const m = int64(time.Minute / time.Millisecond)
	at := func(ms ...int64) {
		t.Helper()
		for _, v := range ms {
			if err := b.client.ZAdd(ctx, key, redis.Z{Score: float64(v), Member: member()}).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Five steps of a minute: step i covers (now−(5−i)m, now−(4−i)m].
	at(now-4*m-m/2, now-4*m, // step 0, the second at its very end
		now-3*m,            // step 1's end
		now-2*m-1, now-2*m, // step 2: one ms before the window, then exactly now−window (inside)
		now-m/2, now, // step 4, the second now itself
		now+1, now+m) // booked ahead
	s, err := b.lim.Series(ctx, b.group, lim, 5*time.Minute, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Now.Equal(b.clock.Now()) || s.Step != time.Minute || s.Limit != lim {
		t.Fatalf("series read at %v, step %v, limit %+v", s.Now, s.Step, s.Limit)
	}
	if want := []int{2, 1, 2, 0, 2}; !slices.Equal(s.Counts, want) {
		t.Errorf("counts %v, want %v", s.Counts, want)
	}
	// The window began at now−2m: steps ending before it have no fill.
	if want := []int{-1, -1, 1, 1, 3}; !slices.Equal(s.InWindow, want) {
		t.Errorf("in window %v, want %v", s.InWindow, want)
	}
	if s.Used != 3 || s.Booked != 2 || s.Total() != 7 || s.Peak() != 2 {
		t.Errorf("used %d booked %d total %d peak %d, want 3 2 7 2", s.Used, s.Booked, s.Total(), s.Peak())
	}
	// The same window as Usage reads it.
	us, err := b.lim.Usage(ctx, b.group, 0, lim)
	if err != nil {
		t.Fatal(err)
	}
	if us[0].Used != s.Used || us[0].Booked != s.Booked {
		t.Errorf("usage says used %d booked %d; series %d %d", us[0].Used, us[0].Booked, s.Used, s.Booked)
	}
	// Nothing was trimmed or written: the entry out of the window is still there.
	if n, err := b.client.ZCard(ctx, key).Result(); err != nil || n != 9 {
		t.Fatalf("the window holds %d entries (%v) after a read, want 9", n, err)
	}
}

// Admissions made through Allow at their own instants show in the steps
// they were made in; a window longer than the span has fill in every step.
func TestSeriesOfAllowedSends(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := throttle.Limit{Scope: "email:tenant", Rule: throttle.PerHour(50)}
	for _, n := range []int{3, 0, 1, 4} {
		for range n {
			if d, err := b.lim.Allow(ctx, b.group, member(), lim); err != nil || !d.Allowed {
				t.Fatalf("allow: %+v %v", d, err)
			}
		}
		b.clock.Add(10 * time.Second)
	}
	b.clock.Add(-10 * time.Second) // now is the instant of the last sends
	s, err := b.lim.Series(ctx, b.group, lim, 50*time.Second, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{0, 3, 0, 1, 4}; !slices.Equal(s.Counts, want) {
		t.Errorf("counts %v, want %v", s.Counts, want)
	}
	if want := []int{0, 3, 3, 4, 8}; !slices.Equal(s.InWindow, want) {
		t.Errorf("in window %v, want %v", s.InWindow, want)
	}
	// A span that is not whole steps is rounded up.
	if s, err := b.lim.Series(ctx, b.group, lim, 45*time.Second, 10*time.Second); err != nil || len(s.Counts) != 5 {
		t.Fatalf("45s in steps of 10s: %d steps, %v", len(s.Counts), err)
	}
}

// Without Options.Now the series is read on the Redis clock, never the
// host's (invariant 2): a limiter whose host clock is decades off reads
// the same instant as Redis TIME.
func TestSeriesUsesRedisTime(t *testing.T) {
	t.Parallel()
	_, c := setupRedis(t)
	lim, err := throttle.New(c, throttle.Options{Secret: testSecret, Clock: func() time.Time { return time.Unix(1e9, 0) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	l := throttle.Limit{Scope: "sms:tenant", Rule: throttle.PerMinute(5)}
	if d, err := lim.Allow(ctx, "acme", member(), l); err != nil || !d.Allowed {
		t.Fatalf("allow: %+v %v", d, err)
	}
	before, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	s, err := lim.Series(ctx, "acme", l, time.Minute, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	after, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	ms := func(t time.Time) time.Time { return t.Truncate(time.Millisecond) }
	if s.Now.Before(ms(before)) || s.Now.After(after) {
		t.Fatalf("series read at %v, outside Redis TIME %v … %v", s.Now, before, after)
	}
	if s.Used != 1 || s.Total() != 1 || len(s.Counts) != 60 {
		t.Fatalf("series %+v, want the one send in 60 steps", s)
	}
}

// Bad input is an error, never a panic.
func TestSeriesRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	ok := throttle.Limit{Scope: "sms:tenant", Rule: throttle.PerHour(10)}
	for _, c := range []struct {
		name       string
		lim        throttle.Limit
		span, step time.Duration
		want       error
	}{
		{"ZeroStep", ok, time.Hour, 0, throttle.ErrInvalidRule},
		{"SubMillisecondStep", ok, time.Hour, time.Microsecond, throttle.ErrInvalidRule},
		{"SpanBelowStep", ok, time.Second, time.Minute, throttle.ErrInvalidRule},
		{"TooManySteps", ok, 24 * time.Hour, time.Second, throttle.ErrInvalidRule},
		{"NoScope", throttle.Limit{Rule: throttle.PerHour(10)}, time.Hour, time.Minute, throttle.ErrInvalidKey},
		{"BadRule", throttle.Limit{Scope: "sms:tenant"}, time.Hour, time.Minute, throttle.ErrInvalidRule},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := b.lim.Series(ctx, b.group, c.lim, c.span, c.step); !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
		})
	}
	if _, err := b.lim.Series(ctx, "", ok, time.Hour, time.Minute); !errors.Is(err, throttle.ErrInvalidKey) {
		t.Fatalf("empty group: %v", err)
	}
}
