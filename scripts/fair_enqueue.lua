-- fair_enqueue.lua — adds notifications to their tenants' waiting rooms in one Asynq queue
-- (a lane's shard), for the fair dispatch of fair_refill.lua. All or nothing: one script.
--
-- A waiting notification is an Asynq task in its tenant's group (Asynq's aggregating state,
-- which no Asynq server dequeues without a GroupAggregator, and which asynqmon shows under the
-- queue's groups): the task hash asynq:{Q}:t:<id> {msg, state = aggregating, group = tenant},
-- the id in the group's sorted set asynq:{Q}:g:<tenant>, the tenant in asynq:{Q}:groups.
--
-- KEYS[1]   -> asynq:{Q}:groups       (set: tenants with a group)
-- KEYS[2]   -> asynq:{Q}:fair         (sorted set: tenant -> virtual start of its next dispatch)
-- KEYS[3]   -> asynq:{Q}:fair:clock   (string: the virtual time of the last dispatch)
-- KEYS[4]   -> asynq:{Q}:scheduled    (where a held batch waits: see below)
-- KEYS[5..] -> per notification, in order: its task hash, then its tenant's group
-- ARGV[1]   -> number of notifications n
-- ARGV[2]   -> "" to add them to their rooms; or a Unix time in seconds to enqueue them held
--              instead, scheduled until then (Asynq's scheduled set, a batch's: tasks.Batch);
--              or "all" to add them to their rooms all or none: if one id is already
--              enqueued, nothing is written and the reply is empty (Producer.EnqueueAll)
-- ARGV then, per notification: id, tenant, msg (Asynq's encoded TaskMessage), or "" for a
--              task already enqueued held: it is moved from the scheduled set into the room,
--              if it is still there
--
-- The score in a group is the Redis clock in seconds with microseconds, raised past the
-- group's last score when needed, so a tenant's notifications leave in the order they came
-- (Asynq's own AddToGroup scores whole seconds: the two interleave by second).
-- A tenant new to the room starts at the clock: it waits for no one's backlog.
--
-- Returns an array of n integers: 1 added, 0 refused (the id is already enqueued; a held task
-- no longer held); with "all", an empty array when it refused them all.
local n, held = tonumber(ARGV[1]), ARGV[2]
local fresh = false -- every id checked absent already
if held == 'all' then
  for i = 1, n do
    if redis.call('EXISTS', KEYS[2 * i + 3]) == 1 then return {} end
  end
  held, fresh = '', true
end
local now = redis.call('TIME')
local score = tonumber(now[1]) + tonumber(now[2]) / 1000000
local clock = redis.call('GET', KEYS[3]) or '0'
local out = {}
local last_score, entered = {}, {} -- per group: its last score written here; tenants in the room's sets
local adds, groups = {}, {} -- per group: its ZADD's arguments (score, id, ...), sent once at the end; groups in order
for i = 1, n do
  local id, tenant, msg = ARGV[3 * i], ARGV[3 * i + 1], ARGV[3 * i + 2]
  local task, group = KEYS[2 * i + 3], KEYS[2 * i + 4]
  local added
  if msg == '' then
    added = redis.call('ZREM', KEYS[4], id) == 1
    if added then
      redis.call('HSET', task, 'state', 'aggregating', 'group', tenant)
    end
  else
    added = fresh or redis.call('EXISTS', task) == 0
    if added and held ~= '' then
      redis.call('HSET', task, 'msg', msg, 'state', 'scheduled')
      redis.call('ZADD', KEYS[4], held, id)
    elseif added then
      redis.call('HSET', task, 'msg', msg, 'state', 'aggregating', 'group', tenant)
    end
  end
  if not added then
    out[i] = 0
  elseif msg ~= '' and held ~= '' then
    out[i] = 1 -- held: it enters its room when released
  else
    local s, last = score, last_score[group]
    if last == nil then -- the group's last score, read once per call
      local top = redis.call('ZRANGE', group, -1, -1, 'WITHSCORES')
      last = top[2] and tonumber(top[2]) or false
    end
    if last and last >= s then
      s = last + 0.000001
    end
    local written = string.format('%.6f', s)
    local a = adds[group]
    if a == nil then
      a = {}
      adds[group] = a
      groups[#groups + 1] = group
    end
    a[#a + 1] = written
    a[#a + 1] = id
    last_score[group] = tonumber(written)
    if not entered[tenant] then
      redis.call('SADD', KEYS[1], tenant)
      redis.call('ZADD', KEYS[2], 'NX', clock, tenant)
      entered[tenant] = true
    end
    out[i] = 1
  end
end
-- One ZADD per group and 500 notifications (unpack stays well within Lua's stack): a
-- ZADD per notification cost about 1.5 us more each.
for _, group in ipairs(groups) do
  local a = adds[group]
  for from = 1, #a, 1000 do
    redis.call('ZADD', group, unpack(a, from, math.min(from + 999, #a)))
  end
end
return out
