-- op_usage.lua — Opcode "U", usage (read-only): how full each rule is now (Limiter.Usage).
--
-- KEYS[1..n]  -> n × rule: the rules' sorted sets or counter hashes
--
-- ARGV[1]     -> slack_ms: the slack the rules' checks use (the next free slot's search)
-- ARGV[2]     -> n: the number of rules
-- ARGV[3...]  -> n × limit, window_ms
-- ARGV[...]   -> counters: the counter rules' descriptors (limiter_counter.lua)
-- ARGV[...]   -> distinct: the distinct rules' descriptors (limiter_distinct.lua)
--
-- Returns per rule five values: used (entries in [now-window, now]), booked (entries after now),
-- the oldest entry in the window (-1: none), the newest (-1: none), and the next free slot (the
-- earliest fit at or after now). A counter key answers -1 for the oldest and, for the newest,
-- the instant it counts nothing any more.

local function usage()
  local slack, n = arg(2)
  slack, n = tonumber(slack), tonumber(n)
  local keys = {key(n)}
  local limits, windows = cols(n, 2)
  for i = 1, n do limits[i], windows[i] = tonumber(limits[i]), tonumber(windows[i]) end
  ctr_read(keys)
  dst_read(keys)
  local out = {}
  for i = 1, n do
    local key, limit, window = keys[i], limits[i], windows[i]
    if dst[key] then
      for _, v in ipairs(dst_usage(dst[key], key, limit, window, slack)) do out[#out + 1] = v end
    elseif ctr[key] then
      for _, v in ipairs(ctr_usage(ctr[key], key, limit, window, slack)) do out[#out + 1] = v end
    else
      local from, nowf = fmt(now - window), fmt(now)
      local used = call('ZCOUNT', key, from, nowf)
      local booked = call('ZCOUNT', key, '(' .. nowf, '+inf')
      local oldest, newest = -1, -1
      local o = call('ZRANGEBYSCORE', key, from, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      if #o > 0 and tonumber(o[2]) <= now then oldest = tonumber(o[2]) end
      local nw = call('ZRANGE', key, -1, -1, 'WITHSCORES')
      if #nw > 0 then newest = tonumber(nw[2]) end
      local nextfree = earliest(key, limit, window + slack, now)
      if nextfree == nil then nextfree = past(key, limit, window + slack, now) end
      out[#out + 1] = used
      out[#out + 1] = booked
      out[#out + 1] = oldest
      out[#out + 1] = newest
      out[#out + 1] = nextfree
    end
  end
  return out
end

ops.U, opnames.U = usage, 'usage'
