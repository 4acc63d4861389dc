package keyspace

import "strings"

// DefaultPrefix starts every key of a Space whose Prefix is empty. The
// "1" is the key layout's version: a new layout gets a new prefix, so old
// and new keys never mix.
const DefaultPrefix = "sl1"

// HoldGroup is the group (Cluster hash tag) of provider holds and breakers.
const HoldGroup = "hold"

// SluiceGroup is the group of the limiter-prefixed keys about Sluice
// itself rather than a tenant (the migration marker).
const SluiceGroup = "sluice"

// The kinds of a notification's records beside its state key (Record).
const (
	RecordRecipient     = "to"  // the recipient of an SMS (the check's note)
	RecordDelivery      = "dlv" // its delivery record (delivery.Store)
	RecordFallback      = "fb"  // its pending fallback (delivery.Store)
	RecordProvider      = "prv" // the provider that took it (delivery.Store)
	RecordDigestItems   = "dgi" // a digest carrier's items
	RecordDigestCarrier = "dg"  // an item's carrier
	RecordDigestOpened  = "dgo" // when a carrier's digest opened
)

// Space is the limiter's keyspace: every key of it starts with Prefix
// (DefaultPrefix when empty), then the group as the Cluster hash tag.
type Space struct {
	Prefix string
}

func (s Space) prefix() string {
	if s.Prefix == "" {
		return DefaultPrefix
	}
	return s.Prefix
}

// head is "<prefix>:{<group, escaped>}:" in a builder with room for more.
func (s Space) head(group string, more int) *strings.Builder {
	b := &strings.Builder{}
	b.Grow(len(s.prefix()) + 3*len(group) + 4 + more)
	b.WriteString(s.prefix())
	b.WriteString(":{")
	escapeGroup(b, group)
	b.WriteString("}:")
	return b
}

// escapeGroup writes g with every byte outside [A-Za-z0-9._-] as %XX, so
// a group never closes its hash tag or adds a ':' ("~shared" is "%7Eshared").
func escapeGroup(b *strings.Builder, g string) {
	const hexdig = "0123456789ABCDEF"
	for i := 0; i < len(g); i++ {
		c := g[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexdig[c>>4])
		b.WriteByte(hexdig[c&15])
	}
}

// withSubject ends b with ":" + hashed, unless hashed is empty.
func withSubject(b *strings.Builder, hashed string) string {
	if hashed != "" {
		b.WriteByte(':')
		b.WriteString(hashed)
	}
	return b.String()
}

// Window is the key of a rule's window: <prefix>:{<group>}:<scope>:<window>[:<hashed>],
// window the rule's key part (e.g. "60000", "3600000d", "86400000~24",
// "mo@UTC") and hashed the subject's hash ("" for none).
func (s Space) Window(group, scope, window, hashed string) string {
	b := s.head(group, len(scope)+len(window)+len(hashed)+2)
	b.WriteString(scope)
	b.WriteByte(':')
	b.WriteString(window)
	return withSubject(b, hashed)
}

// Inflight is the key of a concurrency cap's leases:
// <prefix>:{<group>}:<scope>:inflight[:<hashed>].
func (s Space) Inflight(group, scope, hashed string) string {
	b := s.head(group, len(scope)+len(hashed)+10)
	b.WriteString(scope)
	b.WriteString(":inflight")
	return withSubject(b, hashed)
}

// State is the key of a notification's record in group (booked,
// admitted, done): <prefix>:{<group>}:n:<member>, member its id as the
// limiter stores it (hashed under compact members).
func (s Space) State(group, member string) string {
	b := s.head(group, len(member)+2)
	b.WriteString("n:")
	b.WriteString(member)
	return b.String()
}

// Record is the key of another record of a notification, beside its
// state key and in its slot: State(group, member) + ":" + kind (Record*).
func (s Space) Record(group, member, kind string) string {
	return s.State(group, member) + ":" + kind
}

// Subject is the key of a record about a subject of group, beside the
// windows: <prefix>:{<group>}:<kind>:<hashed>. The functions below name
// each kind Sluice writes; this one is for the limiter's callers that
// name their own.
func (s Space) Subject(group, kind, hashed string) string {
	b := s.head(group, len(kind)+len(hashed)+1)
	b.WriteString(kind)
	b.WriteByte(':')
	b.WriteString(hashed)
	return b.String()
}

// Consent is the key of a recipient's suppressions on channel.
func (s Space) Consent(tenant, channel, hashed string) string {
	return s.Subject(tenant, "consent:"+channel, hashed)
}

// Ledger is the key of a recipient's consent ledger on channel.
func (s Space) Ledger(tenant, channel, hashed string) string {
	return s.Subject(tenant, "ledger:"+channel, hashed)
}

// Last is the key of the category last admitted to a recipient on channel.
func (s Space) Last(tenant, channel, hashed string) string {
	return s.Subject(tenant, "last:"+channel, hashed)
}

// Inbound is the key of a recipient's last message to tenant on channel
// (its customer-service window).
func (s Space) Inbound(tenant, channel, hashed string) string {
	return s.Subject(tenant, "inbound:"+channel, hashed)
}

// Once is the key that makes what happen once per recipient for a while.
func (s Space) Once(tenant, what, channel, hashed string) string {
	return s.Subject(tenant, "once:"+what+":"+channel, hashed)
}

// Suppressed is the key of a recipient's entry on delivery's old
// suppression list of channel (what consent migrates).
func (s Space) Suppressed(tenant, channel, hashed string) string {
	return s.Subject(tenant, "suppressed:"+channel, hashed)
}

// SuppressedPattern is the SCAN pattern of every tenant's Suppressed keys
// of channel.
func (s Space) SuppressedPattern(channel string) string {
	return s.prefix() + ":{*}:suppressed:" + channel + ":*"
}

// Migrated is the marker of a completed migration, hashed its name's hash.
func (s Space) Migrated(hashed string) string {
	return s.Subject(SluiceGroup, "migrated:", hashed)
}

// Digest is the key of the digest open for a recipient and digest key
// (hashed together) of channel and category.
func (s Space) Digest(tenant, channel, category, hashed string) string {
	return s.Subject(tenant, "digest:"+channel+"."+category, hashed)
}

// Holds is what every hold and breaker key starts with.
func (s Space) Holds() string { return s.prefix() + ":{" + HoldGroup + "}:" }

// Hold is the key of a hold on scope (e.g. "sms:provider") and, when
// hashed is set, on that subject of it.
func (s Space) Hold(scope, hashed string) string {
	b := &strings.Builder{}
	b.WriteString(s.Holds())
	b.WriteString(scope)
	return withSubject(b, hashed)
}

// breakers starts every breaker key.
func (s Space) breakers() string { return s.Holds() + "breaker:" }

// Breaker is the key of provider's circuit breaker on channel (the
// provider's configured name, not PII, in clear).
func (s Space) Breaker(channel, provider string) string {
	return s.breakers() + channel + ":" + provider
}

// IsBreaker reports whether key is a Breaker key of s.
func (s Space) IsBreaker(key string) bool { return strings.HasPrefix(key, s.breakers()) }

// BreakerOf parses a Breaker key.
func (s Space) BreakerOf(key string) (channel, provider string, ok bool) {
	rest, ok := strings.CutPrefix(key, s.breakers())
	if !ok {
		return "", "", false
	}
	channel, provider, _ = strings.Cut(rest, ":")
	return channel, provider, true
}

// Breakers is the set of the breaker keys that opened and have not closed.
func (s Space) Breakers() string { return s.Holds() + "breakers" }

// ProviderEvents is the pub/sub channel (not a key) of changes of a
// provider's state.
func (s Space) ProviderEvents() string { return s.Holds() + "provider-events" }

// HashTag is group as its keys' Cluster hash tag shows it (between the
// braces): what decides their slot.
func HashTag(group string) string {
	var b strings.Builder
	escapeGroup(&b, group)
	return b.String()
}

// FromSuppressed returns the Consent and Ledger keys of the recipient
// and tenant of old, a Suppressed key of channel (the two share its hash
// tag and HMAC); ok is false when old is not one.
func FromSuppressed(old, channel string) (consent, ledger string, ok bool) {
	sep := "}:suppressed:" + channel + ":"
	i := strings.LastIndex(old, sep)
	if i < 0 {
		return "", "", false
	}
	head, hashed := old[:i], old[i+len(sep):]
	return head + "}:consent:" + channel + ":" + hashed, head + "}:ledger:" + channel + ":" + hashed, true
}
