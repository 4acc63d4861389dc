// Package unsubscribe is Sluice's own one-click unsubscribe (RFC 8058):
// the links workers put into email of categories whose rules say
// email[.CATEGORY]:unsubscribe=hosted, and the routes sluice api serves
// them on.
//
// A link is SLUICE_UNSUBSCRIBE_URL + "/u/" + a token. The token names the
// tenant, the category and the recipient's keyed hash (the one its consent
// keys are made of: never the address) and carries an HMAC-SHA256 under a
// key derived from SLUICE_SUBJECT_SECRET, so it cannot be guessed or
// altered: a forged or changed token is refused (404) and changes nothing.
// Tokens do not expire: an unsubscribe link must work as long as the mail
// that carries it is read.
//
// A POST to the link (List-Unsubscribe=One-Click, as Gmail and Yahoo send
// it: no cookies, no confirmation) records an opt-out at once — of the
// email's category, or of every category under optout=all — with source
// one-click in the recipient's consent ledger. A GET shows a page with one
// button that makes that POST, for people who open the link themselves.
package unsubscribe

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/sluicehq/sluice/tasks"
)

// ErrBadToken reports a token that is malformed, forged or altered.
var ErrBadToken = errors.New("unsubscribe: not a valid unsubscribe link")

// Path is where the links are served, below SLUICE_UNSUBSCRIBE_URL.
const Path = "/u/"

// tokenVersion starts every token, so the format can change.
const tokenVersion = "1"

// macLen is how many bytes of the HMAC a token carries (128 bits).
const macLen = 16

// Signer makes and reads tokens under one key.
type Signer struct{ key []byte }

// NewSigner derives the token key from the subject secret (the key the
// recipients' hashes are made with): rotating that secret starts every
// consent afresh, and every link with it.
func NewSigner(subjectSecret string) (*Signer, error) {
	if len(subjectSecret) < 16 {
		return nil, errors.New("unsubscribe: the subject secret must be at least 16 bytes")
	}
	m := hmac.New(sha256.New, []byte(subjectSecret))
	m.Write([]byte("sluice one-click unsubscribe v1"))
	return &Signer{key: m.Sum(nil)}, nil
}

// Link is what a token says.
type Link struct {
	Tenant   string
	Category string
	// Subject is the recipient's keyed hash (consent.Store.Subject).
	Subject string
}

// Token encodes and signs l.
func (s *Signer) Token(l Link) (string, error) {
	if err := tasks.CheckTenant(l.Tenant); err != nil {
		return "", err
	}
	if err := tasks.CheckCategory(l.Category); err != nil {
		return "", err
	}
	if l.Subject == "" || strings.Contains(l.Subject, "|") {
		return "", errors.New("unsubscribe: bad subject hash")
	}
	// '|' is in none of the fields (tenants may hold '.').
	body := tokenVersion + "|" + l.Tenant + "|" + l.Category + "|" + l.Subject
	payload := base64.RawURLEncoding.EncodeToString([]byte(body))
	return payload + "." + base64.RawURLEncoding.EncodeToString(s.mac(payload)), nil
}

func (s *Signer) mac(payload string) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(payload))
	return m.Sum(nil)[:macLen]
}

// Parse checks a token's signature and reads it. Errors wrap ErrBadToken.
func (s *Signer) Parse(token string) (Link, error) {
	if len(token) > 512 {
		return Link{}, fmt.Errorf("%w: too long", ErrBadToken)
	}
	payload, sig, ok := strings.Cut(token, ".")
	if !ok {
		return Link{}, ErrBadToken
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(payload)) {
		return Link{}, ErrBadToken
	}
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return Link{}, ErrBadToken
	}
	parts := strings.Split(string(raw), "|")
	if len(parts) != 4 || parts[0] != tokenVersion {
		return Link{}, ErrBadToken
	}
	l := Link{Tenant: parts[1], Category: parts[2], Subject: parts[3]}
	if tasks.CheckTenant(l.Tenant) != nil || tasks.CheckCategory(l.Category) != nil || l.Subject == "" {
		return Link{}, ErrBadToken
	}
	return l, nil
}

// URL is the one-click link of l under base (SLUICE_UNSUBSCRIBE_URL).
func (s *Signer) URL(base string, l Link) (string, error) {
	tok, err := s.Token(l)
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(base, "/") + Path + tok, nil
}
