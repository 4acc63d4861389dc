package keyspace

import "strings"

// Sluice's own keys, under "sluice:".

// Queued returns a tenant's ledger keys of queued notifications (tasks.QueueQuota),
// in its Cluster slot.
func Queued(tenant string) (due, bytes, total string) {
	p := "sluice:queued:{" + tenant + "}:"
	return p + "due", p + "bytes", p + "total"
}

// Idempotency is the key of tenant's record for an Idempotency-Key, given
// the key's hash.
func Idempotency(tenant, hashed string) string {
	return "sluice:api:{" + tenant + "}:idem:" + hashed
}

// NotificationRate returns the keys of an API token's notification rate:
// its log and its sum.
func NotificationRate(tokenID string) (log, sum string) {
	p := "sluice:api:{ntok:" + tokenID + "}:"
	return p + "log", p + "sum"
}

// EndedSession is the key that marks a dashboard session signed out, given
// the hash of its nonce.
func EndedSession(hashed string) string { return "sluice:{api}:ui:ended:" + hashed }

// tokensPrefix starts every Tokens key.
const tokensPrefix = "sluice:{api}:tokens:"

// Token is the key of an API token's record, given the token's HMAC.
func Token(mac string) string { return "sluice:{api}:token:" + mac }

// Tokens is the key of tenant's token ids (hash: id → HMAC).
func Tokens(tenant string) string { return tokensPrefix + tenant }

// TokensPattern is the SCAN pattern of every tenant's Tokens key.
const TokensPattern = tokensPrefix + "*"

// TenantOfTokens parses a Tokens key.
func TenantOfTokens(key string) (string, bool) { return strings.CutPrefix(key, tokensPrefix) }

// The tenant plans (plans.Store).
const (
	PlansTenants = "sluice:{plans}:tenants" // hash: tenant → plan (JSON)
	PlansVersion = "sluice:{plans}:version" // counter of changes
	PlansLog     = "sluice:{plans}:log"     // list of changes, newest first, capped
	// PlansChanged is a pub/sub channel (not a key): a change's version.
	PlansChanged = "sluice:plans:changed"
)

// Webhooks is the key of tenant's webhook credentials.
func Webhooks(tenant string) string { return "sluice:{" + tenant + "}:webhooks" }

// WebhookSeen is the replay guard's key of a provider's event, given the
// hash of its id (the hash tag, spreading them over a Cluster's slots).
func WebhookSeen(provider, hashed string) string {
	return "sluice:webhook-seen:" + provider + ":{" + hashed + "}"
}

// DigestTemplates is the key of the tenants' digest templates.
const DigestTemplates = "sluice:{templates}:digest"

// heldPrefix starts the keys of held sends; "{held}" is their hash tag.
const heldPrefix = "sluice:{held}:"

// Holders lists the holders of sends held for their slots (internal/orphans).
const Holders = heldPrefix + "holders"

// Held is the hash of the sends holder holds.
func Held(holder string) string { return heldPrefix + "h:" + holder }
