// Package scripts embeds the Lua that Redis runs for Sluice's limiter and
// its delivery records.
//
// Each script's KEYS/ARGV/return contract is written at the top of its .lua
// file, so a file can be read and linted on its own. The scripts are
// wrapped in [redis.Script], whose Run uses EVALSHA and falls back to EVAL
// when the server does not have the script cached; limiter.lua, the one on
// every send's path, is also a [Library]: a Redis function where there are
// functions.
package scripts

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"

	"github.com/redis/go-redis/v9"
)

//go:embed limiter.lua
var limiterSrc string

// Limiter runs a batch of limiter operations — reserve, done, release,
// usage — each atomic, all on one clock reading (limiter.lua), as a Redis
// function where the server has functions, else as a script.
var Limiter = newLibrary("sluice_limiter", limiterSrc)

// Library is a Lua file that defines main(keys, argv) and runs two ways.
// As a function library (Redis 7's FUNCTION LOAD, then FCALL Name) its
// definitions are made once, when it loads: a call runs main alone, which
// saves the limiter's 12–14 µs of Redis CPU per call that defining its
// functions again costs a script (measured: EVALSHA of limiter.lua with no
// operation 14–16 µs, of "return 1" 2.5 µs). As a script (EVALSHA, for
// Redis 6 and miniredis) its last line calls main. Name carries a hash of
// the code, so workers of two versions never call each other's.
type Library struct {
	// Name is the library's and its one function's name.
	Name string
	// Code is the FUNCTION LOAD body: the function runs with the allow-oom
	// flag, which lets it write at maxmemory as the script does once its
	// first write (one Redis never refuses) is made.
	Code string
	// Script runs the file as a script.
	Script *redis.Script
}

func newLibrary(prefix, src string) *Library {
	sum := sha1.Sum([]byte(src))
	name := prefix + "_" + hex.EncodeToString(sum[:6])
	return &Library{
		Name: name,
		Code: "#!lua name=" + name + "\n" + src +
			"\nredis.register_function{function_name='" + name + "', callback=main, flags={'allow-oom'}}\n",
		// KEYS and ARGV are captured first: the file's own locals of those
		// names, which main sets, shadow them below.
		Script: redis.NewScript("local SCRIPT_KEYS, SCRIPT_ARGV = KEYS, ARGV\n" + src + "\nreturn main(SCRIPT_KEYS, SCRIPT_ARGV, true)\n"),
	}
}

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
