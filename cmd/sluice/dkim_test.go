package main

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-msgauth/dkim"

	"github.com/sluicehq/sluice/sender/smtp"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/testkit/fakes"
)

// zoneString is one quoted character-string of a zone-file line.
var zoneString = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)

// parseZoneTXT reads the owner name and the character-strings of a TXT
// record as a zone file writes it, independently of zoneTXT.
func parseZoneTXT(t *testing.T, line string) (string, []string) {
	t.Helper()
	fields := strings.Fields(line)
	if len(fields) < 4 || fields[1] != "IN" || fields[2] != "TXT" || !strings.HasSuffix(fields[0], ".") {
		t.Fatalf("not a zone-file TXT line: %q", line)
	}
	var strs []string
	for _, m := range zoneString.FindAllStringSubmatch(line, -1) {
		strs = append(strs, regexp.MustCompile(`\\(.)`).ReplaceAllString(m[1], "$1"))
	}
	return strings.TrimSuffix(fields[0], "."), strs
}

// sluice dkim record prints, for an RSA-2048 and an Ed25519 key, a record
// in strings of at most 255 bytes; a message the worker's SMTP sender signs
// with the key verifies with go-msgauth's verifier resolving the printed
// record (its strings joined, as a resolver does), and not with the
// Ed25519 record the README used to print (the SubjectPublicKeyInfo).
func TestDKIMRecord(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		key     crypto.Signer
		strings int
	}{{"RSA", rsaKey, 2}, {"Ed25519", edKey, 1}} {
		t.Run(c.name, func(t *testing.T) {
			der, err := x509.MarshalPKCS8PrivateKey(c.key)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "dkim.pem")
			if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Setenv("SLUICE_DKIM_KEY_FILE", path)
			r := sluice(t, "", "dkim", "record", "--selector", "s2026", "--domain", "acme.example")
			if r.code != 0 {
				t.Fatalf("dkim record: %+v", r)
			}
			name, strs := parseZoneTXT(t, strings.TrimSpace(r.stdout))
			if name != "s2026._domainkey.acme.example" || len(strs) != c.strings {
				t.Fatalf("record %q: name %q, %d strings; want s2026._domainkey.acme.example, %d", r.stdout, name, len(strs), c.strings)
			}
			for i, s := range strs {
				if len(s) > 255 {
					t.Errorf("string %d is %d bytes, over 255", i, len(s))
				}
			}
			record := strings.Join(strs, "")
			raw := signedByWorker(t, c.key)
			lookup := func(rec string) func(string) ([]string, error) {
				return func(n string) ([]string, error) {
					if n != name {
						return nil, fmt.Errorf("no TXT record at %s", n)
					}
					return []string{rec}, nil
				}
			}
			vs, err := dkim.VerifyWithOptions(bytes.NewReader(raw), &dkim.VerifyOptions{LookupTXT: lookup(record)})
			if err != nil || len(vs) != 1 || vs[0].Err != nil {
				t.Fatalf("does not verify with the printed record %q: %v %+v", record, err, vs)
			}
			if c.name == "Ed25519" {
				spki, _ := x509.MarshalPKIXPublicKey(c.key.Public())
				old := "v=DKIM1; k=ed25519; p=" + base64.StdEncoding.EncodeToString(spki) // openssl pkey -pubout -outform DER | base64
				if vs, err := dkim.VerifyWithOptions(bytes.NewReader(raw), &dkim.VerifyOptions{LookupTXT: lookup(old)}); err == nil && len(vs) == 1 && vs[0].Err == nil {
					t.Errorf("the SubjectPublicKeyInfo record verifies too; RFC 8463 wants the raw key")
				}
			}
		})
	}
	if r := sluice(t, "", "dkim", "record", "--key-file", "/nonexistent", "--selector", "s", "--domain", "acme.example"); r.code != 1 {
		t.Errorf("missing key file: %+v", r)
	}
	if r := sluice(t, "", "dkim", "record", "--key-file", "k.pem", "--selector", "s", "--domain", "nodot"); r.code != 2 {
		t.Errorf("bad domain: %+v", r)
	}
}

// signedByWorker is a message as the worker's SMTP sender signs and sends
// it, as the loopback SMTP server received it.
func signedByWorker(t *testing.T, key crypto.Signer) []byte {
	t.Helper()
	srv := fakes.NewSMTPServer(t)
	s, err := smtp.NewSender(smtp.Config{Host: srv.Host, Port: srv.Port, TLS: "none", From: "notify@acme.example",
		DKIM: &smtp.DKIMConfig{Domain: "acme.example", Selector: "s2026", Key: key}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n := tasks.NewEmail("acme", "ann@example.com", "Your receipt", "Thanks for your order.")
	n.ListUnsubscribe = "https://acme.example/u/3f9a0c5e7d1b?list=weekly&l=1, mailto:unsubscribe@lists.acme.example?subject=3f9a0c5e7d1b"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Send(ctx, n); err != nil {
		t.Fatal(err)
	}
	return srv.WaitCount(t, 1, 10*time.Second)[0].Raw
}
