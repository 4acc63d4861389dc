-- op_done.lua — Opcode "D", done: records that an attempt's send completed, so that asking
-- again answers done and counts nothing (Limiter.MarkDone).
--
-- KEYS[1]     -> state: the member's record
--
-- ARGV[1]     -> attempt: the attempt that was sent
-- ARGV[2]     -> ttl_ms: how long the record lives
--
-- Returns {1}. The record is "d<attempt>:<now>".

local function done()
  local skey = key()
  local attempt, ttl = arg(2)
  -- A write Redis never refuses for memory comes first (limiter.lua, "Memory"): at maxmemory
  -- the record still replaces the admission's, a few bytes, so a re-run does not send again.
  if guard then call('PEXPIRE', skey, ttl) end
  call('SET', skey, 'd' .. attempt .. ':' .. fmt(now), 'PX', ttl)
  return {1}
end

ops.D, opnames.D = done, 'done'
