-- op_free.lua — Opcode "F", free: gives a holder's lease slots back (Limiter.Free).
--
-- KEYS[1..n]  -> n × lease: per cap a sorted set of leases (op_lease.lua)
--
-- ARGV[1]     -> holder: whose slots to give back
--
-- Returns {leases removed}.

local function free(nk)
  local holder = arg(1)
  local removed = 0
  for i = 1, nk do removed = removed + call('ZREM', key(), holder) end
  return {removed}
end

ops.F, opnames.F = free, 'free'
