package api

import (
	"regexp"

	"github.com/sluicehq/sluice/tasks"
)

// The recipient forms openapi.yaml states, as the server checks them (a
// test reads the same patterns out of the document): the server is as
// strict as the document, and the document as strict as the server.
const (
	// E164Pattern is an E.164 number: + and 7 to 15 digits.
	E164Pattern = `^\+[1-9][0-9]{6,14}$`
	// EmailPattern is a bare dot-atom address with a dotted domain.
	EmailPattern = "^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$"
	// FromPattern is GET /v1/quotas' from: 1 to 254 printable ASCII characters.
	FromPattern = `^[ -~]{1,254}$`
)

var (
	e164Re  = regexp.MustCompile(E164Pattern)
	emailRe = regexp.MustCompile(EmailPattern)
	fromRe  = regexp.MustCompile(FromPattern)
)

// consentRecipient reports whether s is a recipient of ch as the consent
// routes take it: exactly E.164 for SMS (no spaces or dashes to normalise
// away), a bare address of at most 254 bytes for email.
func consentRecipient(ch tasks.Channel, s string) bool {
	switch ch {
	case tasks.SMS, tasks.WhatsApp:
		return e164Re.MatchString(s)
	case tasks.Email:
		return len(s) <= tasks.MaxEmailLen && emailRe.MatchString(s) && tasks.CheckRecipient(ch, s) == nil
	}
	return false
}

// quotaRecipient reports whether s is GET /v1/quotas' recipient: an E.164
// number or a bare address.
func quotaRecipient(s string) bool {
	return len(s) <= tasks.MaxEmailLen && (e164Re.MatchString(s) || emailRe.MatchString(s))
}
