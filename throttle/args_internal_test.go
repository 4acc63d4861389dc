package throttle

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// counterArgsLen must give exactly what counters writes: the operations
// size their arguments by it, and a short count costs every check a second
// allocation of them (a bucketed check grew its arguments twice, about 1 KB).
func TestCounterArgsLen(t *testing.T) {
	from := time.Date(2026, 3, 8, 1, 0, 0, 0, time.UTC)
	rules := []Rule{
		{Limit: 5, Window: time.Minute},
		{Limit: 1000, Window: time.Second, Buckets: 60},
		PerCalendar(10, Minute, "UTC"),
		PerCalendar(10, Hour, "Europe/London"),
		PerCalendar(2000, Day, "America/Los_Angeles"),
		PerCalendar(50, Week, "America/New_York"),
		PerCalendar(900, Month, "UTC"),
	}
	// Every subset of the rules, in order: none, one, several, all.
	for mask := 0; mask < 1<<len(rules); mask++ {
		var limits []Limit
		for i, r := range rules {
			if mask&(1<<i) != 0 {
				limits = append(limits, Limit{Scope: "sms:sender", Subject: "s", Rule: r})
			}
		}
		e := newEnc(opUsage, 0, 0)
		counters(&e, limits, func() time.Time { return from })
		if got, want := len(e.op.args), counterArgsLen(limits); got != want {
			t.Fatalf("limits %v: counters wrote %d values, counterArgsLen says %d", limits, got, want)
		}
	}
}

// The key names are a stored contract: workers of two versions side by side,
// and an upgrade, must find the same windows. Each kind's part, pinned.
func TestKeyNamesByRuleKind(t *testing.T) {
	l, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), Options{Secret: []byte("0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, c := range []struct {
		rule Rule
		want string
	}{
		{Rule{Limit: 1, Window: time.Minute}, "sl1:{g}:sms:recipient:60000"},
		{Rule{Limit: 1000, Window: time.Second, Buckets: 60}, "sl1:{g}:sms:recipient:1000~60"},
		{Rule{Limit: 10_000, Window: time.Hour, Buckets: 120}, "sl1:{g}:sms:recipient:3600000~120"},
		{PerCalendar(2000, Day, "America/Los_Angeles"), "sl1:{g}:sms:recipient:d@America/Los_Angeles"},
		{PerCalendar(10, Minute, ""), "sl1:{g}:sms:recipient:m@UTC"},
	} {
		got, err := l.Key("g", Limit{Scope: "sms:recipient", Rule: c.rule})
		if err != nil {
			t.Fatalf("%v: %v", c.rule, err)
		}
		if got != c.want {
			t.Errorf("%v: key %q, want %q", c.rule, got, c.want)
		}
		if c.rule.keyPart() != c.want[len("sl1:{g}:sms:recipient:"):] {
			t.Errorf("%v: keyPart %q does not match its key %q", c.rule, c.rule.keyPart(), got)
		}
	}
}
