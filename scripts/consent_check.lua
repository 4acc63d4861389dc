-- consent_check.lua — the consent rule (consent.lua) run on its own: whether a send of one
-- category to one recipient is blocked (scripts.ConsentCheck, run by consent.Store.Check). It is
-- the very rule the limiter's "R" applies: scripts.go joins consent.lua in at the include line.
--
-- KEYS[1] -> the suppression hash of (tenant, channel, recipient) (consent/record.lua writes it)
-- ARGV[1] -> now in ms, or "" to read the Redis server clock (TIME)
-- ARGV[2] -> the send's category (the default category's name when it has none)
-- ARGV[3] -> exempt: "1" when the tenant declares the category one that an opt-out of every
--            category lets through (an OTP the recipient just asked for), else "0"
--
-- Returns {reason, the field's value or ""}: reason 0 not blocked, else consent.lua's 1, 2 or 3.

local tonumber, smatch, call = tonumber, string.match, redis.call
local now
if ARGV[1] == '' then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
--#include consent.lua
local reason, mark = suppressed(KEYS[1], ARGV[2], ARGV[3] == '1')
return {reason, mark or ''}
