-- fair_take.lua — Asynq's dequeue of up to n tasks of one queue in one call: what Asynq's own
-- dequeue script (asynq v0.26, rdb.Dequeue) writes for one task, for each of them, in the
-- order it would have taken them one call at a time. The fair dispatch (internal/fairq) hands
-- them to the worker's idle processors one by one; each is leased from now on, so a task taken
-- but not yet started when its worker dies is recovered like any leased task.
--
-- KEYS[1] -> asynq:{Q}:pending
-- KEYS[2] -> asynq:{Q}:paused
-- KEYS[3] -> asynq:{Q}:active
-- KEYS[4] -> asynq:{Q}:lease
-- ARGV[1] -> the leases' expiry, Unix seconds (Asynq's: now + its lease duration)
-- ARGV[2] -> the task key prefix, asynq:{Q}:t:
-- ARGV[3] -> n, the most tasks to take (at least 1)
--
-- Returns a flat array id1, msg1, id2, msg2, … of the tasks taken (each msg Asynq's encoded
-- TaskMessage), empty when the queue is paused or empty. An id in the pending list whose task
-- hash has no message (deleted meanwhile) is dropped, not returned.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {}
end
local out, leased = {}, {}
for _ = 1, tonumber(ARGV[3]) do
  local id = redis.call('RPOPLPUSH', KEYS[1], KEYS[3])
  if not id then
    break
  end
  local key = ARGV[2] .. id
  local msg = redis.call('HGET', key, 'msg')
  if msg then
    redis.call('HSET', key, 'state', 'active')
    redis.call('HDEL', key, 'pending_since')
    leased[#leased + 1] = ARGV[1]
    leased[#leased + 1] = id
    out[#out + 1] = id
    out[#out + 1] = msg
  else
    redis.call('LREM', KEYS[3], 1, id)
  end
end
if #leased > 0 then
  redis.call('ZADD', KEYS[4], unpack(leased))
end
return out
