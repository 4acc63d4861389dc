package tasks

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/mail"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Channel is how a notification is delivered.
type Channel string

// The channels Sluice delivers on.
const (
	Email    Channel = "email"
	SMS      Channel = "sms"
	WhatsApp Channel = "whatsapp"
)

// Task types, one per channel.
const (
	TypeEmail    = "notify:email"
	TypeSMS      = "notify:sms"
	TypeWhatsApp = "notify:whatsapp"
)

// Bounds on a notification. Anything past them is rejected, never truncated.
const (
	MaxIDLen          = 64
	MaxTenantLen      = 64
	MaxEmailLen       = 254
	MaxSubjectLen     = 998 // RFC 5322 line length
	MaxEmailBodyBytes = 256 << 10
	MaxSMSRunes       = 1600 // 10 concatenated segments
	MaxMetadata       = 32
	MaxMetaKeyLen     = 64
	MaxMetaValueLen   = 512
	MaxPayloadBytes   = MaxEmailBodyBytes + 64<<10
	// Custom email headers (Notification.Headers): a value of 900 bytes and
	// a name of 64 keep even an unfoldable field within RFC 5322's 998-byte line.
	MaxHeaders        = 16
	MaxHeaderNameLen  = 64
	MaxHeaderValueLen = 900
	// MaxListUnsubscribeLen keeps List-Unsubscribe on one 998-byte line.
	MaxListUnsubscribeLen = 900
)

var (
	// ErrInvalid reports a notification that can never be sent as it is:
	// a bad address or number, a header with CR/LF, an oversize body, ...
	ErrInvalid = errors.New("invalid notification")
	// ErrUnknownChannel reports a channel other than email, sms or whatsapp.
	ErrUnknownChannel = errors.New("unknown channel")
)

// Notification is one message to one recipient: the payload of a Sluice task.
type Notification struct {
	// ID is the notification's stable id: the task id, the limiter member,
	// the dedupe key and the Message-ID. Default: NewID, a new UUIDv7 in 32
	// hex digits. 1–64 of [A-Za-z0-9._-].
	ID string `json:"id"`
	// Tenant owns the notification and its quotas. 1–64 of [A-Za-z0-9._-].
	Tenant string `json:"tenant"`
	// Channel is email, sms or whatsapp.
	Channel Channel `json:"channel"`
	// To is an RFC 5322 address (email) or an E.164 number (sms, whatsapp).
	To string `json:"to"`
	// From overrides the worker's default sender (an address, or an SMS
	// number / sender id). Optional.
	From string `json:"from,omitempty"`
	// MessagingServiceSID sends the SMS through a Twilio Messaging Service
	// (the provider picks the number from the service's sender pool) instead
	// of from a number: "MG" and 32 hex digits. It overrides the worker's
	// default sender and cannot be combined with From; the service is also
	// the sender that sender rules count. Optional; sms only.
	MessagingServiceSID string `json:"messaging_service_sid,omitempty"`
	// Subject of an email; required for email, empty for sms.
	Subject string `json:"subject,omitempty"`
	// Body is the email's text body or the SMS text.
	Body string `json:"body"`
	// TemplateID names the template the body was rendered from. Optional.
	TemplateID string `json:"template_id,omitempty"`
	// Metadata is free-form, kept with the task for tracing. Optional.
	Metadata map[string]string `json:"metadata,omitempty"`
	// HTML is an optional HTML body beside Body. With it the email is sent as
	// multipart/alternative: Body is the text/plain part and stays required
	// (Sluice does not derive text from HTML), HTML the text/html part, sent
	// as given: Sluice neither sanitises nor rewrites it. Body and HTML
	// together are at most MaxEmailBodyBytes. Email only.
	HTML string `json:"html,omitempty"`
	// ReplyTo is the bare RFC 5322 address replies go to (the Reply-To
	// header). Optional; email only.
	ReplyTo string `json:"reply_to,omitempty"`
	// Headers are extra header fields of the email, name → value: at most
	// MaxHeaders; names 1–MaxHeaderNameLen RFC 5322 field-name characters,
	// limited to letters, digits and !#$%&'*+-.^_`|~ (what common parsers
	// accept), no two differing only in case; values
	// 1–MaxHeaderValueLen bytes of UTF-8 without control characters (tab
	// aside), sent RFC 2047-encoded when not ASCII. Fields that Sluice sets,
	// that name the sender, route or MIME structure, or that only a mail
	// system may add are refused (see ReservedHeader). Optional; email only.
	Headers map[string]string `json:"headers,omitempty"`
	// ListUnsubscribe is how the recipient unsubscribes: an https URL, a
	// mailto: URI, or one of each separated by a comma
	// ("https://example.com/u/TOKEN, mailto:unsub@example.com?subject=TOKEN"),
	// at most MaxListUnsubscribeLen bytes of URI characters (percent-encode
	// a comma). It is sent as List-Unsubscribe: <https://…>, <mailto:…>, and
	// with an https URL also List-Unsubscribe-Post: List-Unsubscribe=One-Click
	// (RFC 8058 one-click: the URL must unsubscribe on a POST without further
	// steps). Optional; email only.
	ListUnsubscribe string `json:"list_unsubscribe,omitempty"`
	// Category is what kind of message this is — "otp", "transactional",
	// "marketing", …: 1–32 of [a-z0-9_-]. Rules and quiet hours can target a
	// category; empty means DefaultCategory.
	Category string `json:"category,omitempty"`
	// User is the producer's id for the person the notification is for
	// ("user-8812"), whatever the channel: user rules
	// ("*.marketing:user=3/1d") count a person's sends across channels in
	// one window. The limiter's keys hold it keyed-hashed, as they hold
	// recipients. Optional: user rules do not count a notification without
	// one. 1–MaxUserLen bytes of printable ASCII without spaces.
	User string `json:"user,omitempty"`
	// ExpiresAt is the send-by time: the notification is never sent after
	// it (it is archived as expired). Zero: no expiry.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// TZ is the recipient's IANA time zone (e.g. "America/New_York"), for
	// quiet hours; empty: guessed from the number, else the default zone.
	TZ string `json:"tz,omitempty"`
	// EnqueuedAt is when the notification was first enqueued (set by
	// NewTask); the maximum deferral counts from it.
	EnqueuedAt time.Time `json:"enqueued_at,omitzero"`
	// Fallback is sent instead when the notification cannot reach its
	// recipient on its own channel (see Fallback). Optional.
	Fallback *Fallback `json:"fallback,omitempty"`
	// FallbackFor is set on a fallback (FallbackOf): the id of the
	// notification it stands in for. Producers leave it empty.
	FallbackFor string `json:"fallback_for,omitempty"`
	// FallbackOnTimeout is set on a fallback whose notification had an
	// After: it goes when no report called that one delivered by then.
	FallbackOnTimeout bool `json:"fallback_on_timeout,omitempty"`
	// Template is a WhatsApp template message (an approved template, its
	// language and parameters); without it a WhatsApp notification is a
	// free-form text (Body), which WhatsApp delivers only inside the
	// customer-service window. Optional; whatsapp only.
	Template *Template `json:"template,omitempty"`
}

// DefaultCategory is the category of a notification that names none.
const DefaultCategory = "default"

// CategoryOrDefault returns the notification's category, DefaultCategory when empty.
func (n Notification) CategoryOrDefault() string {
	if n.Category == "" {
		return DefaultCategory
	}
	return n.Category
}

// NewEmail returns an email notification with a new UUIDv7 id.
func NewEmail(tenant, to, subject, body string) Notification {
	return Notification{ID: NewID(), Tenant: tenant, Channel: Email, To: to, Subject: subject, Body: body}
}

// NewSMS returns an SMS notification with a new UUIDv7 id.
func NewSMS(tenant, to, text string) Notification {
	return Notification{ID: NewID(), Tenant: tenant, Channel: SMS, To: to, Body: text}
}

// NewID returns a new notification id: a UUIDv7 (time-ordered, 74 random
// bits) written as 32 hex digits without hyphens, "0197c5e2a1b27c3d8e4f…".
// Without hyphens because Asynq's web UI (asynqmon) lists a task by its id
// up to the first '-': the hyphenated form shows only the first 8 digits,
// the top of the millisecond clock, which every id of a burst shares.
// Sorting the ids still sorts them by time.
func NewID() string {
	id, err := uuid.NewV7()
	if err != nil { // only when the random source fails
		id = uuid.New()
	}
	return hex.EncodeToString(id[:])
}

// TaskType returns the Asynq task type of a channel.
func (c Channel) TaskType() (string, error) {
	switch c {
	case Email:
		return TypeEmail, nil
	case SMS:
		return TypeSMS, nil
	case WhatsApp:
		return TypeWhatsApp, nil
	}
	return "", fmt.Errorf("%w %q: want email, sms or whatsapp", ErrUnknownChannel, string(c))
}

// Normalized returns a copy with the recipient in canonical form (lowercase
// bare address; E.164 number without separators) and the channel lowercased.
// It does not validate.
func (n Notification) Normalized() Notification {
	n.Channel = Channel(strings.ToLower(strings.TrimSpace(string(n.Channel))))
	switch n.Channel {
	case Email:
		n.To = NormalizeEmail(n.To)
	case SMS, WhatsApp:
		n.To = NormalizePhone(n.To)
	}
	if n.Fallback != nil {
		f := *n.Fallback
		f.Channel = Channel(strings.ToLower(strings.TrimSpace(string(f.Channel))))
		switch f.Channel {
		case Email:
			f.To = NormalizeEmail(f.To)
		case SMS:
			f.To = NormalizePhone(f.To)
		}
		n.Fallback = &f
	}
	return n
}

// NormalizeEmail returns the lowercase bare address of s ("Ann <Ann@X.org>"
// → "ann@x.org"), or s trimmed when it does not parse.
func NormalizeEmail(s string) string {
	if strings.ContainsAny(s, "\r\n") {
		return s
	}
	a, err := mail.ParseAddress(strings.TrimSpace(s))
	if err != nil {
		return strings.TrimSpace(s)
	}
	return strings.ToLower(a.Address)
}

// NormalizePhone drops spaces, dashes, dots and parentheses from s.
func NormalizePhone(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case ' ', '-', '.', '(', ')', '\t':
			return -1
		}
		return r
	}, s)
}

// Validate reports why n cannot be sent as it is; every error wraps ErrInvalid
// or ErrUnknownChannel and names the field. Validate expects a Normalized
// notification.
func (n Notification) Validate() error {
	if err := n.validateBasics(); err != nil {
		return err
	}
	var err error
	switch n.Channel {
	case Email:
		err = n.validateEmail()
	case SMS:
		err = n.validateSMS()
	case WhatsApp:
		err = n.validateWhatsApp()
	}
	if err != nil {
		return err
	}
	if n.Template != nil && n.Channel != WhatsApp {
		return invalid("template", "is for whatsapp only")
	}
	if err := n.validateOptional(); err != nil {
		return err
	}
	return n.validateMetadata()
}

// validateBasics checks what every notification needs: an id, a tenant, a
// known channel and a body of UTF-8 text.
func (n Notification) validateBasics() error {
	if err := checkToken("id", n.ID, MaxIDLen); err != nil {
		return err
	}
	if err := checkToken("tenant", n.Tenant, MaxTenantLen); err != nil {
		return err
	}
	if _, err := n.Channel.TaskType(); err != nil {
		return err
	}
	if err := checkUser(n.User); err != nil {
		return err
	}
	if !utf8.ValidString(n.Body) {
		return invalid("body", "is not valid UTF-8")
	}
	if strings.TrimSpace(n.Body) == "" && !(n.Channel == WhatsApp && n.Template != nil) {
		return invalid("body", "is empty")
	}
	return nil
}

// validateEmail checks an email's recipient, sender, subject and size, and
// its email-only fields.
func (n Notification) validateEmail() error {
	if err := checkAddress("to", n.To); err != nil {
		return err
	}
	if n.MessagingServiceSID != "" {
		return invalid("messaging_service_sid", "is not used for email (sms only)")
	}
	if n.From != "" {
		if err := checkAddress("from", n.From); err != nil {
			return err
		}
	}
	if err := checkHeader("subject", n.Subject, MaxSubjectLen); err != nil {
		return err
	}
	if strings.TrimSpace(n.Subject) == "" {
		return invalid("subject", "is empty (required for email)")
	}
	if len(n.Body) > MaxEmailBodyBytes {
		return invalid("body", fmt.Sprintf("is %d bytes, over the %d-byte limit", len(n.Body), MaxEmailBodyBytes))
	}
	return n.validateEmailExtras()
}

// validateSMS checks an SMS's recipient, sender and length, and that no
// email-only field is set.
func (n Notification) validateSMS() error {
	if !IsE164(n.To) {
		return invalid("to", fmt.Sprintf("%q is not an E.164 number (+ and 7–15 digits)", Mask(n.To)))
	}
	if n.From != "" {
		if err := checkHeader("from", n.From, 32); err != nil {
			return err
		}
	}
	if n.MessagingServiceSID != "" {
		if !IsMessagingServiceSID(n.MessagingServiceSID) {
			return invalid("messaging_service_sid", "must be MG followed by 32 hex digits (a Twilio Messaging Service SID)")
		}
		if n.From != "" {
			return invalid("messaging_service_sid", "cannot be combined with from: the message goes from a number or through a messaging service, not both")
		}
	}
	if n.Subject != "" {
		return invalid("subject", "is not used for sms")
	}
	if c := utf8.RuneCountInString(n.Body); c > MaxSMSRunes {
		return invalid("body", fmt.Sprintf("is %d characters, over the %d-character SMS limit", c, MaxSMSRunes))
	}
	for _, f := range []struct {
		name string
		set  bool
	}{{"html", n.HTML != ""}, {"reply_to", n.ReplyTo != ""}, {"headers", len(n.Headers) > 0}, {"list_unsubscribe", n.ListUnsubscribe != ""}} {
		if f.set {
			return invalid(f.name, "is not used for sms (email only)")
		}
	}
	return nil
}

// validateOptional checks the fields either channel may leave out:
// template_id, category, tz and expires_at.
func (n Notification) validateOptional() error {
	if err := checkHeader("template_id", n.TemplateID, 128); err != nil {
		return err
	}
	if n.Category != "" {
		if err := CheckCategory(n.Category); err != nil {
			return err
		}
	}
	if n.TZ != "" {
		if len(n.TZ) > 64 || strings.ContainsAny(n.TZ, "\r\n") {
			return invalid("tz", "is not an IANA time zone name")
		}
		if _, err := time.LoadLocation(n.TZ); err != nil || n.TZ == "Local" {
			return invalid("tz", fmt.Sprintf("%q is not an IANA time zone name (e.g. America/New_York)", n.TZ))
		}
	}
	if !n.ExpiresAt.IsZero() && !n.EnqueuedAt.IsZero() && !n.ExpiresAt.After(n.EnqueuedAt) {
		return invalid("expires_at", "is not after enqueued_at")
	}
	return n.validateFallback()
}

// validateMetadata checks the number and size of the metadata entries.
func (n Notification) validateMetadata() error {
	if len(n.Metadata) > MaxMetadata {
		return invalid("metadata", fmt.Sprintf("has %d entries, over %d", len(n.Metadata), MaxMetadata))
	}
	for _, k := range slices.Sorted(maps.Keys(n.Metadata)) { // the same input always gives the same error
		if v := n.Metadata[k]; k == "" || len(k) > MaxMetaKeyLen || len(v) > MaxMetaValueLen || !utf8.ValidString(k) || !utf8.ValidString(v) {
			return invalidEntry("metadata", k, fmt.Sprintf("keys are 1–%d bytes, values up to %d bytes, UTF-8", MaxMetaKeyLen, MaxMetaValueLen))
		}
	}
	return nil
}

// CheckCategory reports whether c is a valid category: 1–32 of [a-z0-9_-].
func CheckCategory(c string) error {
	if c == "" || len(c) > 32 {
		return invalid("category", "must be 1–32 characters")
	}
	for i := 0; i < len(c); i++ {
		ch := c[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= '0' && ch <= '9' || ch == '_' || ch == '-') {
			return invalid("category", fmt.Sprintf("%q: only a-z 0-9 _ - are allowed", c))
		}
	}
	return nil
}

// CheckTenant reports whether tenant is a valid tenant id.
func CheckTenant(tenant string) error { return checkToken("tenant", tenant, MaxTenantLen) }

// IsMessagingServiceSID reports whether s is a Twilio Messaging Service
// SID: "MG" followed by 32 hex digits.
func IsMessagingServiceSID(s string) bool {
	if len(s) != 34 || s[:2] != "MG" {
		return false
	}
	for i := 2; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// IsE164 reports whether s is "+" followed by 7 to 15 digits, the first not 0.
func IsE164(s string) bool {
	if len(s) < 8 || len(s) > 16 || s[0] != '+' || s[1] == '0' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// Mask hides most of a recipient for logs: "a***@example.com", "+1415***0100".
func Mask(s string) string {
	if at := strings.LastIndexByte(s, '@'); at > 0 {
		return s[:1] + "***" + s[at:]
	}
	if len(s) > 8 {
		return s[:5] + "***" + s[len(s)-4:]
	}
	return "***"
}

// Encode returns the JSON payload of a valid notification. A payload over
// MaxPayloadBytes (bodies near their limit, inflated by JSON escaping) is
// refused here, as Decode would refuse it in the worker.
func (n Notification) Encode() ([]byte, error) {
	if err := n.Validate(); err != nil {
		return nil, err
	}
	// No HTML escaping: an HTML body would grow by up to 6× (\u003c for <).
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(n); err != nil {
		return nil, fmt.Errorf("tasks: encode: %w", err)
	}
	b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(b) > MaxPayloadBytes {
		return nil, invalid("payload", fmt.Sprintf("encodes to %d bytes, over %d (JSON escaping adds to the bodies)", len(b), MaxPayloadBytes))
	}
	return b, nil
}

// Decode parses and validates a payload. Unknown fields, trailing data, an
// oversize payload and every invalid notification are errors wrapping ErrInvalid.
func Decode(payload []byte) (Notification, error) {
	if len(payload) > MaxPayloadBytes {
		return Notification{}, invalid("payload", fmt.Sprintf("is %d bytes, over %d", len(payload), MaxPayloadBytes))
	}
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.DisallowUnknownFields()
	var n Notification
	if err := dec.Decode(&n); err != nil {
		return Notification{}, invalid("payload", "is not a notification: "+err.Error())
	}
	if dec.More() {
		return Notification{}, invalid("payload", "has data after the notification")
	}
	n = n.Normalized()
	if err := n.Validate(); err != nil {
		return Notification{}, err
	}
	return n, nil
}

func checkToken(field, s string, max int) error {
	if s == "" || len(s) > max {
		return invalid(field, fmt.Sprintf("must be 1–%d characters", max))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return invalid(field, fmt.Sprintf("%q: only A-Z a-z 0-9 . _ - are allowed", s))
		}
	}
	return nil
}

// checkHeader rejects what would break or inject into a message header.
func checkHeader(field, s string, max int) error {
	if len(s) > max {
		return invalid(field, fmt.Sprintf("is %d bytes, over %d", len(s), max))
	}
	if !utf8.ValidString(s) {
		return invalid(field, "is not valid UTF-8")
	}
	for _, r := range s {
		// Every control character but tab: CR, LF, NUL, and the C1 ones
		// (U+0085 NEL is a line break to some mail software).
		if (r != '\t' && unicode.IsControl(r)) || r == '\u2028' || r == '\u2029' {
			return invalid(field, "contains a line break or control character (header injection)")
		}
	}
	return nil
}

// CheckRecipient reports whether to is a recipient of channel ch as a
// notification's To must be: an E.164 number (after NormalizePhone) for
// SMS and WhatsApp, a bare address for email. The error wraps ErrInvalid.
func CheckRecipient(ch Channel, to string) error {
	switch ch {
	case SMS, WhatsApp:
		if !IsE164(NormalizePhone(to)) {
			return invalid("to", "is not an E.164 number like +14155550100")
		}
		return nil
	case Email:
		return checkAddress("to", NormalizeEmail(to))
	}
	_, err := ch.TaskType()
	return err
}

func checkAddress(field, s string) error {
	if err := checkHeader(field, s, MaxEmailLen); err != nil {
		return err
	}
	a, err := mail.ParseAddress(s)
	if err != nil || a.Name != "" || a.Address != s || !strings.Contains(a.Address[strings.LastIndexByte(a.Address, '@')+1:], ".") {
		return invalid(field, fmt.Sprintf("%q is not a bare RFC 5322 address like name@example.com", Mask(s)))
	}
	return nil
}

// injectID returns the JSON object b with "id" set to id.
func injectID(b []byte, id string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	v, err := json.Marshal(id)
	if err != nil {
		return nil, err
	}
	m["id"] = v
	return json.Marshal(m)
}

// The form parameters that name an SMS's origin at a Twilio-compatible API.
const (
	ParamFrom             = "From"
	ParamMessagingService = "MessagingServiceSid"
)

// SMSOrigin is where an SMS goes from: the form parameter (ParamFrom or
// ParamMessagingService) and its value. The notification's own choice wins,
// then the default Messaging Service, then the default number. The value is
// also the sender that sender rules (sms:sender=...) count: for a Messaging
// Service that is the service, whose pool the provider spreads the
// messages over.
func SMSOrigin(n Notification, from, service string) (param, value string) {
	switch {
	case n.MessagingServiceSID != "":
		return ParamMessagingService, n.MessagingServiceSID
	case n.From != "":
		return ParamFrom, n.From
	case service != "":
		return ParamMessagingService, service
	}
	return ParamFrom, from
}

// MaxUserLen bounds Notification.User.
const MaxUserLen = 128

// checkUser checks Notification.User: empty, or 1–MaxUserLen bytes of
// printable ASCII without spaces.
func checkUser(u string) error {
	if len(u) > MaxUserLen {
		return invalid("user", fmt.Sprintf("is %d bytes, over %d", len(u), MaxUserLen))
	}
	for i := 0; i < len(u); i++ {
		if u[i] <= ' ' || u[i] > '~' {
			return invalid("user", fmt.Sprintf("has %q at byte %d: want printable ASCII without spaces", u[i], i))
		}
	}
	return nil
}
