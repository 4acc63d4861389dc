-- op_hold.lua — Opcode "H", hold: a provider's back-pressure ("429, retry after 5 s"), shared by
-- every worker (Limiter.Hold). Holds the scope until now + retry_ms, or now + base_ms·2^level
-- (at most max_ms) where level grows by one when the key's last hold had already lifted (the key
-- lingers linger_ms after it); a live hold is only ever extended, and only by an answer to a
-- request sent after it began: one that was already in flight when it began says nothing the
-- hold does not (its reply is {until, level, 2}, the hold unchanged). "R" reads hold keys: no
-- slot lies before a live hold's end.
--
-- KEYS[1]     -> hold: the held scope's key; value "<until_ms>:<level>:<code>:<since_ms>"
--                (since: when the hold began; absent in keys written before it was kept)
--
-- ARGV[1]     -> retry_ms: the provider's Retry-After (0: none, back off by level)
-- ARGV[2]     -> base_ms: the first hold without a Retry-After
-- ARGV[3]     -> max_ms: the longest hold without a Retry-After
-- ARGV[4]     -> linger_ms: how long the key outlives its hold
-- ARGV[5]     -> code: the provider's answer (429, 20429, 421, ...), kept for readers
-- ARGV[6]     -> sent_ago_ms: how long before this call the answered request was sent (in the
--                caller's clock: a duration, so the clocks need not agree)
-- ARGV[7]     -> events: the pub/sub channel a hold begun or extended is announced on, with the
--                write (Limiter.ProviderEvents; the workers' hold caches empty at the message)
--
-- Returns {until_ms, level, state}: state 0 the hold began, 1 a live hold was extended (or kept,
-- when it already lasted longer), 2 the answered request was in flight when the live hold began
-- (the hold unchanged).

local function hold()
  local hkey = key()
  local retry, base, cap, linger, code, ago, events = arg(7)
  retry, base, cap, linger, ago = tonumber(retry), tonumber(base), tonumber(cap), tonumber(linger), tonumber(ago)
  local cu, lvl, since = 0, -1, 0
  local cur = call('GET', hkey)
  if cur then
    local a, b, c = smatch(cur, '^(%d+):(%d+):[^:]*:?(%d*)')
    cu, lvl, since = tonumber(a) or 0, tonumber(b) or -1, tonumber(c) or 0
  end
  local live = cu > now
  if live and now - ago < since then return {cu, lvl, 2} end
  local dur = retry
  if retry <= 0 then
    if not live then lvl = lvl + 1 end
    lvl = max(lvl, 0)
    dur = min(base * 2 ^ min(lvl, 30), cap)
  else
    lvl = 0
  end
  local u = max(cu, now + dur)
  if not live then since = now end
  call('SET', hkey, fmt(u) .. ':' .. fmt(lvl) .. ':' .. code .. ':' .. fmt(since), 'PX', fmt(u - now + linger))
  call('PUBLISH', events, 'hold')
  local ext = 0
  if live then ext = 1 end
  return {u, lvl, ext}
end

ops.H, opnames.H = hold, 'hold'
