package throttle

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Fencing a send held in process for its slot. A worker admitted for a
// slot ahead holds the task until it (worker: waitForSlot); if that worker
// stops answering, another takes the task over (internal/orphans), and
// either may be the one to act. The record decides, with one
// compare-and-set each:
//
//   - Claim, by the holder just before its send (or before it gives the
//     slot back): "a<k>:<ms>:<nonce>" becomes "a<k>:<ms>:<nonce>!". From
//     then on the admission is the holder's: no takeover succeeds, and a
//     re-run meets an unknown outcome as before.
//   - TakeOver, by the sweeper: the unclaimed "a<k>:<ms>:<nonce>" becomes
//     the booking "b<k>:<ms>:<nonce>~", whose entries stay in every window.
//     The task's re-run (another nonce) takes that booking back and is
//     placed again at the earliest slot every rule allows — the same
//     instant when it is still ahead, never later than a booking would be —
//     as the same attempt: no fresh slot, no unknown outcome. The holder's
//     Claim then fails: it neither sends nor gives anything back.
//
// Each succeeds only on the other's absence, so of a holder and any number
// of sweepers exactly one acts on an admission.

// claimScript: KEYS[1] the record; ARGV[1] attempt, ARGV[2] nonce.
// Returns 1 claimed (now or before), 0 not the holder's any more.
var claimScript = redis.NewScript(`
local st = redis.call('GET', KEYS[1])
if not st then return 0 end
local k, t, who = string.match(st, '^a(%d+):(%-?%d+):(.*)$')
if k ~= ARGV[1] then return 0 end
if who == ARGV[2] .. '!' then return 1 end
if who ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], 'a' .. k .. ':' .. t .. ':' .. ARGV[2] .. '!', 'KEEPTTL')
return 1
`)

// takeOverScript: KEYS[1] the record; ARGV[1] attempt, ARGV[2] nonce.
// Returns 1 taken over, 0 not (claimed, done, released, taken before).
var takeOverScript = redis.NewScript(`
local st = redis.call('GET', KEYS[1])
if not st then return 0 end
local k, t, who = string.match(st, '^a(%d+):(%-?%d+):(.*)$')
if k ~= ARGV[1] or who ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[1], 'b' .. k .. ':' .. t .. ':' .. ARGV[2] .. '~', 'KEEPTTL')
return 1
`)

// QueueClaim queues on p the holder's claim of id's admission (attempt,
// the nonce of the run that was admitted): its result says whether the
// admission is still the holder's (false: taken over).
func (l *Limiter) QueueClaim(ctx context.Context, p redis.Pipeliner, group, id string, attempt int, nonce string) func() (bool, error) {
	cmd := claimScript.Eval(ctx, p, []string{l.StateKey(group, id)}, strconv.Itoa(attempt), nonce)
	return func() (bool, error) {
		n, err := cmd.Int()
		if err != nil {
			return false, fmt.Errorf("throttle: claim: %w", err)
		}
		return n == 1, nil
	}
}

// Claim is QueueClaim in a round trip of its own.
func (l *Limiter) Claim(ctx context.Context, group, id string, attempt int, nonce string) (bool, error) {
	n, err := claimScript.Run(ctx, l.client, []string{l.StateKey(group, id)}, strconv.Itoa(attempt), nonce).Int()
	if err != nil {
		return false, fmt.Errorf("throttle: claim: %w", err)
	}
	return n == 1, nil
}

// TakeOver turns id's unclaimed admission (attempt, nonce) into a booking
// for the task's re-run: true when it did.
func (l *Limiter) TakeOver(ctx context.Context, group, id string, attempt int, nonce string) (bool, error) {
	n, err := takeOverScript.Run(ctx, l.client, []string{l.StateKey(group, id)}, strconv.Itoa(attempt), nonce).Int()
	if err != nil {
		return false, fmt.Errorf("throttle: take over: %w", err)
	}
	return n == 1, nil
}
