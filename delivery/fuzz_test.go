package delivery

import (
	"strconv"
	"testing"
)

// A stored record that parses is exactly what Update writes for it.
func FuzzParseRecord(f *testing.F) {
	for _, s := range []string{"5:1712345678901:delivered:0:SM0123", "5:1:undelivered:30007:", "4:0:sent:0:SMx", "", ":::", "9:1:read:0:x", "6:1:read:0:x", "5:-1:failed:1:a", "5:1:failed:1:a:b", "05:1:failed:1:a"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := parseRecord(s)
		if err != nil {
			return
		}
		if r.check() != nil {
			t.Fatalf("%q parsed to an invalid record %+v", s, r)
		}
		again := strconv.Itoa(ranks[r.Status]) + ":" + strconv.FormatInt(r.At.UnixMilli(), 10) + ":" + string(r.Status) + ":" + strconv.Itoa(r.ErrorCode) + ":" + r.MessageSID
		if again != s {
			t.Fatalf("%q parsed to %+v, which is written as %q", s, r, again)
		}
	})
}
