package throttle_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/throttle"
)

// Any text reads as a record or an error, never a panic; what reads names
// its kind by its first letter, a non-negative attempt and a time after 1970.
func FuzzParseRecord(f *testing.F) {
	for _, s := range []string{"b1:1767225600000:nonce", "a2:1767225600000:", "d1:1767225600000", "a0:0", "x1:2", "b:1", "b1:-5", "b99999999999:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := throttle.ParseRecord(s)
		if err != nil {
			return
		}
		if byte(r.Kind) != s[0] || r.Attempt < 0 || (!r.At.IsZero() && r.At.Before(time.Unix(0, 0))) {
			t.Fatalf("%q → %+v", s, r)
		}
	})
}
