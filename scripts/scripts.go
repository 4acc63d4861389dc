// Package scripts embeds the Lua that Redis runs for Sluice's limiter.
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

var (
	//go:embed allow.lua
	allowSrc string
	//go:embed usage.lua
	usageSrc string
	//go:embed release.lua
	releaseSrc string
)

// Allow is the sliding-window-log check-and-add over one or more rules (allow.lua).
var Allow = redis.NewScript(allowSrc)

// Usage is the read-only view of one or more windows (usage.lua).
var Usage = redis.NewScript(usageSrc)

// Release removes a member from the windows it was admitted to (release.lua).
var Release = redis.NewScript(releaseSrc)
