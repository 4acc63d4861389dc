package tlstest_test

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/testkit/tlstest"
)

// The certificates are what the TLS tests rely on: the server one verifies
// against the CA for every loopback name, the expired one and the other CA
// do not.
func TestCerts(t *testing.T) {
	t.Parallel()
	c := tlstest.New(t)
	leaf := func(k tlstest.KeyPair) *x509.Certificate {
		cert, err := x509.ParseCertificate(k.Certificate.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return cert
	}
	for _, name := range []string{"127.0.0.1", "::1", "localhost"} {
		if _, err := leaf(c.Server).Verify(x509.VerifyOptions{Roots: c.CAPool, DNSName: name}); err != nil {
			t.Errorf("server certificate for %s: %v", name, err)
		}
	}
	if _, err := leaf(c.Expired).Verify(x509.VerifyOptions{Roots: c.CAPool, DNSName: "127.0.0.1"}); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Errorf("expired certificate verified: %v", err)
	}
	raw, err := os.ReadFile(c.OtherCAFile)
	if err != nil {
		t.Fatal(err)
	}
	other := x509.NewCertPool()
	if !other.AppendCertsFromPEM(raw) {
		t.Fatal("other CA file holds no certificate")
	}
	if _, err := leaf(c.Server).Verify(x509.VerifyOptions{Roots: other, DNSName: "127.0.0.1"}); err == nil {
		t.Error("server certificate verified against the unrelated CA")
	}
	if raw, err := os.ReadFile(c.CAFile); err != nil {
		t.Fatal(err)
	} else if b, _ := pem.Decode(raw); b == nil || b.Type != "CERTIFICATE" {
		t.Errorf("CA file is not a PEM certificate: %q", raw)
	}
}
