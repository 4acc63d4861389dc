package webhook

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/consent"
)

// Tolerance is how far a delivery's signed timestamp may be from the API's
// clock, either way, for the providers that sign one (SendGrid, Mailgun):
// an older one is refused as stale.
const Tolerance = 5 * time.Minute

// The refusals a Provider's Verify reports; the handler answers each
// without recording anything.
var (
	// ErrUnsigned: the delivery carries no signature or credential (403).
	ErrUnsigned = errors.New("webhook: unsigned delivery")
	// ErrForged: the signature or credential does not match (403).
	ErrForged = errors.New("webhook: signature does not match")
	// ErrStale: the signed timestamp is outside the tolerance (403).
	ErrStale = errors.New("webhook: stale delivery")
	// ErrNotAllowed: signed, but not by what the tenant configured (another
	// SNS topic, a client address outside the allowlist) (403).
	ErrNotAllowed = errors.New("webhook: sender not allowed for this tenant")
	// ErrMalformed: verified, but not a delivery the provider documents (400).
	ErrMalformed = errors.New("webhook: malformed delivery")
	// ErrUnavailable: what the check needs could not be had now (the
	// signing certificate could not be fetched); the provider retries (503).
	ErrUnavailable = errors.New("webhook: check unavailable")
	// ErrCredentials: credentials that cannot be used for the provider.
	ErrCredentials = errors.New("webhook: invalid credentials")
)

// Credentials are what one tenant configured for one provider. Each
// provider uses some of the fields (Provider.Check says which).
type Credentials struct {
	// Key is SendGrid's verification key (base64 of the ECDSA P-256 public
	// key) or Mailgun's HTTP webhook signing key.
	Key string `json:"key,omitempty"`
	// User and Password are the basic-auth credentials Postmark's webhook
	// URL carries.
	User     string `json:"user,omitempty"`
	Password string `json:"password,omitempty"`
	// Topics are the SNS topic ARNs whose messages count for the tenant
	// (SES).
	Topics []string `json:"topics,omitempty"`
	// AllowIPs, when set, are the only client addresses (IPs or CIDR
	// prefixes) a delivery is taken from (Postmark).
	AllowIPs []string `json:"allow_ips,omitempty"`
	// ParentKey is a Mailgun primary account's webhook signing key, which
	// signs its subaccounts' events as parent-signature; Account is the
	// tenant's subaccount id (event-data.account.id), required with it:
	// the primary key signs every subaccount's events.
	ParentKey string `json:"parent_key,omitempty"`
	Account   string `json:"account,omitempty"`
	// PhoneNumberIDs are the WhatsApp business numbers (Cloud API
	// phone-number ids) the tenant owns: a WhatsApp webhook about another
	// number is refused (WhatsApp; Key is then the Meta app's secret).
	PhoneNumberIDs []string `json:"phone_number_ids,omitempty"`
	// VerifyToken answers Meta's verification request of the webhook URL
	// (WhatsApp).
	VerifyToken string `json:"verify_token,omitempty"`
}

// Provider is one provider's wire format and signature scheme.
type Provider interface {
	// Name is the route's segment and the credentials' name: "sendgrid".
	Name() string
	// Check reports why c cannot verify this provider's deliveries (an
	// error wrapping ErrCredentials that names the field), or nil.
	Check(c Credentials) error
	// Verify checks that in comes from the provider account c names and
	// reads it; every refusal wraps one of the errors above.
	Verify(ctx context.Context, in Inbound) (Batch, error)
}

// Inbound is one delivery as the handler read it.
type Inbound struct {
	Request  *http.Request // its header and basic auth; the body is Body
	Body     []byte
	Creds    Credentials
	Now      time.Time
	ClientIP netip.Addr // the client's address (behind SLUICE_API_CLIENT_IP_HEADER's proxy)
}

// Batch is what a verified delivery asks for.
type Batch struct {
	// ReplayID names the delivery for the replay guard (a signature's
	// digest, a token, a message id); "" for none. A delivery whose
	// ReplayID was seen within ReplayTTL records nothing.
	ReplayID  string
	ReplayTTL time.Duration
	// Items are the events, in order; events that Sluice does not record
	// (a soft bounce, an open) are left out by the provider.
	Items []Item
	// Ignored counts the events of the delivery left out.
	Ignored int
	// Confirm, when set, completes a handshake (SNS's subscription
	// confirmation) before the delivery is answered.
	Confirm func(ctx context.Context) error
}

// Item is one event about one recipient.
type Item struct {
	Recipient string
	Report    consent.Report
}

// Fresh reports ErrStale for a signed Unix timestamp (seconds) more than
// tol away from now, and ErrUnsigned for none or one that is not a
// number.
func Fresh(unix string, now time.Time, tol time.Duration) error {
	if unix == "" {
		return ErrUnsigned
	}
	sec, err := strconv.ParseInt(unix, 10, 64)
	if err != nil || sec < 0 || len(unix) > 12 {
		return ErrForged
	}
	return FreshTime(time.Unix(sec, 0), now, tol)
}

// FreshTime reports ErrStale for a signed time more than tol from now.
func FreshTime(at, now time.Time, tol time.Duration) error {
	if d := now.Sub(at); d > tol || d < -tol {
		return ErrStale
	}
	return nil
}

// MaxRefLen bounds a ledger reference (consent.MaxRefLen).
const MaxRefLen = consent.MaxRefLen

// Ref is the ledger reference of a provider's id: "<provider>.<id>", each
// byte the ledger does not take (anything but A-Z a-z 0-9 . _ -) as '_',
// at most MaxRefLen bytes; "" for no id.
func Ref(provider, id string) string {
	if id == "" {
		return ""
	}
	b := []byte(provider + "." + id)
	if len(b) > MaxRefLen {
		b = b[:MaxRefLen]
	}
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	return string(b)
}

// SMTPCode reads the SMTP reply code a provider's bounce text starts with
// ("550 5.1.1 user unknown", "smtp; 550 ..."): a 4xx or 5xx code, 0 when
// there is none (an enhanced status code such as 5.1.1 is not one).
func SMTPCode(s string) int {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, ';'); i >= 0 && i < 16 {
		s = strings.TrimSpace(s[i+1:]) // "smtp; 550 ..."
	}
	if len(s) < 3 || (len(s) > 3 && s[3] != ' ' && s[3] != '-') {
		return 0
	}
	if (s[0] != '4' && s[0] != '5') || s[1] < '0' || s[1] > '9' || s[2] < '0' || s[2] > '9' {
		return 0
	}
	return int(s[0]-'0')*100 + int(s[1]-'0')*10 + int(s[2]-'0')
}
