package smtp_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/sender/smtp"
)

// FoldListUnsubscribe folds between URIs, never inside one, and keeps
// every line within 78 characters wherever the URIs allow.
func TestFoldListUnsubscribe(t *testing.T) {
	t.Parallel()
	long := "https://acme.example/unsubscribe/" + strings.Repeat("a", 60)
	for _, c := range []struct {
		uris []string
		want string
	}{
		{[]string{"https://a.example/u"}, "<https://a.example/u>"},
		{[]string{"https://a.example/u", "mailto:u@a.example"}, "<https://a.example/u>, <mailto:u@a.example>"},
		{[]string{long, "mailto:u@a.example?subject=x"}, "<" + long + ">,\r\n <mailto:u@a.example?subject=x>"},
		{[]string{"https://a.example/" + strings.Repeat("p", 39), "mailto:" + strings.Repeat("m", 30) + "@a.example"},
			"<https://a.example/" + strings.Repeat("p", 39) + ">,\r\n <mailto:" + strings.Repeat("m", 30) + "@a.example>"},
		{[]string{"https://a.example/" + strings.Repeat("p", 9), "mailto:" + strings.Repeat("m", 9) + "@a.example"},
			"<https://a.example/" + strings.Repeat("p", 9) + ">, <mailto:" + strings.Repeat("m", 9) + "@a.example>"},
	} {
		got := smtp.FoldListUnsubscribe(c.uris)
		if got != c.want {
			t.Errorf("FoldListUnsubscribe(%q) = %q, want %q", c.uris, got, c.want)
		}
		for i, l := range strings.Split("List-Unsubscribe: "+got, "\r\n") {
			fits := !strings.Contains(l, long) // a URI longer than a line cannot fit
			if fits && len(l) > smtp.MaxHeaderLine {
				t.Errorf("line %d is %d characters: %q", i+1, len(l), l)
			}
		}
	}
}
