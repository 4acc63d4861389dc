// Package scripts embeds the Lua that Redis runs for Sluice's limiter and
// its delivery records.
//
// Each script's KEYS/ARGV/return contract is written at the top of its .lua
// file, so a file can be read, linted and run with `redis-cli --eval` on its
// own. The scripts are wrapped in [redis.Script], whose Run uses EVALSHA and
// falls back to EVAL when the server does not have the script cached.
package scripts

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

//go:embed limiter.lua
var limiterSrc string

// Limiter runs a batch of limiter operations — reserve, done, release,
// usage — each atomic, all on one clock reading (limiter.lua).
var Limiter = redis.NewScript(limiterSrc)

//go:embed delivery.lua
var deliverySrc string

// Delivery records a message's delivery status as its provider reports
// it, moving only forward (delivery.lua).
var Delivery = redis.NewScript(deliverySrc)

//go:embed series.lua
var seriesSrc string

// Series reads how one limiter window filled over a span, step by step,
// on one clock reading (series.lua). It writes nothing.
var Series = redis.NewScript(seriesSrc)
