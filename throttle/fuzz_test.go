package throttle_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/throttle"
)

func FuzzParseRule(f *testing.F) {
	for _, s := range []string{"10/1m", "5/1d", "1/m", "100/1h30m", "3/1500ms", "0/1m", "-1/1m", "1/0s",
		"10", "/", "1/", "x/1m", "1/1y", "9999999999999999999/1s", "1/401d", " 2 / 10s ",
		"2000/1d@America/Los_Angeles", "5/1w", "3/1mo@Europe/London", "1/1h@UTC", "1/2d@UTC", "1/1d@Local", "1/1d@Nowhere/Else",
		"10000/1h~60", "10/1s~", "10/1s~1", "10/3ms~5", "1/1d@UTC~5", "1/1m~x",
		"250/24h@distinct", "250/1d@distinct", "1/1m~60@distinct", "1/1d@UTC@distinct", "@distinct", "0/1m@distinct"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := throttle.ParseRule(s)
		if err != nil {
			if !errors.Is(err, throttle.ErrInvalidRule) {
				t.Fatalf("ParseRule(%q): error %v does not wrap ErrInvalidRule", s, err)
			}
			return
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("ParseRule(%q) = %v, which does not validate: %v", s, r, err)
		}
		back, err := throttle.ParseRule(r.String())
		if err != nil || back != r {
			t.Fatalf("round trip %q → %v → %q → %v, %v", s, r, r.String(), back, err)
		}
	})
}

func FuzzKey(f *testing.F) {
	f.Add("acme", "sms:recipient", "+14155550100", "acme2", "+14155550100")
	f.Add("a}b", "email:tenant", "", "a", "}b")
	f.Add("{x}", "sms:recipient", "x", "%7Bx%7D", "x")
	f.Add("a b:c", "sms:recipient", "", "a%20b%3Ac", "")
	// No client calls are made: Key is pure.
	l, err := throttle.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), throttle.Options{Secret: testSecret})
	if err != nil {
		f.Fatal(err)
	}
	rule := throttle.Rule{Limit: 1, Window: time.Minute}
	f.Fuzz(func(t *testing.T, g1, scope, s1, g2, s2 string) {
		k1, err1 := l.Key(g1, throttle.Limit{Scope: scope, Subject: s1, Rule: rule})
		if err1 != nil {
			if !errors.Is(err1, throttle.ErrInvalidKey) {
				t.Fatalf("error %v does not wrap ErrInvalidKey", err1)
			}
			return
		}
		// Exactly one hash tag, and it is the (escaped) group: no '{' or '}' inside.
		open, close := strings.IndexByte(k1, '{'), strings.IndexByte(k1, '}')
		if open < 0 || close < open || strings.Count(k1, "{") != 1 || strings.Count(k1, "}") != 1 {
			t.Fatalf("key %q: hash tag broken", k1)
		}
		if s1 != "" && len(s1) > 3 && strings.Contains(k1, s1) {
			t.Fatalf("key %q holds the subject %q in clear", k1, s1)
		}
		k2, err2 := l.Key(g2, throttle.Limit{Scope: scope, Subject: s2, Rule: rule})
		if err2 == nil && k1 == k2 && (g1 != g2 || s1 != s2) {
			t.Fatalf("collision: (%q,%q) and (%q,%q) → %q", g1, s1, g2, s2, k1)
		}
	})
}
