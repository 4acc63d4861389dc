package tasks

import (
	"fmt"
	"unicode/utf8"
)

// Bounds on a WhatsApp notification, as the Cloud API takes it.
const (
	// MaxWhatsAppTextRunes is the Cloud API's limit on a text message's body.
	MaxWhatsAppTextRunes = 4096
	// MaxTemplateNameLen bounds a template's name: lower-case letters,
	// digits and underscores, as WhatsApp Manager names templates.
	MaxTemplateNameLen = 512
	// MaxTemplateParams bounds a template's body parameters.
	MaxTemplateParams = 32
	// MaxTemplateParamRunes bounds one parameter's text.
	MaxTemplateParamRunes = 1024
)

// Template is a WhatsApp template message: an approved template by name and
// language, with the text parameters of its body ({{1}}, {{2}}, … in order).
// Approval is the sender's business with Meta: Sluice checks the form only.
type Template struct {
	// Name is the template's name: 1–512 of [a-z0-9_].
	Name string `json:"name"`
	// Language is its language code ("en_US", "pt_BR", "de"). Default "en_US".
	Language string `json:"language,omitempty"`
	// Params are the body's parameters, in order: at most
	// MaxTemplateParams, each 1–MaxTemplateParamRunes characters of UTF-8.
	Params []string `json:"params,omitempty"`
}

// LanguageOrDefault is the template's language, "en_US" when empty.
func (t Template) LanguageOrDefault() string {
	if t.Language == "" {
		return "en_US"
	}
	return t.Language
}

// NewWhatsAppTemplate returns a WhatsApp template notification with a new
// UUIDv7 id.
func NewWhatsAppTemplate(tenant, to, name, language string, params ...string) Notification {
	return Notification{ID: NewID(), Tenant: tenant, Channel: WhatsApp, To: to,
		Template: &Template{Name: name, Language: language, Params: params}}
}

// NewWhatsAppText returns a free-form WhatsApp text with a new UUIDv7 id:
// WhatsApp delivers it only inside the recipient's customer-service window
// (24 hours after the recipient's last message to the business).
func NewWhatsAppText(tenant, to, text string) Notification {
	return Notification{ID: NewID(), Tenant: tenant, Channel: WhatsApp, To: to, Body: text}
}

// validateWhatsApp checks a WhatsApp notification: an E.164 recipient (the
// user's WhatsApp number), the business number it goes from, and a
// template or a text, never both; no email or SMS field.
func (n Notification) validateWhatsApp() error {
	if !IsE164(n.To) {
		return invalid("to", fmt.Sprintf("%q is not an E.164 number (+ and 7–15 digits): a WhatsApp user's number", Mask(n.To)))
	}
	if n.From != "" && !isDigits(n.From, 1, 32) {
		return invalid("from", "must be a WhatsApp phone-number id (digits, as Meta's Cloud API numbers them)")
	}
	if n.Subject != "" {
		return invalid("subject", "is not used for whatsapp")
	}
	for _, f := range []struct {
		name string
		set  bool
	}{{"html", n.HTML != ""}, {"reply_to", n.ReplyTo != ""}, {"headers", len(n.Headers) > 0},
		{"list_unsubscribe", n.ListUnsubscribe != ""}, {"messaging_service_sid", n.MessagingServiceSID != ""}} {
		if f.set {
			return invalid(f.name, "is not used for whatsapp")
		}
	}
	if n.Template == nil {
		if c := utf8.RuneCountInString(n.Body); c > MaxWhatsAppTextRunes {
			return invalid("body", fmt.Sprintf("is %d characters, over WhatsApp's %d", c, MaxWhatsAppTextRunes))
		}
		return nil
	}
	if n.Body != "" {
		return invalid("body", "is not used with a template: the template's text and params are the message")
	}
	return n.Template.validate()
}

func (t Template) validate() error {
	if t.Name == "" || len(t.Name) > MaxTemplateNameLen {
		return invalid("template.name", fmt.Sprintf("must be 1–%d characters", MaxTemplateNameLen))
	}
	for i := 0; i < len(t.Name); i++ {
		if c := t.Name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return invalid("template.name", fmt.Sprintf("%q: only a-z 0-9 _ (a WhatsApp template's name)", t.Name))
		}
	}
	if l := t.Language; l != "" && !isLanguage(l) {
		return invalid("template.language", fmt.Sprintf("%q is not a language code like en_US or de", l))
	}
	if len(t.Params) > MaxTemplateParams {
		return invalid("template.params", fmt.Sprintf("has %d parameters, over %d", len(t.Params), MaxTemplateParams))
	}
	for i, p := range t.Params {
		if p == "" || !utf8.ValidString(p) || utf8.RuneCountInString(p) > MaxTemplateParamRunes {
			return invalid("template.params", fmt.Sprintf("parameter %d must be 1–%d characters of UTF-8", i+1, MaxTemplateParamRunes))
		}
	}
	return nil
}

// isLanguage: "de", "en_US", "zh_Hant" style codes.
func isLanguage(s string) bool {
	if len(s) < 2 || len(s) > 12 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' && i >= 2) {
			return false
		}
	}
	return true
}

func isDigits(s string, lo, hi int) bool {
	if len(s) < lo || len(s) > hi {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
