-- op_breaker.lua — Opcode "B", breaker: a provider's circuit breaker, shared by every worker
-- (Limiter.ProviderFailed, TryProbe, ProviderRecovered). The key holds
-- "<until_ms>:<since_ms>:<fails>:<win_ms>:<probe_ms>": open while until is ahead; since is when
-- it opened (0: closed); fails counts the transient failures of the window that began at win;
-- probe is when the probe now allowed lapses. Once until is past, a key with since > 0 is
-- half-open: one probe may go (mode 2); a failure re-opens it for cooldown_ms with since kept (it
-- has been down since then); a success closes it (mode 3 deletes the key).
--
-- KEYS[1]     -> breaker: the provider's breaker key (BreakerKey)
-- KEYS[2]     -> index: the set of breaker keys that have opened and not closed (readers list them;
--                it expires with the last of them)
--
-- ARGV[1]     -> mode: 1 failed (a transient failure), 2 probe (claim the one probe), 3 recovered,
--                4 give the probe back (its send was booked for later: another may probe now)
-- ARGV[2]     -> failures: failures within window_ms that open it (mode 1)
-- ARGV[3]     -> window_ms: the window failures are counted in (mode 1)
-- ARGV[4]     -> cooldown_ms: how long it stays open (mode 1); a probe's lease (mode 2)
-- ARGV[5]     -> linger_ms: how long the key outlives what it must remember
-- ARGV[6]     -> events: the pub/sub channel every write of the key is announced on, with the
--                write (Limiter.ProviderEvents, message "breaker"; the workers' caches of the
--                provider keys empty at it)
--
-- Returns {open (1: open now), since_ms, until_ms, fails, probe (mode 2: 1 when this call won it)}.

local function breaker()
  local bkey, ikey = key(), key()
  local mode, need, win, cool, linger, events = arg(6)
  mode, need, win, cool, linger = tonumber(mode), tonumber(need), tonumber(win), tonumber(cool), tonumber(linger)
  local u, since, fails, ws, probe = 0, 0, 0, 0, 0
  local cur = call('GET', bkey)
  if cur then
    local a, b, c, d, e = smatch(cur, '^(%d+):(%d+):(%d+):(%d+):(%d+)$')
    u, since, fails, ws, probe = tonumber(a) or 0, tonumber(b) or 0, tonumber(c) or 0, tonumber(d) or 0, tonumber(e) or 0
  end
  local won = 0
  if mode == 3 then
    if call('DEL', bkey) == 1 then call('PUBLISH', events, 'breaker') end
    call('SREM', ikey, bkey)
    return {0, 0, 0, 0, 0}
  elseif mode == 2 then
    if since > 0 and u <= now and probe <= now then
      probe, won = now + cool, 1
    else
      return {u > now and 1 or 0, since, u, fails, 0}
    end
  elseif mode == 4 then
    if since == 0 or probe <= now then -- closed meanwhile, or no probe live: nothing to give back
      return {u > now and 1 or 0, since, u, fails, 0}
    end
    probe = 0
  else
    if ws == 0 or now >= ws + win then ws, fails = now, 0 end
    fails = fails + 1
    if since > 0 and u <= now then
      u, probe = now + cool, 0 -- a failure while half-open (the probe's, or one in flight): open again
    elseif since == 0 and fails >= need then
      since, u = now, now + cool
      call('SADD', ikey, bkey)
    end
  end
  local keep = max(u, ws + win, probe) - now + linger
  call('SET', bkey, fmt(u) .. ':' .. fmt(since) .. ':' .. fmt(fails) .. ':' .. fmt(ws) .. ':' .. fmt(probe), 'PX', fmt(keep))
  call('PUBLISH', events, 'breaker')
  if since > 0 and call('PTTL', ikey) < keep then call('PEXPIRE', ikey, fmt(keep)) end -- the index outlives its keys
  return {u > now and 1 or 0, since, u, fails, won}
end

ops.B, opnames.B = breaker, 'breaker'
