package tasks_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/tasks"
)

// FuzzReadTaskError: any text reads as some reason, and a rule it names is
// in the text.
func FuzzReadTaskError(f *testing.F) {
	for _, s := range []string{"throttled by sms:recipient 1/1m until 2026-01-02T03:04:05.678Z", "throttled by quiet hours until 2026-01-02T03:04:05Z",
		"expired: the earliest slot", "quota check unavailable, nothing sent: EOF", "throttled by x until y", "smtp 451",
		tasks.DeferredPrefix + "throttled by sms:tenant 1000/1h until 2026-01-02T03:04:05Z", tasks.DeferredPrefix} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, waiting := range []bool{true, false} {
			le := tasks.ReadTaskError(s, waiting)
			if le.Reason == "" {
				t.Fatalf("%q: no reason", s)
			}
			if le.Rule != "" && !strings.Contains(s, le.Rule) {
				t.Fatalf("%q: rule %q is not in the message", s, le.Rule)
			}
		}
	})
}
