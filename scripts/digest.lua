-- digest.lua — the items of digests (plans' digest rule): notifications that their rules
-- would defer to a later slot, folded into one message that a carrier (the item that opened
-- the digest, booked for that slot) sends. Every item is written here before its own task is
-- completed, and read back by the carrier at its send, so none is lost with a worker.
--
-- KEYS[1] -> open: the digest open for the item's recipient, category and group: "<carrier id>\n<its items key>"
-- KEYS[2] -> items: the item's own items list, were it a carrier (records, the carrier's first)
-- KEYS[3] -> note: the item's record of the digest that carries it (join only)
-- KEYS[4] -> state: the item's record in the limiter (join with first = 1 only; only its
--            existence is read)
-- KEYS[5] -> opened: when the item opened the digest it carries, by this clock (TIME):
--            "<seconds>.<microseconds>" (join only)
-- ARGV[1] -> op: "join" or "close"
-- ARGV[2] -> id: the item's id
-- join:
-- ARGV[3] -> record: the item as the carrier reads it back
-- ARGV[4] -> max: the most items one digest carries
-- ARGV[5] -> ttl_ms: how long a digest's items and an item's note live
-- ARGV[6] -> start: 1 opens a digest with the item as its carrier when none with room is open
-- ARGV[7] -> first: 1 on a run's first look, before its check: an item the limiter has a
--            record of (KEYS[4]) was checked for a send of its own before (booked, admitted,
--            done) and neither joins nor opens a digest
--
-- join returns {1, carrier id, items}: joined an open digest (the item's task is done), or
-- had joined one already (a re-run of an item whose task did not complete: items 0);
-- {2, opened}: opened a digest, the item is its carrier; {3, opened}: the item is a carrier
-- already (opened: when its digest opened, "<s>.<us>" by Redis TIME, false if not known);
-- {4}: (first) the item was checked for a send of its own before: a re-run of that send;
-- {0}: no digest with room is open (and start is 0).
-- close returns the carrier's items (its own record first; empty: not a carrier) and
-- closes its digest to new items: the next item opens another.
local op, id = ARGV[1], ARGV[2]
local mine = id .. '\n' .. KEYS[2]
if op == 'close' then
  if redis.call('GET', KEYS[1]) == mine then redis.call('DEL', KEYS[1]) end
  return redis.call('LRANGE', KEYS[2], 0, -1)
end
if redis.call('EXISTS', KEYS[2]) == 1 then return {3, redis.call('GET', KEYS[5])} end
if ARGV[7] == '1' and KEYS[4] and redis.call('EXISTS', KEYS[4]) == 1 then return {4} end
local joined = redis.call('GET', KEYS[3])
if joined then return {1, joined, 0} end
local record, max, ttl = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local open = redis.call('GET', KEYS[1])
if open then
  local carrier, items = string.match(open, '^([^\n]*)\n(.*)$')
  local n = redis.call('LLEN', items)
  if n > 0 and n < max then
    redis.call('RPUSH', items, record)
    redis.call('SET', KEYS[3], carrier, 'PX', ttl)
    return {1, carrier, n + 1}
  end
end
if ARGV[6] ~= '1' then return {0} end
redis.call('RPUSH', KEYS[2], record)
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('SET', KEYS[1], mine, 'PX', ttl)
local now = redis.call('TIME')
local opened = now[1] .. '.' .. string.format('%06d', tonumber(now[2]))
redis.call('SET', KEYS[5], opened, 'PX', ttl)
return {2, opened}
