package api

// The states of a notification, as GET /v1/notifications/{id} reports them.
const (
	StateQueued   = "queued"   // waiting for a worker, nothing in its way
	StateWaiting  = "waiting"  // held back: a quota's slot, quiet hours, a retry, Redis away
	StateSending  = "sending"  // a worker has it
	StateSent     = "sent"     // the provider took it
	StateArchived = "archived" // will not be sent; Reason says why
	StateUnknown  = "unknown"  // admitted for sending but no record of the outcome
	StateDigested = "digested" // carried by a digest (Digest names its carrier); the digest's own state tells its fate

	// What the provider reported later (SMS status callbacks).
	StateDelivered   = "delivered"   // the recipient's handset has it
	StateUndelivered = "undelivered" // the carrier could not deliver it; ErrorCode says why
	StateFailed      = "failed"      // the provider could not send it; ErrorCode says why
)
