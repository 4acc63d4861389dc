package fakes_test

import (
	"net/url"
	"testing"

	"github.com/sluicehq/sluice/testkit/fakes"
)

// The fake signs status callbacks as Twilio does: Twilio's published
// examples, with the token, URL and parameters they use.
func TestSignMatchesTwilio(t *testing.T) {
	t.Parallel()
	const token, u = "12345", "https://mycompany.com/myapp.php?foo=1&bar=2"
	params := func(caller string) url.Values {
		return url.Values{"CallSid": {"CA1234567890ABCDE"}, "Caller": {caller}, "Digits": {"1234"}, "From": {caller}, "To": {"+18005551212"}}
	}
	for _, c := range []struct{ name, caller, want string }{
		// Twilio's webhook-security documentation.
		{"Docs", "+12349013030", "0/KCTR6DLpKmkAf8muzZqo1nDgQ="},
		// The request-validator tests of Twilio's own libraries.
		{"Libraries", "+14158675309", "RSOYDt4T1cUTdK1PDd93/VVr8B8="},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := fakes.Sign(token, u, params(c.caller)); got != c.want {
				t.Fatalf("Sign = %q, want %q", got, c.want)
			}
		})
	}
	// A repeated name counts each distinct value once, sorted.
	if a, b := fakes.Sign(token, u, url.Values{"x": {"2", "1", "1"}}), fakes.Sign(token, u, url.Values{"x": {"1", "2"}}); a != b {
		t.Fatalf("repeated values: %q != %q", a, b)
	}
}
