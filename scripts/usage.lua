-- usage.lua — read-only view of one or more sliding-window logs. Writes nothing.
--
-- KEYS[1..n] -> one sorted set per rule (as written by allow.lua)
-- ARGV[1]    -> now in ms, or "" to read the Redis server clock (TIME)
-- ARGV[2..]  -> for each key i: ARGV[2i] = limit, ARGV[2i+1] = window in ms
--
-- Returns {now_ms, count_1, oldest_1, newest_1, next_1, booked_1, ..., booked_n}:
--   count_i   entries scored in [now - window, now] (inside the window)
--   oldest_i  score of the oldest entry inside the window, or -1 when empty
--   newest_i  score of the newest entry, booked ones included, or -1 when empty
--   next_i    when the window is full: score of the entry whose leaving frees the next slot; else -1
--   booked_i  entries scored after now (slots booked for later)

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end

local out = {now}
for i = 1, #KEYS do
  local limit = tonumber(ARGV[2 * i])
  local window = tonumber(ARGV[2 * i + 1])
  local min = string.format('%d', now - window)
  local nowf = string.format('%d', now)
  local count = redis.call('ZCOUNT', KEYS[i], min, nowf)
  local booked = redis.call('ZCOUNT', KEYS[i], '(' .. nowf, '+inf')
  local oldest, newest, nextfree = -1, -1, -1
  if count + booked > 0 then
    local o = redis.call('ZRANGEBYSCORE', KEYS[i], min, nowf, 'WITHSCORES', 'LIMIT', 0, 1)
    if #o > 0 then oldest = tonumber(o[2]) end
    local nw = redis.call('ZRANGE', KEYS[i], -1, -1, 'WITHSCORES')
    newest = tonumber(nw[2])
    if count >= limit then
      local b = redis.call('ZRANGEBYSCORE', KEYS[i], min, nowf, 'WITHSCORES', 'LIMIT', count - limit, 1)
      nextfree = tonumber(b[2])
    end
  end
  out[#out + 1] = count
  out[#out + 1] = oldest
  out[#out + 1] = newest
  out[#out + 1] = nextfree
  out[#out + 1] = booked
end
return out
