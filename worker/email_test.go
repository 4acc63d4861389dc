package worker_test

// Email senders a product can ship with (issue 14), proven against the fake
// SMTP server on loopback: multipart text + HTML, Reply-To, custom headers,
// RFC 8058 List-Unsubscribe, DKIM signatures checked by go-msgauth's
// verifier, and bad email fields refused at enqueue and archived unsent.

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"mime/quotedprintable"
	"net/textproto"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-msgauth/dkim"
	"github.com/hibiken/asynq"

	"github.com/sluicehq/sluice/sender"
	"github.com/sluicehq/sluice/sender/smtp"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
)

// richEmail uses every email-only field; the text has a line over 76
// characters, trailing space and non-ASCII, so quoted-printable has work.
func richEmail() tasks.Notification {
	n := tasks.NewEmail("acme", "ann@example.com", "Your receipt",
		"Thanks for your order.\nThis line is long enough that quoted-printable has to break it with a soft line break. \nGrüße, Acme")
	n.HTML = "<!doctype html>\n<p>Thanks for your <b>order</b> &amp; welcome.</p>\n<p style=\"color:#333\">Grüße, Acme</p>"
	n.ReplyTo = "support@acme.example"
	n.Headers = map[string]string{
		"X-Campaign": "receipts",
		"X-Note":     "Grüße aus Köln — a header value long enough to be folded over several encoded words",
		"user-agent": "Acme Mailer/2", // replaces go-mail's own, in any case
	}
	n.ListUnsubscribe = "https://acme.example/u/8f2c?l=1, mailto:unsub@acme.example?subject=8f2c"
	return n
}

// crlf is text as MIME carries it: text/* line breaks are CRLF on the wire
// (RFC 2046 4.1.1), so that is what a receiver decodes.
func crlf(s string) string { return strings.ReplaceAll(s, "\n", "\r\n") }

func byID(ds []fakes.Delivery, id string) fakes.Delivery {
	for _, d := range ds {
		if d.ID == id {
			return d
		}
	}
	return fakes.Delivery{}
}

// An email with HTML arrives as multipart/alternative with the text part,
// then the HTML part, each exactly as enqueued; Reply-To, the custom headers
// (decoded) and RFC 8058's List-Unsubscribe and List-Unsubscribe-Post are as
// sent. A text-only email with a mailto target stays single-part and gets
// no List-Unsubscribe-Post.
func TestEmailMultipartHeadersAndUnsubscribe(t *testing.T) {
	t.Parallel()
	b := setup(t, "email:recipient=10/1m")
	b.start(t, b.cfg)
	rich := richEmail()
	plain := tasks.NewEmail("acme", "bob@example.com", "Weekly digest", "Nothing new this week.\n")
	plain.ListUnsubscribe = "mailto:unsub@acme.example?subject=bob"
	b.enqueue(t, rich)
	b.enqueue(t, plain)
	got := b.smtp.WaitCount(t, 2, 15*time.Second)

	d := byID(got, rich.ID)
	if d.Raw == nil || d.Header == nil {
		t.Fatalf("delivery of %s not recorded with its raw message and header: %+v", rich.ID, got)
	}
	mt, params, err := mime.ParseMediaType(d.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/alternative" || params["boundary"] == "" {
		t.Fatalf("Content-Type %q (%v), want multipart/alternative with a boundary", d.Header.Get("Content-Type"), err)
	}
	mr := multipart.NewReader(strings.NewReader(d.Body), params["boundary"])
	for i, want := range []struct{ typ, body string }{{"text/plain", rich.Body}, {"text/html", rich.HTML}} {
		p, err := mr.NextPart() // decodes quoted-printable
		if err != nil {
			t.Fatalf("part %d: %v", i+1, err)
		}
		pt, pp, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
		if pt != want.typ || !strings.EqualFold(pp["charset"], "utf-8") {
			t.Errorf("part %d is %q, want %s; charset=utf-8", i+1, p.Header.Get("Content-Type"), want.typ)
		}
		body, err := io.ReadAll(p)
		if err != nil {
			t.Fatal(err)
		}
		if string(body) != crlf(want.body) {
			t.Errorf("part %d (%s) reads\n%q\nwant\n%q", i+1, want.typ, body, crlf(want.body))
		}
	}
	if _, err := mr.NextPart(); err != io.EOF {
		t.Errorf("a third part, or a broken end: %v", err)
	}

	if rt, err := d.Header.AddressList("Reply-To"); err != nil || len(rt) != 1 || rt[0].Address != rich.ReplyTo {
		t.Errorf("Reply-To %q (%v), want %s", d.Header.Get("Reply-To"), err, rich.ReplyTo)
	}
	var dec mime.WordDecoder
	for name, want := range rich.Headers {
		vals := d.Header[textproto.CanonicalMIMEHeaderKey(name)]
		if len(vals) != 1 {
			t.Errorf("header %s appears %d times: %q", name, len(vals), vals)
			continue
		}
		if got, err := dec.DecodeHeader(vals[0]); err != nil || got != want {
			t.Errorf("header %s = %q, decodes to %q (%v); want %q", name, vals[0], got, err, want)
		}
	}
	if raw := d.Header.Get("X-Note"); !strings.Contains(raw, "=?UTF-8?") || strings.ContainsRune(raw, 'ö') {
		t.Errorf("non-ASCII header sent as %q, want RFC 2047 encoded words", raw)
	}
	for name, want := range map[string]string{
		"List-Unsubscribe":      "<https://acme.example/u/8f2c?l=1>, <mailto:unsub@acme.example?subject=8f2c>",
		"List-Unsubscribe-Post": "List-Unsubscribe=One-Click", // RFC 8058 3.1: exactly this, once
		"X-Sluice-Tenant":       "acme",
		"Message-Id":            "<" + rich.ID + "@localhost>",
	} {
		if vals := d.Header[name]; len(vals) != 1 || vals[0] != want {
			t.Errorf("%s: %q, want exactly [%q]", name, vals, want)
		}
	}

	p := byID(got, plain.ID)
	if mt, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type")); mt != "text/plain" {
		t.Errorf("text-only email has Content-Type %q", p.Header.Get("Content-Type"))
	}
	if body, err := io.ReadAll(quotedprintable.NewReader(strings.NewReader(p.Body))); err != nil || string(body) != crlf(plain.Body) {
		t.Errorf("text-only body %q (%v), want %q", body, err, crlf(plain.Body))
	}
	if vals := p.Header["List-Unsubscribe"]; len(vals) != 1 || vals[0] != "<mailto:unsub@acme.example?subject=bob>" {
		t.Errorf("mailto-only List-Unsubscribe: %q", vals)
	}
	if vals := p.Header["List-Unsubscribe-Post"]; len(vals) != 0 {
		t.Errorf("List-Unsubscribe-Post without an https URL: %q (RFC 8058 one-click needs https)", vals)
	}
	if vals := p.Header["Reply-To"]; len(vals) != 0 {
		t.Errorf("Reply-To on an email that set none: %q", vals)
	}
}

// dkimKey writes key's PEM to a file and returns the path and the DNS TXT
// record publishing its public half, built here from the key (not by the
// code under test).
func dkimKey(t *testing.T, key crypto.Signer) (path, record string) {
	t.Helper()
	var block *pem.Block
	switch k := key.(type) {
	case *rsa.PrivateKey:
		block = &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}
		der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		record = "v=DKIM1; k=rsa; p=" + base64.StdEncoding.EncodeToString(der)
	case ed25519.PrivateKey:
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		block = &pem.Block{Type: "PRIVATE KEY", Bytes: der}
		record = "v=DKIM1; k=ed25519; p=" + base64.StdEncoding.EncodeToString(k.Public().(ed25519.PublicKey))
	}
	path = filepath.Join(t.TempDir(), "dkim.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := smtp.DKIMPublicKeyRecord(key); err != nil || got != record {
		t.Errorf("DKIMPublicKeyRecord = %q, %v; want %q", got, err, record)
	}
	return path, record
}

// dkimWorker starts a worker that signs with key for d=acme.example,
// s=s2026, from notify@acme.example; it returns the DNS record to verify with.
func dkimWorker(t *testing.T, key crypto.Signer) (*bundle, string) {
	t.Helper()
	path, record := dkimKey(t, key)
	b := setup(t, "email:recipient=10/1m")
	b.cfg.SMTPFrom = "notify@acme.example"
	b.cfg = withEnv(b.cfg, "SLUICE_DKIM_DOMAIN", "acme.example", "SLUICE_DKIM_SELECTOR", "s2026", "SLUICE_DKIM_KEY_FILE", path)
	b.start(t, b.cfg)
	return b, record
}

// verifyDKIM runs go-msgauth's verifier on a received message, resolving
// only SELECTOR._domainkey.DOMAIN, to record.
func verifyDKIM(raw []byte, domain, selector, record string) ([]*dkim.Verification, error) {
	return dkim.VerifyWithOptions(bytes.NewReader(raw), &dkim.VerifyOptions{
		LookupTXT: func(name string) ([]string, error) {
			if name == selector+"._domainkey."+domain {
				return []string{record}, nil
			}
			return nil, fmt.Errorf("no TXT record at %s", name)
		},
	})
}

func genRSA(t *testing.T) crypto.Signer {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func genEd25519(t *testing.T) crypto.Signer {
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// A worker configured with SLUICE_DKIM_* signs what it sends: the received
// bytes verify with the published key (RSA and Ed25519), the signature
// covers the From, Reply-To and RFC 8058 fields, and changing one byte of
// the body or of the Subject makes verification fail.
func TestDKIMSignatureVerifies(t *testing.T) {
	t.Parallel()
	for name, gen := range map[string]func(*testing.T) crypto.Signer{"RSA": genRSA, "Ed25519": genEd25519} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, record := dkimWorker(t, gen(t))
			n := richEmail()
			b.enqueue(t, n)
			raw := b.smtp.WaitCount(t, 1, 15*time.Second)[0].Raw

			vs, err := verifyDKIM(raw, "acme.example", "s2026", record)
			if err != nil || len(vs) != 1 {
				t.Fatalf("verify: %d verifications, %v\n%s", len(vs), err, raw)
			}
			if vs[0].Err != nil || vs[0].Domain != "acme.example" {
				t.Fatalf("signature does not verify: %v (d=%s)\n%s", vs[0].Err, vs[0].Domain, raw)
			}
			for _, h := range []string{"From", "To", "Subject", "Date", "Message-ID", "Reply-To", "List-Unsubscribe", "List-Unsubscribe-Post"} {
				if !slices.ContainsFunc(vs[0].HeaderKeys, func(k string) bool { return strings.EqualFold(k, h) }) {
					t.Errorf("signature does not cover %s: h=%v", h, vs[0].HeaderKeys)
				}
			}

			// The verifier can say no: one byte of the body, or of a signed header.
			bodyAt := bytes.Index(raw, []byte("\r\n\r\n"))
			i := bytes.Index(raw[bodyAt:], []byte("Thanks for your order"))
			subj := bytes.Index(raw, []byte("Subject: Your receipt"))
			if bodyAt < 0 || i < 0 || subj < 0 {
				t.Fatalf("cannot find the body text or the Subject in\n%s", raw)
			}
			for what, at := range map[string]int{"body": bodyAt + i, "subject": subj + len("Subject: ")} {
				tampered := bytes.Clone(raw)
				tampered[at] ^= 0x20 // T → t, Y → y
				vs, err := verifyDKIM(tampered, "acme.example", "s2026", record)
				if err != nil || len(vs) != 1 || vs[0].Err == nil {
					t.Errorf("%s changed by one byte, yet the signature verifies (%v)", what, err)
				}
			}
		})
	}
}

// With DKIM the sender sends the signed bytes itself (MAIL, RCPT, DATA);
// its replies are classified like go-mail's: 5xx permanent, 4xx transient,
// both not sent. The connection is reused after a success.
func TestDKIMSignedSendClassifiesReplies(t *testing.T) {
	t.Parallel()
	key := genEd25519(t)
	_, record := dkimKey(t, key)
	srv := fakes.NewSMTPServer(t)
	s, err := smtp.NewSender(smtp.Config{Host: srv.Host, Port: srv.Port, TLS: "none", From: "Acme <notify@acme.example>",
		DKIM: &smtp.DKIMConfig{Domain: "acme.example", Selector: "s1", Key: key}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()

	for _, c := range []struct {
		code               int
		permanent, notSent bool
	}{{550, true, true}, {451, false, true}} {
		srv.SetReply(func(string, string) (int, string) { return c.code, "" })
		var se *sender.SendError
		if err := s.Send(ctx, richEmail()); !errors.As(err, &se) || se.Permanent != c.permanent || se.NotSent != c.notSent {
			t.Errorf("reply %d: %v; want a SendError permanent=%v notSent=%v", c.code, err, c.permanent, c.notSent)
		}
	}
	srv.SetReply(nil)
	for range 2 {
		if err := s.Send(ctx, richEmail()); err != nil {
			t.Fatalf("accepted send: %v", err)
		}
	}
	ds := srv.WaitCount(t, 2, 10*time.Second)
	for _, d := range ds {
		if vs, err := verifyDKIM(d.Raw, "acme.example", "s1", record); err != nil || len(vs) != 1 || vs[0].Err != nil {
			t.Errorf("delivery %s does not verify: %v %v", d.ID, err, vs)
		}
	}
	if ds[0].To != "ann@example.com" {
		t.Errorf("envelope recipient %q", ds[0].To)
	}
	if a := srv.Attempts(); a != 4 {
		t.Errorf("%d attempts, want 4", a)
	}
}

// CR/LF in a custom header, a reserved header name, a bad Reply-To and an
// HTML body on an SMS are refused by tasks.Enqueue; sealed into a task by
// hand, they are archived by the worker with the reason, never sent.
func TestEmailFieldsRefusedAtEnqueueAndArchivedUnsent(t *testing.T) {
	t.Parallel()
	b := setup(t, "sms:recipient=10/1m,email:recipient=10/1m")
	r := b.start(t, b.cfg)
	email := func(f func(*tasks.Notification)) tasks.Notification {
		n := tasks.NewEmail("acme", "ann@example.com", "Hi", "Body")
		f(&n)
		return n
	}
	cases := []struct {
		name   string
		n      tasks.Notification
		reason string
	}{
		{"HeaderCRLF", email(func(n *tasks.Notification) {
			n.Headers = map[string]string{"X-Campaign": "x\r\nBcc: victim@example.com"}
		}), "header injection"},
		{"ReservedHeader", email(func(n *tasks.Notification) { n.Headers = map[string]string{"bcc": "victim@example.com"} }), "cannot be set"},
		{"BadReplyTo", email(func(n *tasks.Notification) { n.ReplyTo = "Support <support@acme.example>" }), "reply_to"},
		{"HTMLOnSMS", func() tasks.Notification {
			n := tasks.NewSMS("acme", "+14155550100", "code 123456")
			n.HTML = "<p>code</p>"
			return n
		}(), "html is not used for sms"},
	}
	ctx := context.Background()
	keys := b.keys(t)
	for _, c := range cases {
		if _, err := tasks.Enqueue(ctx, b.client, keys, c.n); !errors.Is(err, tasks.ErrInvalid) || !strings.Contains(err.Error(), c.reason) {
			t.Errorf("%s: Enqueue = %v, want ErrInvalid mentioning %q", c.name, err, c.reason)
		}
	}
	for _, c := range cases {
		if ti, err := b.insp.GetTaskInfo(b.cfg.Queue, c.n.ID); err == nil {
			t.Fatalf("%s: refused notification reached the queue: %+v", c.name, ti)
		}
	}
	// A producer that skips validation: the payload sealed by hand.
	for _, c := range cases {
		payload, err := json.Marshal(c.n)
		if err != nil {
			t.Fatal(err)
		}
		typ, _ := c.n.Channel.TaskType()
		if _, err := b.client.Enqueue(asynq.NewTask(typ, keys.Seal(c.n.ID, typ, payload)),
			asynq.Queue(b.cfg.Queue), asynq.TaskID(c.n.ID), asynq.MaxRetry(5)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range cases {
		ti := b.waitTask(t, c.n.ID, 10*time.Second, func(ti *asynq.TaskInfo) bool { return ti.State == asynq.TaskStateArchived })
		if ti.Retried != 0 || !strings.Contains(ti.LastErr, c.reason) {
			t.Errorf("%s: archived after %d retries with %q; want at once, with %q", c.name, ti.Retried, ti.LastErr, c.reason)
		}
	}
	if v := metric(t, r.reg, "sluice_archived_total", map[string]string{"reason": tasks.ReasonInvalid}); v != float64(len(cases)) {
		t.Errorf("archived{reason=invalid} = %v, want %d", v, len(cases))
	}
	if n := b.smtp.Attempts() + b.sms.Attempts(); n != 0 {
		t.Fatalf("invalid notifications reached a provider %d times", n)
	}
}

// A long List-Unsubscribe arrives folded (RFC 5322: lines of at most 78
// characters), reads back as the same two URIs, and the DKIM signature —
// RSA and Ed25519, relaxed/relaxed, covering List-Unsubscribe — verifies
// on the raw bytes the loopback SMTP server received.
func TestListUnsubscribeFoldedAndSigned(t *testing.T) {
	t.Parallel()
	for name, gen := range map[string]func(*testing.T) crypto.Signer{"RSA": genRSA, "Ed25519": genEd25519} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b, record := dkimWorker(t, gen(t))
			n := richEmail()
			https := "https://acme.example/u/3f9a0c5e7d1b?list=weekly&l=1"
			mailto := "mailto:unsubscribe@lists.acme.example?subject=unsubscribe%203f9a0c5e7d1b"
			n.ListUnsubscribe = https + ", " + mailto
			if l := len("List-Unsubscribe: <" + https + ">, <" + mailto + ">"); l <= smtp.MaxHeaderLine+50 {
				t.Fatalf("the field is %d characters; make it need folding", l)
			}
			b.enqueue(t, n)
			d := b.smtp.WaitCount(t, 1, 15*time.Second)[0]

			head := d.Raw[:bytes.Index(d.Raw, []byte("\r\n\r\n"))]
			var field []string
			for _, l := range strings.Split(string(head), "\r\n") {
				if strings.HasPrefix(l, "List-Unsubscribe:") || len(field) > 0 && len(field) < 3 && (l[0] == ' ' || l[0] == '\t') {
					field = append(field, l)
				} else if len(field) > 0 {
					break
				}
			}
			if len(field) != 2 {
				t.Fatalf("List-Unsubscribe is on %d lines, want 2 (folded at the comma): %q", len(field), field)
			}
			for _, l := range field {
				if len(l) > smtp.MaxHeaderLine {
					t.Errorf("a line of %d characters: %q", len(l), l)
				}
			}
			want := "<" + https + ">, <" + mailto + ">"
			if vals := d.Header[textproto.CanonicalMIMEHeaderKey("List-Unsubscribe")]; len(vals) != 1 || strings.Join(strings.Fields(vals[0]), " ") != want {
				t.Errorf("List-Unsubscribe reads %q, want %q", vals, want)
			}
			vs, err := verifyDKIM(d.Raw, "acme.example", "s2026", record)
			if err != nil || len(vs) != 1 || vs[0].Err != nil {
				t.Fatalf("the signature of the folded message does not verify: %v %+v\n%s", err, vs, d.Raw)
			}
			// It does cover the folded field: change one byte of it and it fails.
			i := bytes.Index(d.Raw, []byte("list=weekly"))
			tampered := bytes.Clone(d.Raw)
			tampered[i] ^= 0x20
			if vs, err := verifyDKIM(tampered, "acme.example", "s2026", record); err != nil || len(vs) != 1 || vs[0].Err == nil {
				t.Errorf("List-Unsubscribe changed, yet the signature verifies (%v)", err)
			}
		})
	}
}
