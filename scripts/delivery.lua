-- delivery.lua — record a message's delivery status as its provider reports it, only forward.
--
-- KEYS[1] -> the notification's delivery record, a string (next to the limiter's state key of the
--            notification, in the same hash slot).
-- ARGV[1] -> rank of the new status: 1 accepted/scheduled, 2 queued, 3 sending, 4 sent,
--            5 final (delivered, undelivered, failed, canceled, partially_delivered), 6 read
-- ARGV[2] -> the rest of the record: "<status>:<error code>:<message sid>"
-- ARGV[3] -> TTL of the record in ms
--
-- The record is "<rank>:<ms>:<status>:<error code>:<message sid>", ms the Redis server time of the
-- write. A status is written only when its rank is above the stored one's: a late "sent" after
-- "delivered" changes nothing, and of the final statuses the first one reported stays. A write
-- sets the TTL afresh; a status not written leaves the record and its TTL as they were.
--
-- Returns {1, previous record or ""} when written, {0, current record} when not.

local cur = redis.call('GET', KEYS[1])
local rank = 0
if cur then
  rank = tonumber(string.match(cur, '^(%d+):')) or 0
end
if tonumber(ARGV[1]) <= rank then
  return {0, cur}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. string.format('%d', now) .. ':' .. ARGV[2], 'PX', ARGV[3])
return {1, cur or ''}
