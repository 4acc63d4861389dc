// Package scripts embeds the Lua that Redis runs for Sluice's limiter, its
// consent rule and its delivery records.
//
// Each script's KEYS/ARGV/return contract is written at the top of its .lua
// file, so a file can be read and linted on its own. The scripts are
// wrapped in [redis.Script], whose Run uses EVALSHA and falls back to EVAL
// when the server does not have the script cached; the limiter, the one on
// every send's path, is also a [Library]: a Redis function where there are
// functions.
//
// # The limiter in parts
//
// The limiter is one library made of several files: limiter.lua is its
// index, whose include lines ("--#include <file>") name the parts in the
// order they are joined into one chunk, so one FCALL (one clock reading)
// runs a whole batch of operations as before. The parts are the prelude
// (the KEYS/ARGV readers), the consent rule (consent.lua), a sliding log's
// and a counter rule's earliest fit, the search across rules, one file per
// operation, and main, which reads the clock and dispatches. The ten
// operations, by opcode:
//
//   - R reserve (op_reserve.lua): admit a send now or for an instant just
//     ahead, book a later slot, or deny, drop, expire or block it.
//   - P place (op_place.lua): put a send in a check's limits outside its
//     own group (Redis Cluster).
//   - D done (op_done.lua): record an attempt's send as completed.
//   - X release (op_release.lua): give an attempt's slot back.
//   - S state (op_state.lua): read a send's record.
//   - U usage (op_usage.lua): read how full each rule is.
//   - H hold (op_hold.lua): hold a scope (a provider's back-pressure).
//   - L lease (op_lease.lua): take in-flight slots.
//   - F free (op_free.lua): give in-flight slots back.
//   - B breaker (op_breaker.lua): a provider's circuit breaker (failover).
//
// Each op_*.lua opens with its KEYS/ARGV/return contract; throttle encodes
// each operation with one Go encoder, checked against that header by a test.
package scripts

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"strings"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

// Limiter runs a batch of limiter operations (the ten above), each
// atomic, all on one clock reading, as a Redis function where the server
// has functions, else as a script: limiter.lua and the files it includes.
var Limiter = newLibrary("sluice_limiter", join("limiter.lua"))

// ConsentCheckSource is consent_check.lua with consent.lua joined in: the
// consent rule the limiter's reserve applies, run on its own (its KEYS/ARGV
// contract is at its top).
var ConsentCheckSource = join("consent_check.lua")

// ConsentCheck runs ConsentCheckSource: whether a send of one category to
// one recipient is blocked by the recipient's suppression hash.
var ConsentCheck = redis.NewScript(ConsentCheckSource)

// includePrefix starts a line that join replaces with the file it names.
const includePrefix = "--#include "

// join returns the embedded Lua file name with each include line replaced
// by the file it names (which may include none itself): several files run
// as one chunk. A missing file panics: the files are embedded, so any test
// of a package that uses them finds it.
func join(name string) string {
	var b strings.Builder
	for line := range strings.Lines(read(name)) {
		rest, ok := strings.CutPrefix(line, includePrefix)
		if !ok {
			b.WriteString(line)
			continue
		}
		part := read(strings.Fields(rest)[0])
		if strings.Contains(part, "\n"+includePrefix) || strings.HasPrefix(part, includePrefix) {
			panic("scripts: " + strings.Fields(rest)[0] + ", included by " + name + ", includes another file")
		}
		b.WriteString(part)
		if !strings.HasSuffix(part, "\n") {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func read(name string) string {
	src, err := files.ReadFile(name)
	if err != nil {
		panic("scripts: " + err.Error())
	}
	return string(src)
}

// Library is Lua that defines main(keys, argv) and runs two ways.
// As a function library (Redis 7's FUNCTION LOAD, then FCALL Name) its
// definitions are made once, when it loads: a call runs main alone, which
// saves the limiter's 12–14 µs of Redis CPU per call that defining its
// functions again costs a script (measured: EVALSHA of the limiter with no
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
	// Script runs the same code as a script.
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

//go:embed digest.lua
var digestSrc string

// Digest joins and closes digests: the items of one message that carries
// several deferred notifications (digest.lua).
var Digest = redis.NewScript(digestSrc)

//go:embed series.lua
var seriesSrc string

// Series reads how one limiter window filled over a span, step by step,
// on one clock reading (series.lua). It writes nothing.
var Series = redis.NewScript(seriesSrc)
