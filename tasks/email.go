package tasks

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// reservedHeaders are the header fields a notification's Headers may not
// set: those Sluice writes itself (addresses, subject, ids, MIME structure,
// unsubscribe, DKIM, X-Sluice-Tenant) and those only mail systems add
// (trace fields, authentication results). Lowercase.
var reservedHeaders = []string{
	"from", "to", "cc", "bcc", "subject", "message-id", "date", "reply-to", "sender",
	"mime-version", "content-type", "content-transfer-encoding",
	"list-unsubscribe", "list-unsubscribe-post",
	"dkim-signature", "domainkey-signature", "arc-seal", "arc-message-signature", "arc-authentication-results",
	"authentication-results", "received", "received-spf", "return-path", "delivered-to",
}

// reservedPrefixes extend reservedHeaders: every Content-* field (a
// top-level Content-Disposition or Content-ID would change how the body
// is shown), resent trace fields, and Sluice's own X-Sluice-* fields.
var reservedPrefixes = []string{"content-", "resent-", "x-sluice-"}

// ReservedHeader reports whether a notification's Headers may not set the
// field name (case-insensitive): From, To, Cc, Bcc, Subject, Message-ID,
// Date, Reply-To, Sender, MIME-Version, every Content-* field,
// List-Unsubscribe(-Post), DKIM-Signature and the other signatures and
// authentication results, Received, Return-Path, Delivered-To, Resent-*,
// and X-Sluice-*.
func ReservedHeader(name string) bool {
	lower := strings.ToLower(name)
	if slices.Contains(reservedHeaders, lower) {
		return true
	}
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(lower, p) {
			return true
		}
	}
	return false
}

// validateEmailExtras checks the email-only fields: HTML, ReplyTo, Headers
// and ListUnsubscribe. Body has been checked.
func (n Notification) validateEmailExtras() error {
	if n.HTML != "" {
		if !utf8.ValidString(n.HTML) {
			return invalid("html", "is not valid UTF-8")
		}
		if strings.TrimSpace(n.HTML) == "" {
			return invalid("html", "is blank (leave it out for a text-only email)")
		}
		if total := len(n.Body) + len(n.HTML); total > MaxEmailBodyBytes {
			return invalid("html", fmt.Sprintf("and body are %d bytes together, over the %d-byte limit", total, MaxEmailBodyBytes))
		}
	}
	if n.ReplyTo != "" {
		if err := checkAddress("reply_to", n.ReplyTo); err != nil {
			return err
		}
	}
	if err := checkHeaders(n.Headers); err != nil {
		return err
	}
	if n.ListUnsubscribe != "" {
		if _, err := ParseListUnsubscribe(n.ListUnsubscribe); err != nil {
			return err
		}
	}
	return nil
}

// checkHeaders validates a notification's custom headers; errors name the
// field "headers" and the entry's name as their Key.
func checkHeaders(h map[string]string) error {
	if len(h) > MaxHeaders {
		return invalid("headers", fmt.Sprintf("has %d entries, over %d", len(h), MaxHeaders))
	}
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names) // the same input always gives the same error
	seen := make(map[string]string, len(h))
	for _, name := range names {
		if why := checkFieldName(name); why != "" {
			return invalidEntry("headers", name, why)
		}
		lower := strings.ToLower(name)
		if other, dup := seen[lower]; dup {
			return invalidEntry("headers", name, fmt.Sprintf("and %q are the same header (names are case-insensitive)", other))
		}
		seen[lower] = name
		if ReservedHeader(name) {
			return invalidEntry("headers", name, "is a header Sluice sets or only a mail system may add; it cannot be set or overridden")
		}
		if why := checkHeaderValue(h[name]); why != "" {
			return invalidEntry("headers", name, why)
		}
	}
	return nil
}

// checkFieldName says why name is not an RFC 5322 field name (1*ftext:
// printable ASCII but ':') made only of token characters (letters, digits
// and !#$%&'*+-.^_`|~), the subset parsers such as Go's net/mail accept: a
// name with '(' or '"' is valid RFC 5322 and still makes them refuse the
// whole message. "" when it is one.
func checkFieldName(name string) string {
	if name == "" || len(name) > MaxHeaderNameLen {
		return fmt.Sprintf("name must be 1–%d characters", MaxHeaderNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return "name is not a header field name (letters, digits and !#$%&'*+-.^_`|~ only)"
		}
	}
	return ""
}

// checkHeaderValue says why a value could break out of its header field
// (CR, LF, NUL, any other control character but tab, the Unicode line and
// paragraph separators) or is unusable; "" when it is fine.
func checkHeaderValue(v string) string {
	if len(v) > MaxHeaderValueLen {
		return fmt.Sprintf("value is %d bytes, over %d", len(v), MaxHeaderValueLen)
	}
	if !utf8.ValidString(v) {
		return "value is not valid UTF-8"
	}
	if strings.TrimSpace(v) == "" {
		return "value is empty"
	}
	for _, r := range v {
		if r != '\t' && (unicode.IsControl(r) || r == '\u2028' || r == '\u2029') {
			return "value contains a line break or control character (header injection)"
		}
	}
	return ""
}

// Unsubscribe is a parsed Notification.ListUnsubscribe: at most one https
// URL and one mailto: URI, as given.
type Unsubscribe struct {
	HTTPS  string // "" or an https:// URL
	Mailto string // "" or a mailto: URI
}

// OneClick reports whether the notification offers RFC 8058 one-click
// unsubscribe (it has an https URL): List-Unsubscribe-Post is sent then.
func (u Unsubscribe) OneClick() bool { return u.HTTPS != "" }

// URIs returns the URIs in the order List-Unsubscribe lists them: https first.
func (u Unsubscribe) URIs() []string {
	var out []string
	for _, s := range []string{u.HTTPS, u.Mailto} {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

// ParseListUnsubscribe parses the list_unsubscribe field: an https URL, a
// mailto: URI, or one of each separated by a comma. Every error wraps
// ErrInvalid and names the field.
func ParseListUnsubscribe(s string) (Unsubscribe, error) {
	var u Unsubscribe
	if len(s) > MaxListUnsubscribeLen {
		return u, invalid("list_unsubscribe", fmt.Sprintf("is %d bytes, over %d", len(s), MaxListUnsubscribeLen))
	}
	parts := strings.Split(s, ",")
	if len(parts) > 2 {
		return u, invalid("list_unsubscribe", "has more than two URIs: give one https URL, one mailto: URI, or one of each separated by a comma (percent-encode a comma inside a URI as %2C)")
	}
	for _, p := range parts {
		p = strings.TrimSpace(p)
		if p == "" {
			return u, invalid("list_unsubscribe", "has an empty URI")
		}
		for i := 0; i < len(p); i++ {
			if !isURIChar(p[i]) {
				return u, invalid("list_unsubscribe", fmt.Sprintf("%q has a character not allowed in a URI (percent-encode it)", p))
			}
		}
		parsed, err := url.Parse(p)
		if err != nil {
			return u, invalid("list_unsubscribe", fmt.Sprintf("%q is not a URI", p))
		}
		switch parsed.Scheme {
		case "https":
			if u.HTTPS != "" {
				return u, invalid("list_unsubscribe", "has two https URLs; give one")
			}
			if parsed.Host == "" || parsed.User != nil || parsed.Opaque != "" || parsed.Hostname() == "" {
				return u, invalid("list_unsubscribe", fmt.Sprintf("%q is not an https URL with a host (and no user info)", p))
			}
			u.HTTPS = p
		case "mailto":
			if u.Mailto != "" {
				return u, invalid("list_unsubscribe", "has two mailto: URIs; give one")
			}
			addr, err := url.PathUnescape(parsed.Opaque)
			if err != nil || parsed.Opaque == "" {
				return u, invalid("list_unsubscribe", fmt.Sprintf("%q is not a mailto: URI with one address", p))
			}
			if err := checkAddress("list_unsubscribe", addr); err != nil {
				return u, err
			}
			u.Mailto = p
		case "http":
			return u, invalid("list_unsubscribe", "http URLs are refused: use https (RFC 8058 one-click needs it)")
		default:
			return u, invalid("list_unsubscribe", fmt.Sprintf("%q is neither an https URL nor a mailto: URI", p))
		}
	}
	return u, nil
}

// isURIChar reports whether c may appear in a URI as RFC 3986 writes it
// (unreserved, reserved, '%'), a comma aside: it separates the URIs.
func isURIChar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("-._~:/?#[]@!$&'()*+;=%", c) >= 0
}
