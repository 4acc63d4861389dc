// Package webhook takes the bounce and complaint reports email providers
// send — Amazon SES (through SNS), SendGrid, Postmark, Mailgun — into the
// consent store, per tenant, exactly as POST /v1/events records them
// (consent.Report: a hard bounce marks the address undeliverable, a
// complaint opts it out, an unsubscribe opts it out, source and the
// provider's reference in the ledger).
//
// Each provider is a package of its own under webhook/ that knows its wire
// format and its signature scheme (a Provider); this package holds what
// they share: the route's handler, the tenants' credentials (Store, in
// Redis, sealed with the payload keys), the replay guard (Guard) and the
// refusal of unsigned, forged and stale deliveries. webhook/providers
// lists the providers and mounts their routes on `sluice api`:
//
//	POST /v1/webhooks/{provider}/{tenant}
//
// # What is refused
//
// Nothing is recorded unless the delivery proves it comes from the
// provider account the tenant configured: a missing signature or
// credential, a wrong one, or a signed timestamp outside the provider's
// tolerance (Tolerance; SNS's is longer, as SNS retries a message with its
// first timestamp) is answered 403 (problem bad-signature) and changes
// nothing. A delivery whose signature was seen before within the tolerance
// (a replay, or the provider retrying after a lost answer) is answered 200
// and records nothing again.
//
// # Where the credentials live
//
// `sluice webhook set TENANT PROVIDER` stores a tenant's verification key,
// password or SNS topics in Redis (one hash per tenant, in its hash slot),
// each value sealed with SLUICE_PAYLOAD_KEYS (AES-256-GCM, bound to the
// tenant and provider), so a tenant is added or a key rotated without
// restarting the API, and a copy of Redis does not hold them in clear.
package webhook
