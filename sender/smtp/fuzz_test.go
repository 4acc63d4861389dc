package smtp_test

import (
	"bytes"
	"mime"
	netmail "net/mail"
	"net/textproto"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/sender/smtp"
	"github.com/sluicehq/sluice/tasks"
)

// FuzzEmailHeader: any custom header tasks accepts is rendered by go-mail
// so that a parser reads it back as one field with the same text (RFC 2047
// decoded; folding may change runs of whitespace), and the fields Sluice
// sets are neither doubled nor displaced.
func FuzzEmailHeader(f *testing.F) {
	for _, s := range [][2]string{
		{"X-Note", "Grüße aus Köln — a header value long enough to be folded over several encoded words"},
		{"X-Campaign", "receipts"}, {"X-Tab", "a\tb"}, {"X-Spaces", "a   b  "}, {"user-agent", "Acme"}, {"X-MAILER", "m"},
		{"X-Long", strings.Repeat("x", tasks.MaxHeaderValueLen)}, {"X-Words", strings.Repeat("wörd ", 150)},
		{"X-Emoji", "📦 shipped"}, {"X-Enc", "=?utf-8?q?x?="}, {"X-A", "v\r\nBcc: victim@example.com"},
	} {
		f.Add(s[0], s[1])
	}
	s, err := smtp.NewSender(smtp.Config{Host: "localhost", Port: 25, TLS: "none", From: "notify@acme.example"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name, value string) {
		n := tasks.NewEmail("acme", "ann@example.com", "Hi", "Body")
		n.Headers = map[string]string{name: value}
		if n.Validate() != nil {
			return
		}
		m, err := s.Message(n)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if _, err := m.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		msg, err := netmail.ReadMessage(&buf)
		if err != nil {
			t.Fatalf("header %q: %q renders a message that does not parse: %v", name, value, err)
		}
		vals := msg.Header[textproto.CanonicalMIMEHeaderKey(name)]
		if len(vals) != 1 {
			t.Fatalf("header %q: %q appears %d times: %q", name, value, len(vals), vals)
		}
		// An ASCII value that looks like an encoded word is sent as it is,
		// and a reader decodes it (or fails to): nothing to compare.
		if !strings.Contains(value, "=?") {
			got, err := new(mime.WordDecoder).DecodeHeader(vals[0])
			if err != nil {
				t.Fatalf("header %q: %q sent as %q, which does not decode: %v", name, value, vals[0], err)
			}
			if strings.Join(strings.Fields(got), " ") != strings.Join(strings.Fields(value), " ") {
				t.Fatalf("header %q: %q sent as %q, reads back as %q", name, value, vals[0], got)
			}
		}
		for field, want := range map[string]string{"From": "<notify@acme.example>", "To": "<ann@example.com>", "Subject": "Hi",
			"Message-Id": "<" + n.ID + "@acme.example>", "X-Sluice-Tenant": "acme", "Mime-Version": "1.0"} {
			if v := msg.Header[field]; len(v) != 1 || v[0] != want {
				t.Fatalf("header %q: %q: %s is %q, want [%q]", name, value, field, v, want)
			}
		}
		for _, field := range []string{"Bcc", "Cc", "Reply-To", "Sender"} {
			if v := msg.Header[field]; len(v) != 0 {
				t.Fatalf("header %q: %q: injected %s %q", name, value, field, v)
			}
		}
	})
}
