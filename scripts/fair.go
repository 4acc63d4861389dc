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

//go:embed fair_take.lua
var fairTakeSrc string

// FairTake is Asynq's dequeue of up to n tasks of one queue in one call
// (fair_take.lua).
var FairTake = redis.NewScript(fairTakeSrc)

//go:embed fair_untake.lua
var fairUntakeSrc string

// FairUntake puts tasks FairTake took, and no processor started, back at
// the head of their queue (fair_untake.lua).
var FairUntake = redis.NewScript(fairUntakeSrc)

//go:embed fair_done.lua
var fairDoneSrc string

// FairDone is Asynq's completion of several tasks of one queue in one
// call (fair_done.lua).
var FairDone = redis.NewScript(fairDoneSrc)
