-- check.lua — whether a send of one category to one recipient is blocked by its suppression hash.
-- This is exactly the reading the limiter's script makes before it admits a send (phase B of
-- issue 21 copies these lines into scripts/limiter.lua), so the format is proved by running it.
--
-- KEYS[1] -> the suppression hash of (tenant, channel, recipient) (see record.lua for its fields)
-- ARGV[1] -> now in ms, or "" to read the Redis server clock (TIME)
-- ARGV[2] -> the send's category (the default category's name when it has none)
-- ARGV[3] -> exempt: "1" when the tenant declares the category one that an opt-out of every
--            category lets through (an OTP the recipient just asked for), else "0"
--
-- A field counts while its until (the number before its first ':') is 0 or after now; a value
-- that does not start with a number counts too (fail closed). In this order:
--   "!"          → blocked, reason 1 (undeliverable), exempt or not
--   "c:<cat>"    → blocked, reason 2 (the category is opted out), exempt or not
--   "*"          → blocked, reason 3 (every category is), unless exempt or "+:<cat>" counts
-- Returns {reason, the field's value or ""}; reason 0: not blocked. One HMGET: O(1).

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local cat = ARGV[2]
local f = redis.call('HMGET', KEYS[1], '!', 'c:' .. cat, '*', '+:' .. cat)
local function live(v)
  if not v then return false end
  local u = tonumber(string.match(v, '^(%d+):'))
  return not u or u == 0 or u > now
end
if live(f[1]) then return {1, f[1]} end
if live(f[2]) then return {2, f[2]} end
if live(f[3]) and ARGV[3] ~= '1' and not live(f[4]) then return {3, f[3]} end
return {0, ''}
