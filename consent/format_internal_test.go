package consent

import (
	"strconv"
	"testing"
)

// The ledger's and the hash's formats read only what they write: a stored
// value either is refused or prints back byte for byte.
func FuzzDecodeEvent(f *testing.F) {
	for _, s := range []string{
		"1767225600000|out|keyword|*|0|0|SM0123456789abcdef0123456789abcdef|STOP",
		"1767225600000|in|api|news,otp|0|0|req-1|",
		"1767225600000|undeliverable|provider|*|21610|1769817600000|delivery-migration|",
		"1767225600000|review|keyword|*|0|0||DONT TEXT",
		"0|out|cli|*|0|0||", "1|out|cli|b,a|0|0||", "01|out|cli|*|0|0||", "1|out|cli|*|0|0|a|b|c", "||||||||",
		"0:1767225600000:keyword:0", "1769817600000:1767225600000:provider:21610", "0:0:fax:0", "x:1:api:0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if e, err := decodeEvent(s); err == nil {
			if got := e.encode(); got != s {
				t.Fatalf("decodeEvent(%q) = %+v, which encodes as %q", s, e, got)
			}
		}
		if m, err := parseMark(s); err == nil {
			back := formatMark(m)
			if back != s {
				t.Fatalf("parseMark(%q) = %+v, which formats as %q", s, m, back)
			}
		}
	})
}

// formatMark writes a mark as record.lua does.
func formatMark(m Mark) string {
	return strconv.FormatInt(untilMS(m.Until), 10) + ":" + strconv.FormatInt(m.At.UnixMilli(), 10) + ":" +
		string(m.Source) + ":" + strconv.Itoa(m.Code)
}
