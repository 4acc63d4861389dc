package worker_test

import (
	"bytes"
	"crypto"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/worker"
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
		got := worker.FoldListUnsubscribe(c.uris)
		if got != c.want {
			t.Errorf("FoldListUnsubscribe(%q) = %q, want %q", c.uris, got, c.want)
		}
		for i, l := range strings.Split("List-Unsubscribe: "+got, "\r\n") {
			fits := !strings.Contains(l, long) // a URI longer than a line cannot fit
			if fits && len(l) > worker.MaxHeaderLine {
				t.Errorf("line %d is %d characters: %q", i+1, len(l), l)
			}
		}
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
			if l := len("List-Unsubscribe: <" + https + ">, <" + mailto + ">"); l <= worker.MaxHeaderLine+50 {
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
				if len(l) > worker.MaxHeaderLine {
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
