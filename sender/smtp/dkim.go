package smtp

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/emersion/go-msgauth/dkim"
	"github.com/sluicehq/sluice/config"
)

// DefaultDKIMHeaders are the header fields signed unless SLUICE_DKIM_HEADERS
// says otherwise. A field listed but absent from a message is signed as
// absent: a relay that adds it (a Reply-To, say) breaks the signature.
var DefaultDKIMHeaders = []string{"From", "To", "Subject", "Date", "Message-ID", "MIME-Version",
	"Content-Type", "Reply-To", "List-Unsubscribe", "List-Unsubscribe-Post"}

// MinDKIMRSABits is the smallest RSA key accepted for DKIM (RFC 8301:
// signers MUST use at least 1024 bits, and SHOULD use 2048).
const MinDKIMRSABits = 1024

// DKIMConfig makes the SMTP sender sign every email (RFC 6376): go-mail
// renders the message, go-msgauth signs those bytes, and exactly the signed
// bytes are sent.
type DKIMConfig struct {
	Domain   string        // d=: the signing domain; DMARC wants it to be the From domain or a parent
	Selector string        // s=: the key is published at SELECTOR._domainkey.DOMAIN
	Key      crypto.Signer // *rsa.PrivateKey or ed25519.PrivateKey
	Headers  []string      // h=: fields to sign; must include From. Empty: DefaultDKIMHeaders
}

// LoadDKIMKey reads a PEM private key for DKIM: RSA (PKCS #1 "RSA PRIVATE
// KEY" or PKCS #8 "PRIVATE KEY", at least MinDKIMRSABits) or Ed25519 (PKCS
// #8). Other blocks in the file (a certificate, say) are skipped. Errors
// never include key material.
func LoadDKIMKey(path string) (crypto.Signer, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("must name a readable PEM private key: %w", err)
	}
	return ParseDKIMKey(raw)
}

// ParseDKIMKey is LoadDKIMKey on the file's contents.
func ParseDKIMKey(raw []byte) (crypto.Signer, error) {
	rest := raw
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, errors.New("holds no PEM private key (want RSA PRIVATE KEY or PRIVATE KEY)")
		}
		var key any
		var err error
		switch block.Type {
		case "RSA PRIVATE KEY":
			key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
		case "PRIVATE KEY":
			key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
		case "ENCRYPTED PRIVATE KEY":
			return nil, errors.New("holds an encrypted private key; DKIM needs it unencrypted (protect the file instead)")
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s block does not parse: %w", block.Type, err)
		}
		switch k := key.(type) {
		case *rsa.PrivateKey:
			if bits := k.N.BitLen(); bits < MinDKIMRSABits {
				return nil, fmt.Errorf("holds a %d-bit RSA key; DKIM needs at least %d (2048 recommended)", bits, MinDKIMRSABits)
			}
			return k, nil
		case ed25519.PrivateKey:
			return k, nil
		default:
			return nil, fmt.Errorf("holds a %T key; DKIM signs with RSA or Ed25519", key)
		}
	}
}

// MaxTXTString is the longest character-string a DNS TXT record holds
// (RFC 1035 3.3: one length octet). A longer record value is published as
// several strings, which resolvers hand to DKIM verifiers joined (RFC 6376
// 3.6.2.2).
const MaxTXTString = 255

// DKIMRecordName is the DNS name a selector's public key is published at,
// SELECTOR._domainkey.DOMAIN, after checking both.
func DKIMRecordName(selector, domain string) (string, error) {
	if err := checkDKIMSelector(selector); err != nil {
		return "", fmt.Errorf("%w: DKIM selector %w", config.ErrConfig, err)
	}
	if err := checkDKIMDomain(domain); err != nil {
		return "", fmt.Errorf("%w: DKIM domain %w", config.ErrConfig, err)
	}
	return selector + "._domainkey." + domain, nil
}

// DKIMRecordStrings splits a TXT record value into character-strings of at
// most MaxTXTString bytes, as a zone file or a DNS provider takes them
// (an RSA-2048 record is about 410 bytes).
func DKIMRecordStrings(value string) []string {
	var out []string
	for len(value) > MaxTXTString {
		out = append(out, value[:MaxTXTString])
		value = value[MaxTXTString:]
	}
	return append(out, value)
}

// DKIMPublicKeyRecord returns the DNS TXT record value that publishes the
// public half of key at SELECTOR._domainkey.DOMAIN: for RSA "v=DKIM1;
// k=rsa; p=" and the base64 DER SubjectPublicKeyInfo (RFC 6376 3.6.1), for
// Ed25519 "v=DKIM1; k=ed25519; p=" and the base64 of the raw 32-byte key
// (RFC 8463 4.2; not its SubjectPublicKeyInfo, which verifiers refuse).
func DKIMPublicKeyRecord(key crypto.Signer) (string, error) {
	switch pub := key.Public().(type) {
	case *rsa.PublicKey:
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			return "", err
		}
		return "v=DKIM1; k=rsa; p=" + b64(der), nil
	case ed25519.PublicKey:
		return "v=DKIM1; k=ed25519; p=" + b64(pub), nil
	}
	return "", fmt.Errorf("unsupported DKIM key %T", key.Public())
}

// sign returns the message with a DKIM-Signature field prepended, over
// relaxed/relaxed canonicalization (robust to relays that refold headers
// or change trailing whitespace).
func (c *DKIMConfig) sign(msg []byte) ([]byte, error) {
	headers := c.Headers
	if len(headers) == 0 {
		headers = DefaultDKIMHeaders
	}
	s, err := dkim.NewSigner(&dkim.SignOptions{
		Domain: c.Domain, Selector: c.Selector, Signer: c.Key,
		HeaderCanonicalization: dkim.CanonicalizationRelaxed,
		BodyCanonicalization:   dkim.CanonicalizationRelaxed,
		HeaderKeys:             headers,
	})
	if err != nil {
		return nil, err
	}
	if _, err := s.Write(msg); err != nil {
		_ = s.Close()
		return nil, err
	}
	if err := s.Close(); err != nil {
		return nil, err
	}
	sig := s.Signature()
	out := make([]byte, 0, len(sig)+len(msg))
	out = append(out, sig...)
	return append(out, msg...), nil
}

// checkDKIMDomain reports whether d is a DNS name of at least two labels
// (letters, digits, hyphens; no label starts or ends with a hyphen).
func checkDKIMDomain(d string) error {
	if len(d) > 253 || !strings.Contains(d, ".") {
		return errors.New("must be a domain name such as example.com")
	}
	return checkLabels(d, false)
}

// checkDKIMSelector reports whether s is a selector: one or more DNS labels.
func checkDKIMSelector(s string) error {
	if s == "" || len(s) > 253 {
		return errors.New("must be 1–253 characters")
	}
	return checkLabels(s, true)
}

func checkLabels(name string, underscore bool) error {
	for _, l := range strings.Split(name, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("%q: each dot-separated label must be 1–63 characters, not starting or ending with '-'", name)
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || underscore && c == '_') {
				return fmt.Errorf("%q: only letters, digits and '-' are allowed in a label", name)
			}
		}
	}
	return nil
}

// checkDKIMHeaders reports whether hs is a usable h= list: field names,
// From among them (RFC 6376 requires it), no DKIM-Signature.
func checkDKIMHeaders(hs []string) error {
	if len(hs) == 0 {
		return errors.New("must list at least From")
	}
	from := false
	for _, h := range hs {
		if h == "" || strings.ContainsFunc(h, func(r rune) bool { return r <= ' ' || r > '~' || r == ':' }) {
			return fmt.Errorf("%q is not a header field name", h)
		}
		if strings.EqualFold(h, "DKIM-Signature") {
			return errors.New("must not list DKIM-Signature")
		}
		from = from || strings.EqualFold(h, "From")
	}
	if !from {
		return errors.New("must include From (RFC 6376 requires it to be signed)")
	}
	return nil
}

// dkimAligned reports whether an address's domain and the DKIM domain are
// the same or one is a subdomain of the other: DMARC's relaxed alignment,
// approximated without the public suffix list (for a startup warning).
func dkimAligned(addr, domain string) bool {
	at := strings.LastIndexByte(addr, '@')
	if at < 0 {
		return false
	}
	d := strings.ToLower(strings.Trim(addr[at+1:], "> "))
	domain = strings.ToLower(domain)
	return d == domain || strings.HasSuffix(d, "."+domain) || strings.HasSuffix(domain, "."+d)
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
