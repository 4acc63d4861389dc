-- fair_waiting.lua — how many notifications wait in one Asynq queue's waiting rooms, and since
-- when the oldest has waited (fair_enqueue.lua). It writes nothing.
--
-- KEYS[1] -> asynq:{Q}:groups (set: tenants with a group)
-- ARGV[1] -> the group key prefix, asynq:{Q}:g:
--
-- Returns {count, oldest}: the notifications waiting, and the lowest score of any group (when
-- the oldest was enqueued, Unix seconds as a decimal string; "" when none waits).
local count, oldest = 0, nil
for _, tenant in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local group = ARGV[1] .. tenant
  count = count + redis.call('ZCARD', group)
  local head = redis.call('ZRANGE', group, 0, 0, 'WITHSCORES')
  if head[2] and (oldest == nil or tonumber(head[2]) < oldest) then
    oldest = tonumber(head[2])
  end
end
if oldest == nil then
  return {count, ''}
end
return {count, string.format('%.6f', oldest)}
