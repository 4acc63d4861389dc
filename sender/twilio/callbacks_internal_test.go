package twilio

import (
	"net/url"
	"slices"
	"testing"
)

// The API's check computes Twilio's signature exactly: Twilio's published
// examples, with the token, URL and parameters they use.
func TestTwilioSignature(t *testing.T) {
	t.Parallel()
	const token, u = "12345", "https://mycompany.com/myapp.php?foo=1&bar=2"
	params := func(caller string) url.Values {
		return url.Values{"CallSid": {"CA1234567890ABCDE"}, "Caller": {caller}, "Digits": {"1234"}, "From": {caller}, "To": {"+18005551212"}}
	}
	for _, c := range []struct{ name, caller, want string }{
		{"Docs", "+12349013030", "0/KCTR6DLpKmkAf8muzZqo1nDgQ="},      // Twilio's webhook-security page
		{"Libraries", "+14158675309", "RSOYDt4T1cUTdK1PDd93/VVr8B8="}, // the tests of Twilio's libraries
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := params(c.caller)
			if got := twilioSignature(token, u, p); got != c.want {
				t.Fatalf("signature %q, want %q", got, c.want)
			}
			if !validSignature(token, u, p, c.want) {
				t.Fatal("the published signature does not validate")
			}
			p.Set("Digits", "1235")
			if validSignature(token, u, p, c.want) {
				t.Fatal("a changed parameter validates")
			}
			if validSignature("54321", u, params(c.caller), c.want) {
				t.Fatal("another token validates")
			}
			if validSignature(token, "https://mycompany.com/myapp.php?foo=1&bar=3", params(c.caller), c.want) {
				t.Fatal("another URL validates")
			}
		})
	}
	// A repeated name counts each distinct value once, sorted, as Twilio's libraries do.
	if a, b := twilioSignature(token, u, url.Values{"x": {"2", "1", "1"}}), twilioSignature(token, u, url.Values{"x": {"1", "2"}}); a != b {
		t.Fatalf("repeated values: %q != %q", a, b)
	}
}

// The URL is also taken with its scheme's default port added or removed,
// and with no other port.
func TestPortVariants(t *testing.T) {
	t.Parallel()
	for in, want := range map[string][]string{
		"https://x.example/v1/a?b=1":      {"https://x.example/v1/a?b=1", "https://x.example:443/v1/a?b=1"},
		"https://x.example:443/v1/a":      {"https://x.example:443/v1/a", "https://x.example/v1/a"},
		"http://x.example/v1/a":           {"http://x.example/v1/a", "http://x.example:80/v1/a"},
		"http://[::1]:80/v1/a":            {"http://[::1]:80/v1/a", "http://[::1]/v1/a"},
		"https://x.example:8443/v1/a":     {"https://x.example:8443/v1/a"},
		"http://127.0.0.1:43125/v1/a%2Fb": {"http://127.0.0.1:43125/v1/a%2Fb"},
	} {
		if got := portVariants(in); !slices.Equal(got, want) {
			t.Errorf("portVariants(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseStatusCallback(t *testing.T) {
	t.Parallel()
	cb, bad := parseStatusCallback(url.Values{"MessageStatus": {"undelivered"}, "ErrorCode": {"30007"}, "MessageSid": {"SM0123"},
		"To": {"+1 415 555 0100"}, "From": {"+15005550006"}, "AccountSid": {"AC1"}, "SmsStatus": {"undelivered"}})
	if len(bad) > 0 || cb.Status != "undelivered" || cb.ErrorCode != 30007 || cb.MessageSID != "SM0123" || cb.To != "+14155550100" {
		t.Fatalf("%+v %v", cb, bad)
	}
	if cb, bad := parseStatusCallback(url.Values{"MessageStatus": {"sent"}, "To": {"whatsapp:+14155550100"}}); len(bad) > 0 || cb.To != "" {
		t.Fatalf("a To that is no E.164 number: %+v %v", cb, bad)
	}
	for _, form := range []url.Values{
		{},
		{"MessageStatus": {""}},
		{"MessageStatus": {"received"}},
		{"MessageStatus": {"sent", "sent"}},
		{"MessageStatus": {"failed"}, "ErrorCode": {"x"}},
		{"MessageStatus": {"failed"}, "ErrorCode": {"+1"}},
		{"MessageStatus": {"failed"}, "ErrorCode": {"1234567"}},
		{"MessageStatus": {"failed"}, "MessageSid": {"SM 1"}},
	} {
		if _, bad := parseStatusCallback(form); len(bad) == 0 {
			t.Errorf("%v accepted", form)
		}
	}
}
