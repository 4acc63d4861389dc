package scripts

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

//go:embed fair_enqueue.lua
var fairEnqueueSrc string

// FairEnqueue adds notifications to their tenants' waiting rooms in one
// Asynq queue, all or nothing (fair_enqueue.lua).
var FairEnqueue = redis.NewScript(fairEnqueueSrc)

//go:embed fair_refill.lua
var fairRefillSrc string

// FairRefill tops up one Asynq queue's pending list from the waiting
// rooms, tenants served by start-time fair queuing (fair_refill.lua).
var FairRefill = redis.NewScript(fairRefillSrc)

//go:embed fair_waiting.lua
var fairWaitingSrc string

// FairWaiting reads how many notifications wait in one queue's rooms and
// since when the oldest waits (fair_waiting.lua). It writes nothing.
var FairWaiting = redis.NewScript(fairWaitingSrc)
