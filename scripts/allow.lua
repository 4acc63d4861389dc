-- allow.lua — sliding-window-log check-and-add over one or more rules, atomically.
--
-- KEYS[1..n] -> one sorted set per rule (score = admission time in ms, member = notification id).
-- KEYS[n+1]  -> the member's done marker (a string key set once its send completed).
--               All keys of one call share a Redis Cluster hash slot ({group} hash tag).
-- ARGV[1]    -> member: the stable id of the send being admitted (unique per notification)
-- ARGV[2]    -> now in ms, or "" to read the Redis server clock (TIME). Explicit now is for tests/tools.
-- ARGV[3..]  -> for each rule key i: ARGV[1+2i] = limit (> 0), ARGV[2+2i] = window in ms (> 0)
--
-- Returns an array of integers {status, rule, retry_ms, remaining, now_ms}:
--   status    1 = admitted (the member was added to every key and each key's TTL set to its window)
--             0 = denied (nothing was added to any key)
--             2 = already admitted: the member is still inside a window of at least one key; nothing changed
--             3 = done: the done marker exists (the send already happened); nothing changed, nothing trimmed
--   rule      denied: 1-based index of the rule with the longest wait; otherwise 0
--   retry_ms  denied: ms until the entry that must leave the denying window has left it
--             (oldest_needed + window + 1 - now), the maximum over all denying rules; otherwise -1
--   remaining admitted: the smallest number of further admissions any rule allows now; denied/already: same, after trimming
--   now_ms    the time the decision was taken at
--
-- Boundary (the lesson's rule): an entry scored exactly now - window is still inside the window;
-- one ms older is out. Every call trims first, deny included.

local member = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[2])
end

local n = #KEYS - 1
if redis.call('EXISTS', KEYS[n + 1]) == 1 then
  return {3, 0, -1, 0, now}
end

local counts = {}
local already = false
local remaining = -1
for i = 1, n do
  local key = KEYS[i]
  local window = tonumber(ARGV[2 + 2 * i])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('(%d', now - window))
  local count = redis.call('ZCARD', key)
  counts[i] = count
  if not already and redis.call('ZSCORE', key, member) then
    already = true
  end
  local left = tonumber(ARGV[1 + 2 * i]) - count
  if remaining < 0 or left < remaining then
    remaining = left
  end
end
if remaining < 0 then remaining = 0 end

if already then
  return {2, 0, -1, remaining, now}
end

local denied, wait = 0, -1
for i = 1, n do
  local limit = tonumber(ARGV[1 + 2 * i])
  local count = counts[i]
  if count >= limit then
    local window = tonumber(ARGV[2 + 2 * i])
    -- The (count - limit + 1)-th oldest entry must leave before one more fits.
    local idx = count - limit
    local e = redis.call('ZRANGE', KEYS[i], idx, idx, 'WITHSCORES')
    local w = tonumber(e[2]) + window + 1 - now
    if w < 1 then w = 1 end
    if w > wait then
      denied, wait = i, w
    end
  end
end

if denied > 0 then
  return {0, denied, wait, remaining, now}
end

for i = 1, n do
  redis.call('ZADD', KEYS[i], now, member)
  redis.call('PEXPIRE', KEYS[i], ARGV[2 + 2 * i])
end
return {1, 0, -1, remaining - 1, now}
