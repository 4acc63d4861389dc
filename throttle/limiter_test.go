package throttle_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

var ctx = context.Background()

func recipient(rule throttle.Rule) throttle.Limit {
	return throttle.Limit{Scope: "sms:recipient", Subject: "+14155550100", Rule: rule}
}

// The classic sliding-log demo: limit 5, window 10 s, 8 requests 100 ms apart → 5 ALLOW, 3 DENY.
func TestClassicDemo(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 5, Window: 10 * time.Second})
	var got []string
	var sixth throttle.Decision
	for i := 0; i < 8; i++ {
		d, err := b.lim.Allow(ctx, b.group, member(), lim)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			got = append(got, "ALLOW")
		} else {
			got = append(got, "DENY")
		}
		if i == 5 {
			sixth = d
		}
		b.clock.Add(100 * time.Millisecond)
	}
	if want := "ALLOW ALLOW ALLOW ALLOW ALLOW DENY DENY DENY"; strings.Join(got, " ") != want {
		t.Fatalf("decisions = %v, want %s", got, want)
	}
	// Request 6 is at +500 ms; the first entry (at +0) leaves after +10 000 ms.
	if want := 10*time.Second - 500*time.Millisecond + time.Millisecond; sixth.RetryAfter != want {
		t.Fatalf("retry-after of 6th = %v, want %v", sixth.RetryAfter, want)
	}
	if sixth.DeniedBy != 0 || sixth.Remaining != 0 {
		t.Fatalf("sixth = %+v, want DeniedBy 0, Remaining 0", sixth)
	}
}

// The same demo on Redis TIME, 100 ms apart in real time.
func TestClassicDemoRealClock(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	lim := recipient(throttle.Rule{Limit: 5, Window: 10 * time.Second})
	allowed := 0
	var sixth throttle.Decision
	for i := 0; i < 8; i++ {
		d, err := b.lim.Allow(ctx, b.group, member(), lim)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != (i < 5) {
			t.Fatalf("request %d allowed=%v", i+1, d.Allowed)
		}
		if d.Allowed {
			allowed++
		}
		if i == 5 {
			sixth = d
		}
		time.Sleep(100 * time.Millisecond) // the demo's pacing, not synchronisation
	}
	// Retry-after of the 6th is 10 s minus the time since the first admission (≈ 500 ms).
	if sixth.RetryAfter > 9501*time.Millisecond || sixth.RetryAfter < 9000*time.Millisecond {
		t.Fatalf("retry-after of 6th = %v, want ≈ 9.5 s", sixth.RetryAfter)
	}
}

// An entry scored exactly now−window still counts; 1 ms older does not.
func TestBoundary(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 1, Window: time.Minute})
	t0 := b.clock.Now()
	if d, err := b.lim.Allow(ctx, b.group, member(), lim); err != nil || !d.Allowed {
		t.Fatalf("first: %+v %v", d, err)
	}
	b.clock.Set(t0.Add(time.Minute)) // the entry sits exactly at now−window
	d, err := b.lim.Allow(ctx, b.group, member(), lim)
	if err != nil || d.Allowed {
		t.Fatalf("at now−window: %+v %v; the entry must still count", d, err)
	}
	if d.RetryAfter != time.Millisecond {
		t.Fatalf("retry-after at boundary = %v, want 1ms", d.RetryAfter)
	}
	b.clock.Set(t0.Add(time.Minute + time.Millisecond))
	if d, err := b.lim.Allow(ctx, b.group, member(), lim); err != nil || !d.Allowed {
		t.Fatalf("1 ms past the boundary: %+v %v; the entry must be out", d, err)
	}
}

// The textbook fixed-window burst: 100 at 00:59.950 and 100 at 01:00.000 with
// 100/min. A fixed window passes all 200; the sliding log must pass 100.
func TestFixedWindowBurstDoesNotPass(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.PerMinute(100))
	minute := time.UnixMilli(1_716_873_600_000).Truncate(time.Minute)
	allowed := 0
	for _, at := range []time.Time{minute.Add(-50 * time.Millisecond), minute} {
		b.clock.Set(at)
		for i := 0; i < 100; i++ {
			d, err := b.lim.Allow(ctx, b.group, member(), lim)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				allowed++
			}
		}
	}
	if allowed != 100 {
		t.Fatalf("admitted %d around the minute boundary, want 100", allowed)
	}
	// And the textbook half-window case: 100 at 00:59:50 → at 01:00:50 only
	// those that left (none before 01:00:50.001) make room.
	b.clock.Set(minute.Add(time.Minute - 50*time.Millisecond))
	d, err := b.lim.Allow(ctx, b.group, member(), lim)
	if err != nil || d.Allowed {
		t.Fatalf("one minute after the first burst, at its exact boundary: %+v %v", d, err)
	}
	b.clock.Set(minute.Add(time.Minute - 49*time.Millisecond))
	if d, err := b.lim.Allow(ctx, b.group, member(), lim); err != nil || !d.Allowed {
		t.Fatalf("after the first burst left: %+v %v", d, err)
	}
}

func TestDenialsAddNothingAndFloodIsBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 10, Window: time.Minute})
	key := b.key(t, lim)
	for i := 0; i < 1000; i++ {
		if _, err := b.lim.Allow(ctx, b.group, member(), lim); err != nil {
			t.Fatal(err)
		}
		if i%7 == 0 {
			b.clock.Add(time.Second) // 143 s of flooding: entries leave and re-enter
		}
		if n := b.client.ZCard(ctx, key).Val(); n > 10 {
			t.Fatalf("after call %d the set holds %d entries, limit 10", i, n)
		}
	}
	before := b.client.ZRangeWithScores(ctx, key, 0, -1).Val()
	d, err := b.lim.Allow(ctx, b.group, member(), lim)
	if err != nil || d.Allowed {
		t.Fatalf("flooded key admitted: %+v %v", d, err)
	}
	after := b.client.ZRangeWithScores(ctx, key, 0, -1).Val()
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("a denial changed the set:\nbefore %v\nafter  %v", before, after)
	}
}

func TestTTLIsTheWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	for _, w := range []time.Duration{1500 * time.Millisecond, time.Minute, 24 * time.Hour} {
		lim := recipient(throttle.Rule{Limit: 3, Window: w})
		if _, err := b.lim.Allow(ctx, b.group, member(), lim); err != nil {
			t.Fatal(err)
		}
		pttl := b.client.PTTL(ctx, b.key(t, lim)).Val()
		if pttl <= w-time.Second || pttl > w+time.Millisecond {
			t.Fatalf("window %v: PTTL = %v", w, pttl)
		}
	}
}

func TestIdempotentMember(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 2, Window: time.Minute})
	id := member()
	d1, _ := b.lim.Allow(ctx, b.group, id, lim)
	b.clock.Add(time.Second)
	d2, err := b.lim.Allow(ctx, b.group, id, lim)
	if err != nil || !d1.Allowed || !d2.Allowed || d1.Duplicate || !d2.Duplicate {
		t.Fatalf("d1=%+v d2=%+v err=%v", d1, d2, err)
	}
	if n := b.client.ZCard(ctx, b.key(t, lim)).Val(); n != 1 {
		t.Fatalf("same member counted %d times", n)
	}
	// One more distinct member fits; the re-run did not take its slot.
	if d, _ := b.lim.Allow(ctx, b.group, member(), lim); !d.Allowed {
		t.Fatal("second distinct member denied")
	}
	// A duplicate is still allowed when the window is full.
	if d, _ := b.lim.Allow(ctx, b.group, id, lim); !d.Allowed || !d.Duplicate {
		t.Fatalf("re-run on a full window: %+v", d)
	}
	// Long after the window, the same member is admitted anew.
	b.clock.Add(2 * time.Minute)
	if d, _ := b.lim.Allow(ctx, b.group, id, lim); !d.Allowed || d.Duplicate {
		t.Fatalf("re-run after the window: %+v", d)
	}
}

// A member already inside any key's window is a duplicate, even when the
// check names a key it is not in: nothing is added anywhere (the admit path
// learns it from ZADD NX and takes back what it added).
func TestDuplicateInAnyKeyAddsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	day := throttle.Limit{Scope: "sms:tenant", Subject: "acme", Rule: throttle.Rule{Limit: 5, Window: 24 * time.Hour}}
	minute := recipient(throttle.Rule{Limit: 1, Window: time.Minute})
	hour := recipient(throttle.Rule{Limit: 3, Window: time.Hour})
	id := member()
	if d, err := b.lim.Allow(ctx, b.group, id, day); err != nil || !d.Allowed || d.Duplicate {
		t.Fatalf("first: %+v %v", d, err)
	}
	// The member is in the day key only; asked with two fresh keys first.
	for _, full := range []bool{false, true} {
		if full { // the minute key full: the deny path must say duplicate too
			if d, _ := b.lim.Allow(ctx, b.group, member(), minute); !d.Allowed {
				t.Fatalf("filling the minute key: %+v", d)
			}
		}
		d, err := b.lim.Allow(ctx, b.group, id, minute, hour, day)
		if err != nil || !d.Allowed || !d.Duplicate {
			t.Fatalf("full=%v: %+v %v, want an allowed duplicate", full, d, err)
		}
		wantMinute := int64(0)
		if full {
			wantMinute = 1
		}
		if m, h := b.client.ZCard(ctx, b.key(t, minute)).Val(), b.client.ZCard(ctx, b.key(t, hour)).Val(); m != wantMinute || h != 0 {
			t.Fatalf("full=%v: minute key holds %d, hour key %d; want %d and 0: the duplicate was added", full, m, h, wantMinute)
		}
	}
	if n := b.client.ZCard(ctx, b.key(t, day)).Val(); n != 1 {
		t.Fatalf("day key holds %d entries, want 1", n)
	}
}

func TestRelease(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lims := []throttle.Limit{
		recipient(throttle.Rule{Limit: 1, Window: time.Minute}),
		{Scope: "sms:tenant", Rule: throttle.PerHour(100)},
	}
	id := member()
	if d, _ := b.lim.Allow(ctx, b.group, id, lims...); !d.Allowed {
		t.Fatal("first denied")
	}
	if d, _ := b.lim.Allow(ctx, b.group, member(), lims...); d.Allowed {
		t.Fatal("second admitted over 1/1m")
	}
	n, err := b.lim.Release(ctx, b.group, id, 1, lims...)
	if err != nil || n != 2 {
		t.Fatalf("release = %d, %v; want 2 windows", n, err)
	}
	if d, _ := b.lim.Allow(ctx, b.group, member(), lims...); !d.Allowed {
		t.Fatal("released slot not given back")
	}
	if n, _ := b.lim.Release(ctx, b.group, "never-admitted", 1, lims...); n != 0 {
		t.Fatalf("release of an unknown member removed %d", n)
	}
}

// When one rule of a check is full, the others gain no entry.
func TestAllOrNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	rcpt := recipient(throttle.Rule{Limit: 5, Window: time.Minute})
	tenant := throttle.Limit{Scope: "sms:tenant", Rule: throttle.Rule{Limit: 2, Window: time.Hour}}
	other := throttle.Limit{Scope: "sms:recipient", Subject: "+14155550199", Rule: rcpt.Rule}

	for i := 0; i < 2; i++ {
		if d, _ := b.lim.Allow(ctx, b.group, member(), other, tenant); !d.Allowed {
			t.Fatal("tenant had room")
		}
	}
	// Tenant full: the recipient rule (with room) must gain nothing.
	d, err := b.lim.Allow(ctx, b.group, member(), rcpt, tenant)
	if err != nil || d.Allowed || d.DeniedBy != 1 {
		t.Fatalf("want denial by the tenant rule (index 1), got %+v %v", d, err)
	}
	if n := b.client.ZCard(ctx, b.key(t, rcpt)).Val(); n != 0 {
		t.Fatalf("recipient set gained %d entries on a tenant denial", n)
	}
	// And the other way round: recipient full, tenant with room gains nothing.
	tenant2 := throttle.Limit{Scope: "email:tenant", Rule: throttle.PerHour(100)}
	r1 := throttle.Limit{Scope: "email:recipient", Subject: "a@example.com", Rule: throttle.Rule{Limit: 1, Window: time.Minute}}
	if d, _ := b.lim.Allow(ctx, b.group, member(), r1, tenant2); !d.Allowed {
		t.Fatal("first email denied")
	}
	if d, _ := b.lim.Allow(ctx, b.group, member(), r1, tenant2); d.Allowed || d.DeniedBy != 0 {
		t.Fatalf("want denial by the recipient rule, got %+v", d)
	}
	if n := b.client.ZCard(ctx, b.key(t, tenant2)).Val(); n != 1 {
		t.Fatalf("tenant set holds %d entries, want 1", n)
	}
}

// A denial reports the rule with the longest wait.
func TestLongestWaitWins(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	perMin := recipient(throttle.Rule{Limit: 1, Window: time.Minute})
	perDay := throttle.Limit{Scope: "sms:recipient", Subject: "+14155550100", Rule: throttle.Rule{Limit: 2, Window: 24 * time.Hour}}
	for i := 0; i < 2; i++ {
		if d, _ := b.lim.Allow(ctx, b.group, member(), perMin, perDay); !d.Allowed {
			t.Fatalf("send %d denied", i)
		}
		b.clock.Add(2 * time.Minute)
	}
	d, _ := b.lim.Allow(ctx, b.group, member(), perMin, perDay)
	if d.Allowed || d.DeniedBy != 1 {
		t.Fatalf("want the daily rule to deny, got %+v", d)
	}
	if want := 24*time.Hour - 4*time.Minute + time.Millisecond; d.RetryAfter != want {
		t.Fatalf("retry-after = %v, want %v", d.RetryAfter, want)
	}
	// Both full: the per-minute rule waits 1 min, the day rule longer; the day wins.
	b.lim.Reset(ctx, b.group, perDay)
	b.lim.Allow(ctx, b.group, member(), perMin, perDay)
	d, _ = b.lim.Allow(ctx, b.group, member(), perMin, perDay)
	if d.Allowed || d.DeniedBy != 0 || d.RetryAfter != time.Minute+time.Millisecond {
		t.Fatalf("only the minute rule full: %+v", d)
	}
}

// Retry-after is never early: a check made exactly when it says is admitted.
func TestRetryAfterIsExact(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 3, Window: 10 * time.Second})
	for i := 0; i < 200; i++ {
		d, err := b.lim.Allow(ctx, b.group, member(), lim)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			b.clock.Add(time.Duration(i%5) * 700 * time.Millisecond)
			continue
		}
		// One ms early must still be denied; at RetryAfter it must be admitted.
		b.clock.Add(d.RetryAfter - time.Millisecond)
		if early, _ := b.lim.Allow(ctx, b.group, member(), lim); early.Allowed {
			t.Fatalf("call %d: admitted 1 ms before retry-after %v", i, d.RetryAfter)
		}
		b.clock.Add(time.Millisecond)
		if on, _ := b.lim.Allow(ctx, b.group, member(), lim); !on.Allowed {
			t.Fatalf("call %d: denied at retry-after %v: %+v", i, d.RetryAfter, on)
		}
	}
}

func TestUsageAndReset(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	lim := recipient(throttle.Rule{Limit: 3, Window: time.Minute})
	t0 := b.clock.Now()
	for i := 0; i < 3; i++ {
		b.lim.Allow(ctx, b.group, member(), lim)
		b.clock.Add(time.Second)
	}
	u, err := b.lim.Usage(ctx, b.group, 0, lim)
	if err != nil {
		t.Fatal(err)
	}
	if u[0].Used != 3 || u[0].Remaining != 0 || !u[0].Oldest.Equal(t0) ||
		!u[0].NextFree.Equal(t0.Add(time.Minute+time.Millisecond)) ||
		!u[0].ResetAt.Equal(t0.Add(2*time.Second+time.Minute+time.Millisecond)) {
		t.Fatalf("usage = %+v", u[0])
	}
	d, _ := b.lim.Allow(ctx, b.group, member(), lim)
	if got := d.Now.Add(d.RetryAfter); !got.Equal(u[0].NextFree) {
		t.Fatalf("Usage.NextFree %v disagrees with Allow's retry time %v", u[0].NextFree, got)
	}
	if err := b.lim.Reset(ctx, b.group, lim); err != nil {
		t.Fatal(err)
	}
	u, _ = b.lim.Usage(ctx, b.group, 0, lim)
	if u[0].Used != 0 || u[0].Remaining != 3 {
		t.Fatalf("after reset: %+v", u[0])
	}
}

// Worker clocks never decide a window: limiters whose host clocks are hours
// apart still admit exactly the limit, and each RetryAt is in its own clock.
func TestClockSkewCannotMatter(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	ahead := time.Now().Add(3 * time.Hour)
	behind := time.Now().Add(-3 * time.Hour)
	mk := func(at time.Time) *throttle.Limiter {
		l, err := throttle.New(b.client, throttle.Options{Secret: testSecret, Clock: func() time.Time { return at }})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	la, lb := mk(ahead), mk(behind)
	lim := recipient(throttle.Rule{Limit: 10, Window: time.Hour})
	admitted := 0
	for i := 0; i < 40; i++ {
		l := la
		if i%2 == 1 {
			l = lb
		}
		d, err := l.Allow(ctx, b.group, member(), lim)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
			continue
		}
		host := ahead
		if l == lb {
			host = behind
		}
		if !d.RetryAt.Equal(host.Add(d.RetryAfter)) {
			t.Fatalf("RetryAt %v not in the asking host's clock", d.RetryAt)
		}
	}
	if admitted != 10 {
		t.Fatalf("skewed hosts admitted %d, want 10", admitted)
	}
	// The decision's Now is the Redis server's time.
	before, _ := b.client.Time(ctx).Result()
	d, _ := la.Allow(ctx, b.group, member(), lim)
	after, _ := b.client.Time(ctx).Result()
	if d.Now.Before(before.Truncate(time.Millisecond)) || d.Now.After(after) {
		t.Fatalf("decision time %v outside Redis TIME [%v, %v]", d.Now, before, after)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	good := recipient(throttle.PerMinute(1))
	many := make([]throttle.Limit, throttle.MaxRules+1)
	for i := range many {
		many[i] = good
	}
	cases := []struct {
		name   string
		group  string
		member string
		limits []throttle.Limit
		want   error
	}{
		{"ZeroLimit", b.group, "m", []throttle.Limit{recipient(throttle.Rule{Limit: 0, Window: time.Minute})}, throttle.ErrInvalidRule},
		{"NegativeLimit", b.group, "m", []throttle.Limit{recipient(throttle.Rule{Limit: -1, Window: time.Minute})}, throttle.ErrInvalidRule},
		{"ZeroWindow", b.group, "m", []throttle.Limit{recipient(throttle.Rule{Limit: 1})}, throttle.ErrInvalidRule},
		{"NegativeWindow", b.group, "m", []throttle.Limit{recipient(throttle.Rule{Limit: 1, Window: -time.Second})}, throttle.ErrInvalidRule},
		{"HugeWindow", b.group, "m", []throttle.Limit{recipient(throttle.Rule{Limit: 1, Window: 10000 * time.Hour})}, throttle.ErrInvalidRule},
		{"SubMillisecondWindow", b.group, "m", []throttle.Limit{recipient(throttle.Rule{Limit: 1, Window: 1500 * time.Microsecond})}, throttle.ErrInvalidRule},
		{"EmptyGroup", "", "m", []throttle.Limit{good}, throttle.ErrInvalidKey},
		{"EmptyMember", b.group, "", []throttle.Limit{good}, throttle.ErrInvalidKey},
		{"EmptyScope", b.group, "m", []throttle.Limit{{Rule: throttle.PerMinute(1)}}, throttle.ErrInvalidKey},
		{"ScopeWithBrace", b.group, "m", []throttle.Limit{{Scope: "sms}x", Rule: throttle.PerMinute(1)}}, throttle.ErrInvalidKey},
		{"NoRules", b.group, "m", nil, throttle.ErrTooManyRules},
		{"TooManyRules", b.group, "m", many, throttle.ErrTooManyRules},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := b.lim.Allow(ctx, tc.group, tc.member, tc.limits...)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := throttle.New(b.client, throttle.Options{Secret: []byte("short")}); !errors.Is(err, throttle.ErrNoSecret) {
		t.Fatalf("short secret: %v", err)
	}
	if keys := b.client.Keys(ctx, "*").Val(); len(keys) != 0 {
		t.Fatalf("bad input wrote keys: %v", keys)
	}
}

// Redis trouble is an error, never a decision.
func TestRedisDownIsAnError(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	b.server.Stop()
	d, err := b.lim.Allow(ctx, b.group, member(), recipient(throttle.PerMinute(1)))
	if err == nil || d.Allowed {
		t.Fatalf("Redis down: decision %+v, err %v; want an error and no admission", d, err)
	}
}
