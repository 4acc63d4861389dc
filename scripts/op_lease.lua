-- op_lease.lua — Opcode "L", lease: in-flight caps, at most max sends at once per cap, across
-- every worker (Limiter.Acquire). Drops lapsed leases; when every key has a slot besides the
-- holder's own, (re)takes one in each until now + ttl_ms — all or none.
--
-- KEYS[1..n]  -> n × lease: per cap a sorted set of leases (member = holder, score = when its
--                lease lapses)
--
-- ARGV[1]     -> holder: who takes the slots (a send's id and attempt)
-- ARGV[2]     -> ttl_ms: how long the leases last unless renewed
-- ARGV[3...]  -> n × max: the cap of each key
--
-- Returns {1, 0, 0}, or {0, index of the full key, when its next lease lapses}.

local function lease(nk)
  local holder, ttl = arg(2)
  ttl = tonumber(ttl)
  local keys = {key(nk)}
  for i = 1, nk do call('ZREMRANGEBYSCORE', keys[i], '-inf', fmt(now)) end
  for i = 1, nk do
    local k, cap = keys[i], tonumber(arg(1))
    local n = call('ZCARD', k)
    if call('ZSCORE', k, holder) then n = n - 1 end
    if n >= cap then
      local first = call('ZRANGE', k, 0, 0, 'WITHSCORES')
      return {0, i, tonumber(first[2])}
    end
  end
  for i = 1, nk do
    call('ZADD', keys[i], fmt(now + ttl), holder)
    call('PEXPIRE', keys[i], fmt(ttl + 1000), 'GT')
    if call('PTTL', keys[i]) < 0 then call('PEXPIRE', keys[i], fmt(ttl + 1000)) end
  end
  return {1, 0, 0}
end

ops.L, opnames.L = lease, 'lease'
