// Package tlstest makes the certificates TLS tests need, in process: a CA,
// a server certificate it signed for 127.0.0.1, ::1 and localhost, an expired
// server certificate signed by the same CA, and an unrelated second CA. The
// PEM files are written to a test's temporary directory, so real servers
// (redis-server) can load them.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// KeyPair is a certificate and its private key, as PEM files and loaded.
type KeyPair struct {
	CertFile, KeyFile string
	Certificate       tls.Certificate
}

// ServerConfig is a server-side TLS configuration presenting the pair.
func (k KeyPair) ServerConfig() *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{k.Certificate}, MinVersion: tls.VersionTLS12}
}

// Certs is what New makes.
type Certs struct {
	Dir string
	// CAFile is the PEM certificate of the CA that signed Server and Expired;
	// CAPool holds it.
	CAFile string
	CAPool *x509.CertPool
	// OtherCAFile is the PEM certificate of a CA that signed nothing here:
	// a client trusting only it must refuse Server.
	OtherCAFile string
	// Server is valid now for 127.0.0.1, ::1 and localhost.
	Server KeyPair
	// Expired is like Server but stopped being valid an hour ago.
	Expired KeyPair
}

// ClientConfig trusts only the CA. ServerName is left empty, so a dial
// takes it from the address it connects to.
func (c *Certs) ClientConfig() *tls.Config {
	return &tls.Config{RootCAs: c.CAPool, MinVersion: tls.VersionTLS12}
}

// New makes the certificates in a new temporary directory of tb.
func New(tb testing.TB) *Certs {
	tb.Helper()
	c, err := Make(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// Make makes the certificates in dir.
func Make(dir string) (*Certs, error) {
	c := &Certs{Dir: dir, CAPool: x509.NewCertPool()}
	now := time.Now()
	ca, caKey, err := newCA("Sluice Test CA", now)
	if err != nil {
		return nil, err
	}
	c.CAPool.AddCert(ca)
	if c.CAFile, err = writePEM(dir, "ca.pem", "CERTIFICATE", ca.Raw); err != nil {
		return nil, err
	}
	other, _, err := newCA("Unrelated Test CA", now)
	if err != nil {
		return nil, err
	}
	if c.OtherCAFile, err = writePEM(dir, "other-ca.pem", "CERTIFICATE", other.Raw); err != nil {
		return nil, err
	}
	if c.Server, err = newLeaf(dir, "server", ca, caKey, now.Add(-time.Hour), now.Add(24*time.Hour)); err != nil {
		return nil, err
	}
	if c.Expired, err = newLeaf(dir, "expired", ca, caKey, now.Add(-48*time.Hour), now.Add(-time.Hour)); err != nil {
		return nil, err
	}
	return c, nil
}

func newCA(name string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Sluice tests"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("tlstest: create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func newLeaf(dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, notBefore, notAfter time.Time) (KeyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyPair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "localhost", Organization: []string{"Sluice tests"}},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// Redis uses the same certificate as client of its cluster bus and
		// replication links, so the pair is good for both ends.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return KeyPair{}, fmt.Errorf("tlstest: create %s certificate: %w", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return KeyPair{}, err
	}
	var k KeyPair
	if k.CertFile, err = writePEM(dir, name+".pem", "CERTIFICATE", der); err != nil {
		return KeyPair{}, err
	}
	if k.KeyFile, err = writePEM(dir, name+"-key.pem", "EC PRIVATE KEY", keyDER); err != nil {
		return KeyPair{}, err
	}
	if k.Certificate, err = tls.LoadX509KeyPair(k.CertFile, k.KeyFile); err != nil {
		return KeyPair{}, fmt.Errorf("tlstest: load %s pair: %w", name, err)
	}
	return k, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

func writePEM(dir, name, typ string, der []byte) (string, error) {
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return "", fmt.Errorf("tlstest: %w", err)
	}
	return path, nil
}
