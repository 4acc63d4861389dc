package unsubscribe_test

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/unsubscribe"
)

// A token round-trips; any change to it, a token made under another
// secret, and garbage are refused with ErrBadToken.
func TestTokenRoundTripAndForgeries(t *testing.T) {
	s, err := unsubscribe.NewSigner("unsubscribe-test-secret-0123")
	if err != nil {
		t.Fatal(err)
	}
	l := unsubscribe.Link{Tenant: "acme.eu", Category: "newsletter", Subject: "c2VjcmV0aGFzaA"}
	tok, err := s.Token(l)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Parse(tok)
	if err != nil || got != l {
		t.Fatalf("Parse(Token(l)) = %+v, %v", got, err)
	}
	other, _ := unsubscribe.NewSigner("another-secret-0123456789")
	forged, _ := other.Token(l)
	bad := []string{"", ".", tok + "x", "x" + tok, strings.Replace(tok, ".", "..", 1), forged, tok[:len(tok)-2]}
	for i := range len(tok) {
		flipped := []byte(tok)
		flipped[i] ^= 1
		bad = append(bad, string(flipped))
	}
	for _, b := range bad {
		if _, err := s.Parse(b); err == nil {
			t.Errorf("%q accepted", b)
		}
	}
	if _, err := unsubscribe.NewSigner("short"); err == nil {
		t.Error("a short secret accepted")
	}
}

// Any string is a valid token or ErrBadToken, never a panic; a token that
// parses names a valid tenant and category.
func FuzzParseToken(f *testing.F) {
	s, _ := unsubscribe.NewSigner("unsubscribe-test-secret-0123")
	tok, _ := s.Token(unsubscribe.Link{Tenant: "acme", Category: "promo", Subject: "abc"})
	for _, seed := range []string{tok, "", ".", "MXxhfGJ8Yw.AAAA", tok + "="} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, token string) {
		l, err := s.Parse(token)
		if err != nil {
			return
		}
		if _, err := s.Token(l); err != nil {
			t.Fatalf("%q parsed into %+v, which does not sign: %v", token, l, err)
		}
	})
}
