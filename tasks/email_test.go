package tasks_test

import (
	"bufio"
	"errors"
	"maps"
	"net/textproto"
	"net/url"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/tasks"
)

// richEmail is an email using every email-only field.
func richEmail() tasks.Notification {
	n := tasks.NewEmail("acme", "ann@example.com", "Your receipt", "Thanks for your order.")
	n.HTML = "<p>Thanks for your <b>order</b> &amp; welcome.</p>"
	n.ReplyTo = "support@acme.example"
	n.Headers = map[string]string{"X-Campaign": "receipts", "X-Note": "Grüße aus Köln", "Precedence": "bulk"}
	n.ListUnsubscribe = "https://acme.example/u/8f2c?l=1, mailto:unsub@acme.example?subject=8f2c"
	return n
}

func TestValidateEmailFields(t *testing.T) {
	t.Parallel()
	with := func(f func(*tasks.Notification)) tasks.Notification {
		n := richEmail()
		n.Headers = maps.Clone(n.Headers)
		f(&n)
		return n
	}
	sms := func(f func(*tasks.Notification)) tasks.Notification {
		n := tasks.NewSMS("acme", "+14155550100", "code 123456")
		f(&n)
		return n
	}
	header := func(name, value string) func(*tasks.Notification) {
		return func(n *tasks.Notification) { n.Headers = map[string]string{name: value} }
	}
	sixteen, seventeen := map[string]string{}, map[string]string{}
	for i := range tasks.MaxHeaders + 1 {
		if i < tasks.MaxHeaders {
			sixteen["X-H"+string(rune('a'+i))] = "v"
		}
		seventeen["X-H"+string(rune('a'+i))] = "v"
	}
	cases := []struct {
		name string
		n    tasks.Notification
		want string // "" = valid
	}{
		{"Rich", richEmail(), ""},
		{"HTTPSOnly", with(func(n *tasks.Notification) { n.ListUnsubscribe = "https://acme.example/u/1" }), ""},
		{"MailtoOnly", with(func(n *tasks.Notification) { n.ListUnsubscribe = "mailto:unsub@acme.example" }), ""},
		{"MailtoFirst", with(func(n *tasks.Notification) { n.ListUnsubscribe = "mailto:u@acme.example,https://acme.example/u" }), ""},
		{"HeaderWithTab", with(header("X-Tabbed", "a\tb")), ""},
		{"MaxHeaders", with(func(n *tasks.Notification) { n.Headers = sixteen }), ""},
		{"HeaderNameTokenChars", with(header("X-A.b_c!#$%&'*+^`|~", "v")), ""},
		{"BodyAndHTMLAtLimit", with(func(n *tasks.Notification) {
			n.Body = strings.Repeat("t", tasks.MaxEmailBodyBytes/2)
			n.HTML = strings.Repeat("h", tasks.MaxEmailBodyBytes/2)
			n.Headers = nil
		}), ""},

		// HTML
		{"HTMLWithoutText", with(func(n *tasks.Notification) { n.Body = "" }), "body is empty"},
		{"HTMLBlank", with(func(n *tasks.Notification) { n.HTML = " \n " }), "html is blank"},
		{"HTMLBadUTF8", with(func(n *tasks.Notification) { n.HTML = "<p>\xff</p>" }), "html is not valid UTF-8"},
		{"BodyAndHTMLOverLimit", with(func(n *tasks.Notification) {
			n.Body = strings.Repeat("t", tasks.MaxEmailBodyBytes/2)
			n.HTML = strings.Repeat("h", tasks.MaxEmailBodyBytes/2+1)
		}), "byte limit"},
		// Reply-To
		{"ReplyToWithName", with(func(n *tasks.Notification) { n.ReplyTo = "Support <support@acme.example>" }), "reply_to"},
		{"ReplyToTwo", with(func(n *tasks.Notification) { n.ReplyTo = "a@acme.example, b@acme.example" }), "reply_to"},
		{"ReplyToCRLF", with(func(n *tasks.Notification) { n.ReplyTo = "a@acme.example\r\nBcc: x@y.com" }), "header injection"},
		{"ReplyToNoDomainDot", with(func(n *tasks.Notification) { n.ReplyTo = "a@localhost" }), "reply_to"},
		// Headers
		{"HeaderCRLF", with(header("X-A", "v\r\nBcc: victim@example.com")), "header injection"},
		{"HeaderLF", with(header("X-A", "v\nx")), "header injection"},
		{"HeaderNUL", with(header("X-A", "v\x00")), "header injection"},
		{"HeaderDEL", with(header("X-A", "v\x7f")), "header injection"},
		{"HeaderLineSeparator", with(header("X-A", "v\u2028x")), "header injection"},
		{"HeaderEmptyValue", with(header("X-A", " ")), "value is empty"},
		{"HeaderValueTooLong", with(header("X-A", strings.Repeat("v", tasks.MaxHeaderValueLen+1))), "over"},
		{"HeaderBadUTF8", with(header("X-A", "\xff")), "UTF-8"},
		{"HeaderNameColon", with(header("X-A:B", "v")), "field name"},
		{"HeaderNameSpace", with(header("X A", "v")), "field name"},
		{"HeaderNameNonASCII", with(header("X-Ä", "v")), "field name"},
		{"HeaderNameCRLF", with(header("X-A\r\nBcc", "v")), "field name"},
		{"HeaderNameParen", with(header("X-(A)", "v")), "field name"},
		{"HeaderNameEmpty", with(header("", "v")), "name must be"},
		{"HeaderNameTooLong", with(header("X-"+strings.Repeat("a", tasks.MaxHeaderNameLen), "v")), "name must be"},
		{"HeaderFrom", with(header("From", "evil@example.com")), "cannot be set"},
		{"HeaderBccLowercase", with(header("bcc", "victim@example.com")), "cannot be set"},
		{"HeaderMessageID", with(header("Message-Id", "<x@y>")), "cannot be set"},
		{"HeaderContentDisposition", with(header("Content-Disposition", "attachment")), "cannot be set"},
		{"HeaderListUnsubscribePost", with(header("List-Unsubscribe-Post", "List-Unsubscribe=One-Click")), "cannot be set"},
		{"HeaderDKIM", with(header("DKIM-Signature", "v=1")), "cannot be set"},
		{"HeaderSluiceTenant", with(header("X-Sluice-Tenant", "other")), "cannot be set"},
		{"HeaderCaseDuplicate", with(func(n *tasks.Notification) { n.Headers = map[string]string{"X-A": "1", "x-a": "2"} }), "same header"},
		{"TooManyHeaders", with(func(n *tasks.Notification) { n.Headers = seventeen }), "entries, over"},
		// List-Unsubscribe
		{"UnsubHTTP", with(func(n *tasks.Notification) { n.ListUnsubscribe = "http://acme.example/u" }), "use https"},
		{"UnsubJavascript", with(func(n *tasks.Notification) { n.ListUnsubscribe = "javascript:alert(1)" }), "neither"},
		{"UnsubTwoHTTPS", with(func(n *tasks.Notification) { n.ListUnsubscribe = "https://a.example/u, https://b.example/u" }), "two https"},
		{"UnsubThree", with(func(n *tasks.Notification) {
			n.ListUnsubscribe = "https://a.example/u, mailto:u@a.example, mailto:v@a.example"
		}), "more than two"},
		{"UnsubAngleBrackets", with(func(n *tasks.Notification) { n.ListUnsubscribe = "<https://a.example/u>" }), "not allowed in a URI"},
		{"UnsubSpaceInURL", with(func(n *tasks.Notification) { n.ListUnsubscribe = "https://a.example/u x" }), "not allowed in a URI"},
		{"UnsubCRLF", with(func(n *tasks.Notification) { n.ListUnsubscribe = "https://a.example/u\r\nBcc: x@y.com" }), "not allowed in a URI"},
		{"UnsubNoHost", with(func(n *tasks.Notification) { n.ListUnsubscribe = "https:///u" }), "with a host"},
		{"UnsubUserInfo", with(func(n *tasks.Notification) { n.ListUnsubscribe = "https://user:pw@a.example/u" }), "no user info"},
		{"UnsubBadMailto", with(func(n *tasks.Notification) { n.ListUnsubscribe = "mailto:not-an-address" }), "list_unsubscribe"},
		{"UnsubEmptyMailto", with(func(n *tasks.Notification) { n.ListUnsubscribe = "mailto:?subject=x" }), "one address"},
		{"UnsubEmptyEntry", with(func(n *tasks.Notification) { n.ListUnsubscribe = "https://a.example/u," }), "empty URI"},
		{"UnsubTooLong", with(func(n *tasks.Notification) {
			n.ListUnsubscribe = "https://a.example/" + strings.Repeat("u", tasks.MaxListUnsubscribeLen)
		}), "over"},
		// Email-only fields on an SMS
		{"SMSWithHTML", sms(func(n *tasks.Notification) { n.HTML = "<p>x</p>" }), "html is not used for sms"},
		{"SMSWithReplyTo", sms(func(n *tasks.Notification) { n.ReplyTo = "a@example.com" }), "reply_to is not used for sms"},
		{"SMSWithHeaders", sms(func(n *tasks.Notification) { n.Headers = map[string]string{"X-A": "v"} }), "headers is not used for sms"},
		{"SMSWithUnsubscribe", sms(func(n *tasks.Notification) { n.ListUnsubscribe = "https://a.example/u" }), "list_unsubscribe is not used for sms"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.n.Normalized().Validate()
			if c.want == "" {
				if err != nil {
					t.Fatalf("valid notification rejected: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, c.want)
			}
			if !errors.Is(err, tasks.ErrInvalid) {
				t.Fatalf("err %v does not wrap ErrInvalid", err)
			}
		})
	}
}

// Every header field the issue names is refused, in any case, and ordinary
// ones are not.
func TestReservedHeader(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"From", "To", "Cc", "Bcc", "Subject", "Message-ID", "Date", "Reply-To",
		"MIME-Version", "Content-Type", "Content-Transfer-Encoding", "List-Unsubscribe", "List-Unsubscribe-Post",
		"DKIM-Signature", "Return-Path", "Received", "Sender"} {
		for _, spelt := range []string{name, strings.ToLower(name), strings.ToUpper(name)} {
			if !tasks.ReservedHeader(spelt) {
				t.Errorf("ReservedHeader(%q) = false", spelt)
			}
		}
	}
	for _, name := range []string{"X-Campaign", "List-Id", "Precedence", "Auto-Submitted", "In-Reply-To", "References", "X-Entity-Ref-ID", "Fromage"} {
		if tasks.ReservedHeader(name) {
			t.Errorf("ReservedHeader(%q) = true", name)
		}
	}
}

func TestParseListUnsubscribe(t *testing.T) {
	t.Parallel()
	u, err := tasks.ParseListUnsubscribe(" mailto:unsub@acme.example?subject=8f2c ,https://acme.example/u/8f2c ")
	if err != nil {
		t.Fatal(err)
	}
	if u.HTTPS != "https://acme.example/u/8f2c" || u.Mailto != "mailto:unsub@acme.example?subject=8f2c" || !u.OneClick() {
		t.Fatalf("parsed %+v", u)
	}
	if got := strings.Join(u.URIs(), " "); got != "https://acme.example/u/8f2c mailto:unsub@acme.example?subject=8f2c" {
		t.Fatalf("URIs = %q, want https first", got)
	}
	m, err := tasks.ParseListUnsubscribe("mailto:unsub@acme.example")
	if err != nil || m.OneClick() || len(m.URIs()) != 1 {
		t.Fatalf("mailto only: %+v, %v", m, err)
	}
}

// The email-only fields survive Encode and Decode unchanged, and an HTML
// body is not inflated by JSON's HTML escaping.
func TestEmailRoundTrip(t *testing.T) {
	t.Parallel()
	n := richEmail().Normalized()
	b, err := n.Encode()
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"html":`, `"reply_to":`, `"headers":`, `"list_unsubscribe":`} {
		if !strings.Contains(string(b), key) {
			t.Errorf("payload lacks %s: %s", key, b)
		}
	}
	if !strings.Contains(string(b), "<p>Thanks") {
		t.Errorf("HTML was escaped in the payload: %s", b)
	}
	got, err := tasks.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.HTML != n.HTML || got.ReplyTo != n.ReplyTo || got.ListUnsubscribe != n.ListUnsubscribe || !maps.Equal(got.Headers, n.Headers) {
		t.Fatalf("round trip changed the email fields:\n got %+v\nwant %+v", got, n)
	}
	// A text-only email encodes without the new keys: old workers read it.
	plain, _ := tasks.NewEmail("acme", "a@example.com", "S", "b").Encode()
	for _, key := range []string{"html", "reply_to", "headers", "list_unsubscribe"} {
		if strings.Contains(string(plain), key) {
			t.Errorf("text-only payload carries %q: %s", key, plain)
		}
	}
}

// Bodies within MaxEmailBodyBytes whose JSON escaping pushes the payload over
// MaxPayloadBytes are refused by Encode, as Decode would refuse them.
func TestEncodeRefusesOversizePayload(t *testing.T) {
	t.Parallel()
	n := tasks.NewEmail("acme", "a@example.com", "S", strings.Repeat("\"", tasks.MaxEmailBodyBytes/2))
	n.HTML = strings.Repeat("\"", tasks.MaxEmailBodyBytes/2) // valid, but each byte encodes as two
	if err := n.Validate(); err != nil {
		t.Fatalf("bodies within the limit rejected: %v", err)
	}
	_, err := n.Encode()
	if !errors.Is(err, tasks.ErrInvalid) || !strings.Contains(err.Error(), "payload encodes to") {
		t.Fatalf("Encode = %v, want the payload refused", err)
	}
	// Markup is not escaped, so an HTML body at the limit fits.
	n.Body = "text"
	n.HTML = strings.Repeat("<a>", (tasks.MaxEmailBodyBytes-4)/3)
	if _, err := n.Encode(); err != nil {
		t.Fatalf("HTML at the limit: %v", err)
	}
}

// FuzzHeaders: a custom header that validates cannot inject a field or
// override a reserved one: written as "Name: value" it parses back as
// exactly that one field with that value.
func FuzzHeaders(f *testing.F) {
	for _, s := range [][2]string{
		{"X-Campaign", "receipts"}, {"X-A", "v\r\nBcc: x@example.com"}, {"bcc", "x@example.com"},
		{"X-A:B", "v"}, {"X-Note", "Grüße"}, {"X-A", "a\tb"}, {"X-A", "\u2028"}, {"Content-ID", "<x>"},
		{"X-A", "v\x00"}, {"X A", "v"}, {"x-sluice-tenant", "t"}, {"X-A", " "},
	} {
		f.Add(s[0], s[1])
	}
	reserved := []string{"from", "to", "cc", "bcc", "subject", "message-id", "date", "reply-to", "mime-version",
		"content-type", "content-transfer-encoding", "list-unsubscribe", "list-unsubscribe-post",
		"dkim-signature", "return-path", "received", "sender", "x-sluice-tenant"}
	f.Fuzz(func(t *testing.T, name, value string) {
		n := tasks.NewEmail("acme", "a@example.com", "S", "b")
		n.Headers = map[string]string{name: value}
		err := n.Validate()
		if err != nil {
			if !errors.Is(err, tasks.ErrInvalid) || !strings.Contains(err.Error(), "headers") {
				t.Fatalf("error %v does not wrap ErrInvalid naming headers", err)
			}
			return
		}
		for _, r := range reserved {
			if strings.EqualFold(name, r) {
				t.Fatalf("reserved header %q accepted", name)
			}
		}
		if strings.ContainsAny(name+value, "\r\n\x00") || strings.ContainsAny(name, ": ") {
			t.Fatalf("header %q: %q accepted", name, value)
		}
		r := textproto.NewReader(bufio.NewReader(strings.NewReader(name + ": " + value + "\r\n\r\n")))
		h, perr := r.ReadMIMEHeader()
		if perr != nil {
			t.Fatalf("accepted header %q: %q does not parse: %v", name, value, perr)
		}
		if len(h) != 1 || len(h.Values(name)) != 1 {
			t.Fatalf("accepted header %q: %q parses as %d fields: %v", name, value, len(h), h)
		}
		if got := h.Get(name); got != strings.Trim(value, " \t") {
			t.Fatalf("accepted header %q: %q reads back as %q", name, value, got)
		}
	})
}

// FuzzListUnsubscribe: what parses is at most one https URL with a host and
// one mailto: URI, each free of what would break List-Unsubscribe's <…> list.
func FuzzListUnsubscribe(f *testing.F) {
	for _, s := range []string{"https://a.example/u", "mailto:u@a.example?subject=x", "https://a.example/u, mailto:u@a.example",
		"http://a.example", "<https://a.example>", "https://a.example/u\r\nBcc: x", "mailto:", "https://", ",", "https://a@b.example"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := tasks.ParseListUnsubscribe(s)
		if err != nil {
			if !errors.Is(err, tasks.ErrInvalid) || !strings.Contains(err.Error(), "list_unsubscribe") {
				t.Fatalf("error %v does not wrap ErrInvalid naming list_unsubscribe", err)
			}
			return
		}
		if len(u.URIs()) == 0 || len(u.URIs()) > 2 {
			t.Fatalf("%q parsed to %d URIs", s, len(u.URIs()))
		}
		for _, uri := range u.URIs() {
			if strings.ContainsAny(uri, "<>, \t\r\n\x00\"") {
				t.Fatalf("%q: URI %q would break the header", s, uri)
			}
		}
		if u.HTTPS != "" {
			p, err := url.Parse(u.HTTPS)
			if err != nil || p.Scheme != "https" || p.Hostname() == "" || p.User != nil {
				t.Fatalf("%q: https URL %q is not one (%v)", s, u.HTTPS, err)
			}
		}
		if u.Mailto != "" && !strings.HasPrefix(strings.ToLower(u.Mailto), "mailto:") {
			t.Fatalf("%q: mailto %q", s, u.Mailto)
		}
	})
}
