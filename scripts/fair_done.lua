-- fair_done.lua — Asynq's completion of several tasks of one queue in one call: what Asynq's
-- own done script (asynq v0.26, rdb.Done, for a task without a uniqueness lock) writes for one
-- task, for each of them — out of the active list and the lease set, its hash deleted, counted
-- processed — with the counters written once for all. internal/completer collects the worker's
-- completions for as long as the previous call is on the wire and sends them together.
--
-- KEYS[1] -> asynq:{Q}:active
-- KEYS[2] -> asynq:{Q}:lease
-- KEYS[3] -> asynq:{Q}:processed:<yyyy-mm-dd>
-- KEYS[4] -> asynq:{Q}:processed
-- ARGV[1] -> the daily counter's expiry, Unix seconds (Asynq's: now + its stats TTL)
-- ARGV[2] -> the largest int64 (Asynq starts the total again at 1 past it)
-- ARGV[3] -> the task key prefix, asynq:{Q}:t:
-- ARGV[4..] -> the tasks' ids
--
-- Returns one integer per id, in order: 1 completed; 0 not found (no longer active, leased or
-- stored: Asynq's done answers NOT FOUND, and stops where it found it missing, as here).
local out, n = {}, 0
for i = 4, #ARGV do
  local id = ARGV[i]
  local ok = 0
  if redis.call('LREM', KEYS[1], 0, id) ~= 0 and redis.call('ZREM', KEYS[2], id) ~= 0
      and redis.call('DEL', ARGV[3] .. id) ~= 0 then
    ok = 1
    n = n + 1
  end
  out[#out + 1] = ok
end
if n > 0 then
  if redis.call('INCRBY', KEYS[3], n) == n then
    redis.call('EXPIREAT', KEYS[3], ARGV[1])
  end
  local total = tonumber(redis.call('GET', KEYS[4]) or '0')
  if total > tonumber(ARGV[2]) - n then
    redis.call('SET', KEYS[4], n)
  else
    redis.call('INCRBY', KEYS[4], n)
  end
end
return out
