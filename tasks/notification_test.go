package tasks_test

import (
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/tasks"
)

// mgSID is a well-formed Messaging Service SID.
const mgSID = "MG0123456789abcdef0123456789abcdef"

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := func(n tasks.Notification) tasks.Notification { return n }
	email := tasks.NewEmail("acme", "ann@example.com", "Hello", "Hi Ann")
	sms := tasks.NewSMS("acme", "+14155550100", "Your code is 123456")
	cases := []struct {
		name string
		n    tasks.Notification
		want string // "" = valid
	}{
		{"Email", email, ""},
		{"SMS", sms, ""},
		{"SMSWithSeparators", ok(tasks.NewSMS("acme", "+1 (415) 555-0100", "x")), ""},
		{"EmailDisplayNameNormalised", ok(tasks.NewEmail("acme", "Ann <Ann@Example.COM>", "S", "b")), ""},
		{"EmptyID", func() tasks.Notification { n := sms; n.ID = ""; return n }(), "id"},
		{"IDWithColon", func() tasks.Notification { n := sms; n.ID = "a:b"; return n }(), "id"},
		{"TenantWithBrace", func() tasks.Notification { n := sms; n.Tenant = "a{b}"; return n }(), "tenant"},
		{"TenantWithSpace", func() tasks.Notification { n := sms; n.Tenant = "a b"; return n }(), "tenant"},
		{"TenantWithColon", func() tasks.Notification { n := sms; n.Tenant = "a:b"; return n }(), "tenant"},
		{"UnknownChannel", func() tasks.Notification { n := sms; n.Channel = "fax"; return n }(), "unknown channel"},
		{"NotE164", tasks.NewSMS("acme", "4155550100", "x"), "E.164"},
		{"E164TooLong", tasks.NewSMS("acme", "+1234567890123456", "x"), "E.164"},
		{"E164LeadingZero", tasks.NewSMS("acme", "+0415555010", "x"), "E.164"},
		{"BadEmail", tasks.NewEmail("acme", "ann@", "S", "b"), "RFC 5322"},
		{"EmailNoDot", tasks.NewEmail("acme", "ann@localhost", "S", "b"), "RFC 5322"},
		{"TwoAddresses", tasks.NewEmail("acme", "a@example.com, b@example.com", "S", "b"), "RFC 5322"},
		{"SubjectCRLF", tasks.NewEmail("acme", "a@example.com", "Hi\r\nBcc: x@example.com", "b"), "header injection"},
		{"SubjectLF", tasks.NewEmail("acme", "a@example.com", "Hi\nBcc: x@example.com", "b"), "header injection"},
		{"FromCRLF", func() tasks.Notification { n := email; n.From = "a@example.com\r\nBcc: x@y.com"; return n }(), "header injection"},
		{"EmptySubject", tasks.NewEmail("acme", "a@example.com", " ", "b"), "subject"},
		{"EmptyBody", tasks.NewSMS("acme", "+14155550100", " "), "body"},
		{"InvalidUTF8", tasks.NewSMS("acme", "+14155550100", "bad \xff"), "UTF-8"},
		{"SMSTooLong", tasks.NewSMS("acme", "+14155550100", strings.Repeat("é", tasks.MaxSMSRunes+1)), "SMS limit"},
		{"EmailTooBig", tasks.NewEmail("acme", "a@example.com", "S", strings.Repeat("x", tasks.MaxEmailBodyBytes+1)), "byte limit"},
		{"SMSWithSubject", func() tasks.Notification { n := sms; n.Subject = "x"; return n }(), "not used for sms"},
		{"MessagingService", func() tasks.Notification { n := sms; n.MessagingServiceSID = mgSID; return n }(), ""},
		{"MessagingServiceUpperHex", func() tasks.Notification {
			n := sms
			n.MessagingServiceSID = "MG" + strings.ToUpper(mgSID[2:])
			return n
		}(), ""},
		{"MessagingServiceShort", func() tasks.Notification { n := sms; n.MessagingServiceSID = mgSID[:33]; return n }(), "messaging_service_sid must be MG"},
		{"MessagingServiceNotHex", func() tasks.Notification { n := sms; n.MessagingServiceSID = "MG" + strings.Repeat("g", 32); return n }(), "messaging_service_sid must be MG"},
		{"MessagingServiceOtherPrefix", func() tasks.Notification { n := sms; n.MessagingServiceSID = "PN" + mgSID[2:]; return n }(), "messaging_service_sid must be MG"},
		{"MessagingServiceWithFrom", func() tasks.Notification { n := sms; n.MessagingServiceSID = mgSID; n.From = "+15005550006"; return n }(), "cannot be combined with from"},
		{"MessagingServiceOnEmail", func() tasks.Notification { n := email; n.MessagingServiceSID = mgSID; return n }(), "sms only"},
		{"User", func() tasks.Notification { n := sms; n.User = "user:8812@crm"; return n }(), ""},
		{"UserMaxLen", func() tasks.Notification { n := email; n.User = strings.Repeat("u", tasks.MaxUserLen); return n }(), ""},
		{"UserTooLong", func() tasks.Notification { n := email; n.User = strings.Repeat("u", tasks.MaxUserLen+1); return n }(), "user is 129 bytes"},
		{"UserSpace", func() tasks.Notification { n := sms; n.User = "jane doe"; return n }(), "user has ' '"},
		{"UserNotASCII", func() tasks.Notification { n := sms; n.User = "jän"; return n }(), "printable ASCII"},
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
			if !errors.Is(err, tasks.ErrInvalid) && !errors.Is(err, tasks.ErrUnknownChannel) {
				t.Fatalf("err %v wraps neither ErrInvalid nor ErrUnknownChannel", err)
			}
		})
	}
}

func TestNormalize(t *testing.T) {
	t.Parallel()
	if got := tasks.NormalizeEmail("Ann <Ann@Example.COM>"); got != "ann@example.com" {
		t.Fatalf("NormalizeEmail = %q", got)
	}
	if got := tasks.NormalizePhone("+1 (415) 555-0100"); got != "+14155550100" {
		t.Fatalf("NormalizePhone = %q", got)
	}
	// Two spellings of one recipient are one quota subject.
	a := tasks.NewSMS("acme", "+1 415 555 0100", "x").Normalized()
	b := tasks.NewSMS("acme", "+1-415-555-0100", "x").Normalized()
	if a.To != b.To {
		t.Fatalf("%q and %q differ", a.To, b.To)
	}
}

func TestNewTaskKeepsRetryBudget(t *testing.T) {
	t.Parallel()
	for _, want := range []int{0, 1, 8} {
		task, err := tasks.NewTask(tasks.NewSMS("acme", "+14155550100", "x"), nil, asynq.MaxRetry(want))
		if err != nil {
			t.Fatal(err)
		}
		if got := tasks.RetryBudget(task, -1); got != want {
			t.Fatalf("budget header %d, want %d", got, want)
		}
	}
	task, _ := tasks.NewTask(tasks.NewSMS("acme", "+14155550100", "x"), nil)
	if got := tasks.RetryBudget(task, -1); got != tasks.DefaultMaxRetry {
		t.Fatalf("default budget %d", got)
	}
	if _, err := tasks.NewTask(tasks.NewSMS("acme", "bad", "x"), nil); !errors.Is(err, tasks.ErrInvalid) {
		t.Fatalf("NewTask of an invalid notification: %v", err)
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	n := tasks.NewEmail("acme", "Ann <ANN@example.com>", "Hi", "Body")
	n.Metadata = map[string]string{"order": "42"}
	task, err := tasks.NewTask(n, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tasks.Decode(task.Payload())
	if err != nil {
		t.Fatal(err)
	}
	if got.To != "ann@example.com" || got.ID != n.ID || got.Metadata["order"] != "42" || task.Type() != tasks.TypeEmail {
		t.Fatalf("decoded %+v from %s", got, task.Payload())
	}
	for _, bad := range []string{``, `null`, `[]`, `{"id":"x"} {}`, `{"id":"x","extra":1}`} {
		if _, err := tasks.Decode([]byte(bad)); !errors.Is(err, tasks.ErrInvalid) {
			t.Errorf("Decode(%q) = %v, want ErrInvalid", bad, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"id":"a","tenant":"acme","channel":"sms","to":"+14155550100","body":"hi"}`))
	f.Add([]byte(`{"id":"a","tenant":"acme","channel":"email","to":"a@example.com","subject":"s\r\nBcc: x","body":"hi"}`))
	f.Add([]byte(`{"id":"a","tenant":"a}b","channel":"email","to":"A <a@example.com>","subject":"s","body":"hi"}`))
	f.Add([]byte(`{"id":"a","tenant":"acme","channel":"sms","to":"+1 (415) 555-0100","body":"\xff"}`))
	f.Add([]byte(`{"id":"a","tenant":"acme","channel":"email","to":"a@example.com","subject":"s","body":"hi","html":"<p>hi</p>","reply_to":"r@example.com","headers":{"X-A":"v","x-a":"w"},"list_unsubscribe":"https://example.com/u, mailto:u@example.com"}`))
	f.Add([]byte(`{"id":"a","tenant":"acme","channel":"email","to":"a@example.com","subject":"s","body":"hi","headers":{"Bcc":"v@example.com","X-B":"v\r\nTo: x"}}`))
	f.Add([]byte(`{"id":"a","tenant":"acme","channel":"sms","to":"+14155550100","body":"hi","html":"<p>hi</p>","list_unsubscribe":"mailto:u@example.com"}`))
	f.Add([]byte(`{"id":"a","tenant":"acme","channel":"whatsapp","to":"+14155550100","template":{"name":"order_shipped","language":"en_US","params":["Ann","42"]}}`))
	f.Add([]byte(`{"id":"a","tenant":"acme","channel":"whatsapp","to":"+14155550100","body":"hi","template":{"name":"Bad-Name"}}`))
	f.Add([]byte(`{"id":"a","tenant":"acme","channel":"sms","to":"+14155550100","body":"hi","template":{"name":"x"}}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := tasks.Decode(b)
		if err != nil {
			if !errors.Is(err, tasks.ErrInvalid) && !errors.Is(err, tasks.ErrUnknownChannel) {
				t.Fatalf("Decode error %v has no sentinel", err)
			}
			if err.Error() == "" {
				t.Fatal("empty reason")
			}
			return
		}
		// Whatever decodes is valid, normalised, injection-free, and round-trips.
		if err := n.Validate(); err != nil {
			t.Fatalf("decoded notification does not validate: %v", err)
		}
		headers := n.Subject + n.To + n.From + n.ReplyTo + n.ListUnsubscribe
		for k, v := range n.Headers {
			headers += k + v
			if tasks.ReservedHeader(k) {
				t.Fatalf("reserved header %q passed", k)
			}
		}
		if strings.ContainsAny(headers, "\r\n\x00") {
			t.Fatalf("header with CR/LF/NUL passed: %+v", n)
		}
		if n.Channel == tasks.SMS && (n.HTML != "" || n.ReplyTo != "" || len(n.Headers) > 0 || n.ListUnsubscribe != "") {
			t.Fatalf("sms with email fields passed: %+v", n)
		}
		if (n.Template != nil) != (n.Channel == tasks.WhatsApp && n.Body == "") && n.Template != nil {
			t.Fatalf("a template outside whatsapp, or beside a body, passed: %+v", n)
		}
		if n.Normalized().To != n.To {
			t.Fatalf("decoded recipient %q not normalised", n.To)
		}
		enc, err := n.Encode()
		if err != nil {
			t.Fatal(err)
		}
		back, err := tasks.Decode(enc)
		if err != nil || back.ID != n.ID || back.To != n.To || back.Body != n.Body || back.HTML != n.HTML ||
			back.ReplyTo != n.ReplyTo || back.ListUnsubscribe != n.ListUnsubscribe || !maps.Equal(back.Headers, n.Headers) {
			t.Fatalf("round trip: %+v, %v", back, err)
		}
	})
}

func FuzzNormalizeRecipient(f *testing.F) {
	for _, s := range []string{"+14155550100", "+1 (415) 555-0100", "Ann <a@Example.com>", "a@b", "\r\n", "", "+", "@"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p := tasks.NormalizePhone(s)
		if tasks.NormalizePhone(p) != p {
			t.Fatalf("NormalizePhone not idempotent on %q", s)
		}
		if tasks.IsE164(p) && strings.ContainsAny(p, " -().") {
			t.Fatalf("E.164 with separators: %q", p)
		}
		e := tasks.NormalizeEmail(s)
		if strings.ContainsAny(s, "\r\n") && e != s {
			t.Fatalf("NormalizeEmail rewrote a CR/LF input %q to %q", s, e)
		}
		_ = tasks.Mask(s)
	})
}

// NewID gives valid, unique ids whose part before the first '-' — what
// asynqmon lists — differs between ids of one burst (hyphenated UUIDv7s of
// a burst share their first 8 digits), and that still sort by time.
func TestNewIDDistinctInAsynqmon(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	prev := ""
	for i := 0; i < 5000; i++ {
		id := tasks.NewID()
		if err := tasks.CheckID(id); err != nil || len(id) != 32 || id[12] != '7' {
			t.Fatalf("NewID() = %q (%v): want 32 hex digits of a UUIDv7", id, err)
		}
		shown, _, _ := strings.Cut(id, "-") // asynqmon's uuidPrefix
		if seen[shown] {
			t.Fatalf("two ids of a burst show as %q in asynqmon", shown)
		}
		seen[shown] = true
		if id[:12] < prev { // the millisecond clock, in front
			t.Fatalf("ids out of time order: %q after %q", id, prev)
		}
		prev = id[:12]
	}
}

// U+0085 (NEL) and the other C1 controls are refused raw in to, from,
// reply_to and subject, as in header values: some mail software breaks
// lines on them.
func TestNELRefusedInAddressesAndSubject(t *testing.T) {
	for _, field := range []string{"to", "from", "reply_to", "subject"} {
		for _, bad := range []string{"\u0085", "\u009b", "\x7f"} {
			n := tasks.NewEmail("acme", "ann@example.com", "Hello", "body")
			switch field {
			case "to":
				n.To = "ann@example.com" + bad + "Bcc: eve@example.com"
			case "from":
				n.From = "news@example.com" + bad + "x"
			case "reply_to":
				n.ReplyTo = "help@example.com" + bad + "x"
			case "subject":
				n.Subject = "Hello" + bad + "Bcc: eve@example.com"
			}
			err := n.Normalized().Validate()
			if !errors.Is(err, tasks.ErrInvalid) || !strings.Contains(err.Error(), field) {
				t.Errorf("%s with %q: %v, want invalid %s", field, bad, err, field)
			}
		}
	}
}
