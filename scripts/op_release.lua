-- op_release.lua — Opcode "X", release: gives back the slot (admission or booking) an attempt
-- took, for a send that definitely did not happen (Limiter.Release): removes the attempt's entry
-- from every rule key (a counter key gives back the count at the attempt's recorded slot) and
-- rolls the record back, to nothing for attempt 1, else to attempt k-1 admitted.
--
-- KEYS[1..n]  -> n × rule: the rules' sorted sets or counter hashes
-- KEYS[n+1]   -> state: the member's record (in a group other than the member's own, a key
--                that is never written)
--
-- ARGV[1]     -> member: the send's id, as the windows store it
-- ARGV[2]     -> attempt: the attempt to release (its member is "<member>#<attempt>" past 1)
-- ARGV[3...]  -> counters: the counter rules' descriptors (limiter_counter.lua)
-- ARGV[...]   -> distinct: the distinct rules' descriptors (limiter_distinct.lua)
--
-- Returns {entries removed}.

local function release(nk)
  local member, attempt = arg(2)
  attempt = tonumber(attempt)
  local m = member
  if attempt > 1 then m = m .. '#' .. attempt end
  local keys = {key(nk - 1)}
  local skey = key()
  ctr_read(keys)
  dst_read(keys)
  local st = call('GET', skey)
  local at = nil -- the attempt's slot, which a counter key counts it at
  if st then
    local kind, k, t = smatch(st, '^(%a)(%d+):(%-?%d+)')
    if (kind == 'a' or kind == 'b') and tonumber(k) == attempt then at = tonumber(t) end
  end
  local removed = 0
  for i = 1, #keys do removed = removed + take(keys[i], m, at) end
  if st then
    local kind, k = smatch(st, '^(%a)(%d+):')
    if (kind == 'a' or kind == 'b') and tonumber(k) == attempt then
      if attempt == 1 then
        call('DEL', skey)
      else
        call('SET', skey, 'a' .. (attempt - 1) .. ':0', 'KEEPTTL')
      end
    end
  end
  return {removed}
end

ops.X, opnames.X = release, 'release'
