-- fair_refill.lua — tops up one Asynq queue's pending list from its tenants' waiting rooms
-- (fair_enqueue.lua), fairly: start-time fair queuing over the tenants with work waiting.
--
-- Each tenant in asynq:{Q}:fair has the virtual start of its next dispatch; the lowest goes
-- next, then starts again 1/weight later. The clock is the start of the last dispatch, and a
-- tenant that arrives (or comes back) starts there: each tenant waits only for its own
-- backlog, and a tenant of weight w gets w times the dispatches of a tenant of weight 1 while
-- both wait. Alone, a tenant gets every dispatch (work-conserving). Within a tenant the
-- group's order is kept (the lowest score first).
--
-- A dispatched task becomes an ordinary pending Asynq task (state pending, pending_since set,
-- its group field dropped), so when it is rescheduled or retried Asynq's forwarder puts it
-- back in the pending list, not in the waiting room: it had its turn.
--
-- KEYS[1] -> asynq:{Q}:pending
-- KEYS[2] -> asynq:{Q}:groups
-- KEYS[3] -> asynq:{Q}:fair
-- KEYS[4] -> asynq:{Q}:fair:clock (deleted when no tenant waits)
-- ARGV[1] -> low: move nothing while the pending list holds at least this many
-- ARGV[2] -> target: otherwise fill the pending list up to this many
-- ARGV[3] -> the task key prefix, asynq:{Q}:t:
-- ARGV[4] -> the group key prefix, asynq:{Q}:g:
-- ARGV[5] -> now, Unix ns (the dispatched tasks' pending_since)
-- ARGV[6..] -> tenant, weight pairs: the tenants whose weight is not 1
--
-- Returns {moved, pending, tenants, weight}: how many tasks it moved, the pending list's length
-- after, how many tenants still wait, and the sum of their weights (a string, decimal).
local low, target = tonumber(ARGV[1]), tonumber(ARGV[2])
local tprefix, gprefix, now = ARGV[3], ARGV[4], ARGV[5]
local weight = {}
for i = 6, #ARGV, 2 do
  weight[ARGV[i]] = tonumber(ARGV[i + 1])
end
local clock = redis.call('GET', KEYS[4]) or '0'

-- Tenants grouped by another producer (Asynq's own AddToGroup) join at the clock.
if redis.call('SCARD', KEYS[2]) ~= redis.call('ZCARD', KEYS[3]) then
  for _, tenant in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    redis.call('ZADD', KEYS[3], 'NX', clock, tenant)
  end
end

local pending = redis.call('LLEN', KEYS[1])
local moved = 0
if pending < low then
  while pending < target do
    -- The tenant with the lowest start, and the next one's: the first takes every dispatch
    -- whose start comes before the second's (ties to the lower name, as ZRANGE orders them),
    -- so its run of dispatches is moved in one go: the order is the one a dispatch at a time
    -- would give, at a few calls a task instead of nine.
    local top = redis.call('ZRANGE', KEYS[3], 0, 1, 'WITHSCORES')
    if #top == 0 then break end
    local tenant, start = top[1], tonumber(top[2])
    local step = 1 / (weight[tenant] or 1)
    local other, until_ = top[3], top[4] and tonumber(top[4]) or math.huge
    local group = gprefix .. tenant
    -- The run's bound: what is asked, what the group holds (target may be huge), and 1,000 a
    -- turn (unpack's limit is 8,000 values).
    local size = redis.call('ZCARD', group)
    local most = math.min(target - pending, size, 1000)
    local starts = {start} -- starts[i]: the start of its i-th dispatch; one more than it runs
    repeat
      local s = starts[#starts] + step
      starts[#starts + 1] = s
    until #starts > most or s > until_ or (s == until_ and tenant > other)
    local run = #starts - 1
    local ids = redis.call('ZRANGE', group, 0, run - 1)
    if #ids > 0 then
      redis.call('ZREM', group, unpack(ids))
      local go = {}
      for _, id in ipairs(ids) do
        -- A task in a group has its group field (fair_enqueue.lua, Asynq's AddToGroup) until
        -- it leaves the group; dropping the field is the test that its hash is still there.
        local task = tprefix .. id
        if redis.call('HDEL', task, 'group') == 1 then
          redis.call('HSET', task, 'state', 'pending', 'pending_since', now)
          go[#go + 1] = id
        end
      end
      if #go > 0 then
        redis.call('LPUSH', KEYS[1], unpack(go))
        pending, moved = pending + #go, moved + #go
      end
      clock = string.format('%.17g', starts[#ids])
    end
    if #ids == size then -- the group is empty now
      redis.call('ZREM', KEYS[3], tenant)
      redis.call('SREM', KEYS[2], tenant)
    else
      redis.call('ZADD', KEYS[3], string.format('%.17g', starts[#ids + 1]), tenant)
    end
  end
end

local tenants = redis.call('ZCARD', KEYS[3])
if tenants == 0 then
  redis.call('DEL', KEYS[4]) -- no one waits: the next to come starts the clock again
elseif moved > 0 then
  redis.call('SET', KEYS[4], clock)
end
local sum = tenants
for tenant, w in pairs(weight) do
  if redis.call('ZSCORE', KEYS[3], tenant) then
    sum = sum + w - 1
  end
end
return {moved, pending, tenants, string.format('%.6f', sum)}
