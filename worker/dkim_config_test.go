package worker_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/sender/smtp"
	"github.com/sluicehq/sluice/testkit/tlstest"
	"github.com/sluicehq/sluice/worker"
)

// SLUICE_DKIM_DOMAIN, _SELECTOR and _KEY_FILE come together or not at all,
// the key file must hold an RSA or Ed25519 key, and SLUICE_DKIM_HEADERS must
// sign From; every error names the variable.
func TestConfigDKIM(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rsaKey := genRSA(t).(*rsa.PrivateKey)
	pkcs8RSA, _ := x509.MarshalPKCS8PrivateKey(rsaKey)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pkcs8EC, _ := x509.MarshalPKCS8PrivateKey(ecKey)
	rsaPKCS1, _ := dkimKey(t, rsaKey)
	ed, _ := dkimKey(t, genEd25519(t))
	rsaPKCS8 := write("rsa8.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8RSA}))
	ec := write("ec.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: pkcs8EC}))
	encrypted := write("enc.pem", pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1, 2, 3}}))
	garbage := write("garbage.pem", []byte("not a key"))
	certOnly := tlstest.New(t).CAFile

	base := func(over map[string]string) map[string]string {
		env := map[string]string{
			"SLUICE_SUBJECT_SECRET": "0123456789abcdef",
			"SLUICE_PAYLOAD_KEYS":   testKeys,
			"SLUICE_EMAIL_SENDER":   "smtp",
			"SLUICE_SMTP_FROM":      "notify@acme.example",
			"SLUICE_DKIM_DOMAIN":    "acme.example",
			"SLUICE_DKIM_SELECTOR":  "s2026",
		}
		maps.Copy(env, over)
		return env
	}

	for _, key := range []string{rsaPKCS1, rsaPKCS8, ed} {
		cfg, err := worker.ParseConfig(base(map[string]string{"SLUICE_DKIM_KEY_FILE": key}))
		if err != nil {
			t.Errorf("valid key %s refused: %v", filepath.Base(key), err)
			continue
		}
		if h := smtpSettings(t, cfg).DKIMHeaders; !slices.Equal(h, smtp.DefaultDKIMHeaders) {
			t.Errorf("default DKIM_HEADERS %v, want %v", h, smtp.DefaultDKIMHeaders)
		}
	}
	if _, err := worker.ParseConfig(base(map[string]string{"SLUICE_DKIM_KEY_FILE": ed, "SLUICE_DKIM_HEADERS": " From , Subject,X-Campaign "})); err != nil {
		t.Errorf("header list with spaces refused: %v", err)
	}
	off := base(nil)
	delete(off, "SLUICE_DKIM_DOMAIN")
	delete(off, "SLUICE_DKIM_SELECTOR")
	if _, err := worker.ParseConfig(off); err != nil {
		t.Errorf("DKIM off refused: %v", err)
	}

	cases := []struct {
		name   string
		env    map[string]string
		want   []string // all must appear in the error
		absent []string // none may
	}{
		{"OnlyDomain", map[string]string{"SLUICE_DKIM_SELECTOR": ""},
			[]string{"SLUICE_DKIM_SELECTOR must be set too", "SLUICE_DKIM_KEY_FILE must be set too", "set: SLUICE_DKIM_DOMAIN"},
			[]string{"SLUICE_DKIM_DOMAIN must"}},
		{"NoKeyFile", nil, []string{"SLUICE_DKIM_KEY_FILE must be set too"}, []string{"SLUICE_DKIM_SELECTOR must", "SLUICE_DKIM_DOMAIN must"}},
		{"OnlyKeyFile", map[string]string{"SLUICE_DKIM_DOMAIN": "", "SLUICE_DKIM_SELECTOR": "", "SLUICE_DKIM_KEY_FILE": ed},
			[]string{"SLUICE_DKIM_DOMAIN must be set too", "SLUICE_DKIM_SELECTOR must be set too"}, nil},
		{"MissingFile", map[string]string{"SLUICE_DKIM_KEY_FILE": filepath.Join(dir, "nope.pem")}, []string{"SLUICE_DKIM_KEY_FILE", "no such file"}, nil},
		{"Garbage", map[string]string{"SLUICE_DKIM_KEY_FILE": garbage}, []string{"SLUICE_DKIM_KEY_FILE", "holds no PEM private key"}, nil},
		{"CertificateOnly", map[string]string{"SLUICE_DKIM_KEY_FILE": certOnly}, []string{"SLUICE_DKIM_KEY_FILE", "holds no PEM private key"}, nil},
		{"ECKey", map[string]string{"SLUICE_DKIM_KEY_FILE": ec}, []string{"SLUICE_DKIM_KEY_FILE", "ecdsa", "RSA or Ed25519"}, nil},
		{"Encrypted", map[string]string{"SLUICE_DKIM_KEY_FILE": encrypted}, []string{"SLUICE_DKIM_KEY_FILE", "encrypted"}, nil},
		{"SingleLabelDomain", map[string]string{"SLUICE_DKIM_KEY_FILE": ed, "SLUICE_DKIM_DOMAIN": "localhost"}, []string{"SLUICE_DKIM_DOMAIN", "domain name"}, nil},
		{"BadLabel", map[string]string{"SLUICE_DKIM_KEY_FILE": ed, "SLUICE_DKIM_DOMAIN": "-acme.example"}, []string{"SLUICE_DKIM_DOMAIN", "label"}, nil},
		{"BadSelector", map[string]string{"SLUICE_DKIM_KEY_FILE": ed, "SLUICE_DKIM_SELECTOR": "s 1"}, []string{"SLUICE_DKIM_SELECTOR"}, nil},
		{"HeadersWithoutFrom", map[string]string{"SLUICE_DKIM_KEY_FILE": ed, "SLUICE_DKIM_HEADERS": "To,Subject"}, []string{"SLUICE_DKIM_HEADERS", "From"}, nil},
		{"HeadersSignature", map[string]string{"SLUICE_DKIM_KEY_FILE": ed, "SLUICE_DKIM_HEADERS": "From,DKIM-Signature"}, []string{"SLUICE_DKIM_HEADERS", "DKIM-Signature"}, nil},
		{"HeadersBadName", map[string]string{"SLUICE_DKIM_KEY_FILE": ed, "SLUICE_DKIM_HEADERS": "From,X A"}, []string{"SLUICE_DKIM_HEADERS", `"X A"`}, nil},
	}
	for _, c := range cases {
		_, err := worker.ParseConfig(base(c.env))
		if !errors.Is(err, config.ErrConfig) {
			t.Errorf("%s: err = %v, want a config error", c.name, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %q", c.name, err, w)
			}
		}
		for _, a := range c.absent {
			if strings.Contains(err.Error(), a) {
				t.Errorf("%s: error %q mentions %q", c.name, err, a)
			}
		}
	}
}
