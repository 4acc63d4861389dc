-- release.lua — give back the slot a member took (a send that definitely did not happen).
--
-- KEYS[1..n] -> the sorted sets the member was admitted to
-- ARGV[1]    -> member (its booking, "book:"..member, is removed too)
--
-- Returns the number of keys the member or its booking was removed from (0 when it held no slot).

local removed = 0
for i = 1, #KEYS do
  removed = removed + redis.call('ZREM', KEYS[i], ARGV[1], 'book:' .. ARGV[1])
end
return removed
