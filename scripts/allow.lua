-- allow.lua — sliding-window-log check-and-add over one or more rules, atomically,
-- with optional booking of a future slot for a denied member.
--
-- KEYS[1..n] -> one sorted set per rule (score = admission time in ms, member = notification id).
-- KEYS[n+1]  -> the member's done marker (a string key set once its send completed).
--               All keys of one call share a Redis Cluster hash slot ({group} hash tag).
-- ARGV[1]    -> member: the stable id of the send being admitted (unique per notification)
-- ARGV[2]    -> now in ms, or "" to read the Redis server clock (TIME). Explicit now is for tests/tools.
-- ARGV[3]    -> "" for a plain check; else booking mode, and this is the slack in ms: how late
--               after its slot a booked member may be admitted (the caller's bound on wake lateness)
-- ARGV[4]    -> booking mode: slots are rounded up to a multiple of this many ms (1 = no rounding)
-- ARGV[5..]  -> for each rule key i: ARGV[3+2i] = limit (> 0), ARGV[4+2i] = window in ms (> 0)
--
-- Returns an array of integers {status, rule, retry_ms, remaining, now_ms}:
--   status    1 = admitted: the member was added at now to every key; each key's TTL covers its newest entry
--             0 = denied: nothing was added to any key (plain mode)
--             2 = already admitted: the member is inside a window of at least one key; nothing changed
--             3 = done: the done marker exists (the send already happened); nothing changed, nothing trimmed
--             4 = booked (booking mode): "book:"..member holds a slot at now + retry_ms in every key
--   rule      denied/booked: 1-based index of the rule with the longest wait; otherwise 0
--   retry_ms  denied: ms until the entry that must leave the denying window has left it
--             (oldest_needed + window + 1 - now), the maximum over all denying rules;
--             booked: ms until the booked slot; otherwise -1
--   remaining the smallest number of further admissions any rule allows now
--   now_ms    the time the decision was taken at
--
-- Boundary (the lesson's rule): an entry scored exactly now - window is still inside the window;
-- one ms older is out. Every call trims first, deny included.
--
-- Bookings are entries with future scores. Admitting at now when a key at its limit holds
-- entries after now uses the general check: every run of limit+1 consecutive entries including
-- now must span more than the window. A booking is placed after the key's newest entry, at least window + 1 + slack
-- after the limit-th most recent entry, so a booked member admitted up to slack late still keeps
-- every window of actual admission times within its limit. A member that wakes for its booking
-- is admitted at its actual time if the general check allows it (even a little before the slot);
-- else it keeps its booking if the slot is still ahead, or is booked again at the end.

local member = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
end
local booking = ARGV[3] ~= ''
local slack = booking and tonumber(ARGV[3]) or 0
local grain = booking and tonumber(ARGV[4]) or 1
local n = #KEYS - 1
local bmember = 'book:' .. member

if redis.call('EXISTS', KEYS[n + 1]) == 1 then
  return {3, 0, -1, 0, now}
end

local function fmt(x) return string.format('%d', x) end

-- validAt: may an entry be added at x without any window holding more than limit?
local function validAt(key, x, limit, window)
  local before = redis.call('ZREVRANGEBYSCORE', key, fmt(x), '-inf', 'WITHSCORES', 'LIMIT', 0, limit)
  local after = redis.call('ZRANGEBYSCORE', key, '(' .. fmt(x), '+inf', 'WITHSCORES', 'LIMIT', 0, limit)
  local nb, na = #before / 2, #after / 2
  for k = 0, limit do
    local j = limit - k
    if k <= nb and j <= na then
      local earliest = x
      if k > 0 then earliest = tonumber(before[2 * k]) end
      local latest = x
      if j > 0 then latest = tonumber(after[2 * j]) end
      if latest - earliest <= window then return false end
    end
  end
  return true
end

local limits, windows, counts, newest = {}, {}, {}, {}
local already, booked = false, nil
for i = 1, n do
  local key = KEYS[i]
  limits[i] = tonumber(ARGV[3 + 2 * i])
  windows[i] = tonumber(ARGV[4 + 2 * i])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', '(' .. fmt(now - windows[i]))
  if booking then
    local sc = redis.call('ZMSCORE', key, member, bmember)
    if sc[1] then already = true end
    if sc[2] then
      local s = tonumber(sc[2])
      if booked == nil or s > booked then booked = s end
    end
  elseif not already and redis.call('ZSCORE', key, member) then
    already = true
  end
end

local function remainingNow()
  local r = -1
  for i = 1, n do
    local left = limits[i] - redis.call('ZCOUNT', KEYS[i], fmt(now - windows[i]), fmt(now))
    if r < 0 or left < r then r = left end
  end
  return math.max(r, 0)
end

if already then
  return {2, 0, -1, remainingNow(), now}
end
if booked then
  for i = 1, n do redis.call('ZREM', KEYS[i], bmember) end
end

-- Can the member be admitted now? With fewer than limit entries in a key (bookings
-- included) any one more fits; only a key at its limit needs to know whether entries
-- lie in the future, and then the general check decides.
local ok, future = true, false
for i = 1, n do
  local key = KEYS[i]
  counts[i] = redis.call('ZCARD', key)
  newest[i] = -1
  if counts[i] >= limits[i] then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    newest[i] = tonumber(last[2])
    if newest[i] > now then
      future = true
      -- A new member queues behind existing bookings; a woken booked one is re-checked.
      if (booking and not booked) or not validAt(key, now, limits[i], windows[i]) then ok = false end
    else
      ok = false
    end
  end
end

if ok then
  local left = -1
  for i = 1, n do
    redis.call('ZADD', KEYS[i], now, member)
    redis.call('PEXPIRE', KEYS[i], math.max(newest[i], now) - now + windows[i])
    local l = limits[i] - counts[i] - 1
    if left < 0 or l < left then left = l end
  end
  if future then left = remainingNow() end
  return {1, 0, -1, math.max(left, 0), now}
end

if booked and booked > now then
  -- Woken before its slot and not admissible yet: keep the slot.
  for i = 1, n do redis.call('ZADD', KEYS[i], booked, bmember) end
  return {4, 0, booked - now, 0, now}
end

if not booking then
  -- Plain denial: the wait until the entry that has to leave has left.
  local denied, wait = 0, -1
  for i = 1, n do
    if counts[i] >= limits[i] then
      local idx = counts[i] - limits[i]
      local e = redis.call('ZRANGE', KEYS[i], idx, idx, 'WITHSCORES')
      local w = tonumber(e[2]) + windows[i] + 1 - now
      if w < 1 then w = 1 end
      if w > wait then denied, wait = i, w end
    end
  end
  return {0, denied, wait, 0, now}
end

-- Book the earliest slot at the end of every key that keeps each window within its
-- limit even when the member is admitted up to slack after the slot.
local slot, rule = now, 0
for i = 1, n do
  local x = math.max(now, newest[i])
  if counts[i] >= limits[i] then
    local idx = counts[i] - limits[i]
    local e = redis.call('ZRANGE', KEYS[i], idx, idx, 'WITHSCORES')
    x = math.max(x, tonumber(e[2]) + windows[i] + 1 + slack)
  end
  if rule == 0 or x > slot then slot, rule = math.max(x, slot), i end
end
if slot <= now then slot = now + 1 end
if grain > 1 then slot = math.ceil(slot / grain) * grain end
for i = 1, n do
  redis.call('ZADD', KEYS[i], slot, bmember)
  redis.call('PEXPIRE', KEYS[i], slot - now + windows[i])
end
return {4, rule, slot - now, 0, now}
