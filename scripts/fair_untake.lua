-- fair_untake.lua — puts tasks fair_take.lua took but no processor started back at the head
-- of their queue, as Asynq's requeue (asynq v0.26, rdb.Requeue) puts back a task whose
-- processing was cut short: out of the active list and the lease set, state pending. A worker
-- that stops gives back what it took ahead this way, instead of leaving it to lease expiry.
--
-- KEYS[1] -> asynq:{Q}:pending
-- KEYS[2] -> asynq:{Q}:active
-- KEYS[3] -> asynq:{Q}:lease
-- ARGV[1] -> the task key prefix, asynq:{Q}:t:
-- ARGV[2..] -> the ids, in the order they were taken
--
-- Returns how many were put back (an id no longer active — recovered meanwhile — is left
-- alone).
local n = 0
for i = #ARGV, 2, -1 do
  local id = ARGV[i]
  if redis.call('LREM', KEYS[2], 0, id) > 0 then
    redis.call('ZREM', KEYS[3], id)
    redis.call('RPUSH', KEYS[1], id)
    redis.call('HSET', ARGV[1] .. id, 'state', 'pending')
    n = n + 1
  end
end
return n
