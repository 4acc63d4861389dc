-- op_reserve.lua — Opcode "R", reserve: admit a member now, admit it for an instant up to
-- horizon_ms ahead, book a later slot, or deny it; every rule or none (Limiter.Reserve, Allow).
--
-- KEYS[1..n]  -> n × rule: per rule a sorted set (score = ms of a send, member = its id) or a
--                counter hash (limiter_counter.lua)
-- KEYS[n+1]   -> state: the member's record (policy not "" only; so are the keys below)
-- KEYS[...]   -> block: a key whose existence blocks the send (block = 1 only)
-- KEYS[...]   -> consent: the recipient's suppression hash (consent = 1 only; consent.lua)
-- KEYS[...]   -> last: remembers the category last admitted to the recipient (last_ttl_ms > 0)
-- KEYS[...]   -> note: set to note_value when the send is admitted (note_ttl_ms > 0)
-- KEYS[...]   -> nh × hold: hold keys (op_hold.lua); a live one closes [now, its end)
--
-- ARGV[1]     -> member: the send's id, as the windows store it
-- ARGV[2]     -> policy: "" (no state key), "d", "f" or "o" (below)
-- ARGV[3]     -> slack_ms: a send may land up to this long after its slot
-- ARGV[4]     -> horizon_ms: a slot up to this far ahead is admitted (the caller waits for it)
-- ARGV[5]     -> book: 1 books a slot past the horizon, 0 denies
-- ARGV[6]     -> tmin_ms: no slot before it ("" none)
-- ARGV[7]     -> late_ms: a tmin up to this far in the past is kept as the slot
-- ARGV[8]     -> deadline_ms: a slot after it expires the send ("" none)
-- ARGV[9]     -> state_ttl_ms: how long the record lives, counted from the slot
-- ARGV[10]    -> nonce: the caller's run ("" none)
-- ARGV[11]    -> block: 1 when KEYS holds a block key
-- ARGV[12]    -> consent: 1 when KEYS holds the suppression hash
-- ARGV[13]    -> category: the send's category, for the consent rule
-- ARGV[14]    -> exempt: 1 when an opt-out of every category lets the category through
-- ARGV[15]    -> last_ttl_ms: the last-category key's TTL (0: no such key)
-- ARGV[16]    -> note_ttl_ms: the note's TTL, counted from the slot (0: no note)
-- ARGV[17]    -> note_value
-- ARGV[18]    -> n: the number of rules
-- ARGV[19]    -> nc: the number of closed intervals
-- ARGV[20]    -> nh: the number of hold keys
-- ARGV[21...] -> n × limit, window_ms, drop: drop 1 drops the send when this rule is full
-- ARGV[...]   -> nc × start_ms, end_ms: sorted; no slot lies in [start, end)
-- ARGV[...]   -> counters: the counter rules' descriptors (limiter_counter.lua)
-- ARGV[...]   -> distinct: the distinct rules' descriptors (limiter_distinct.lua)
--
-- Returns {status, rule, wait_ms, remaining, attempt, slot_ms}:
--   status 1 admitted at slot (wait 0: now; else the caller sends at slot, within slack)
--          0 denied (book = 0): nothing added; slot is when it would fit
--          4 booked: the member holds slot; asking again from about then admits it
--          2 duplicate, 3 done, 5 unknown outcome (policy "o"): nothing changed
--          6 expired: slot is after the deadline; nothing held (its booking is released)
--          7 dropped: a drop rule was full at max(now, tmin); nothing added
--          8 blocked: the block key exists or the consent rule blocks; nothing added (a booking
--            is released); three more values: the code (the block key's integer value, or the
--            mark's code), the reason (0 the block key, else consent.lua's) and the mark's at_ms
--   rule   1-based index of the rule that set the slot (0: none)
--   remaining  fewest further entries any rule takes around the slot, bookings counted
--
-- A rule holds when no span of window+slack ms holds more than limit entries (every entry may
-- land up to slack ms after its score; with slack 0 this is the textbook window, and an entry
-- scored exactly now-window is still inside). The slot is the earliest x >= max(now, tmin),
-- outside every closed interval, at which one more entry keeps every rule, bookings included.
-- Policy "": a member already inside a window is a duplicate (idempotent). "d"/"f"/"o": the state
-- key records the attempt, "b<k>:<ms>" booked, "a<k>:<ms>" admitted, "d<k>:<ms>" done; attempt
-- k > 1 uses member "<member>#<k>". A booked member takes its booking back and is placed again.
-- An admitted one asking again has an unknown outcome: "d" answers duplicate, "f" (at least
-- once) gives it attempt k+1 with a fresh slot (the old entry keeps counting), "o" (at most
-- once) answers unknown. A call whose nonce is in the record is that run asking again (its reply
-- was lost): it gets its own admission back, at its slot.

-- record: what the member's state key says of this call: a reply that settles it (done; the
-- same run's admission; an unknown outcome or a duplicate, as the policy says), else the attempt
-- to place and, when that attempt holds a booking, the booking's slot.
local function record(skey, policy, nonce)
  local st = call('GET', skey)
  if not st then return nil, 1 end
  local kind, k, t, who = smatch(st, '^(%a)(%d+):(%-?%d+):?(.*)$')
  if not kind then error('state key holds ' .. st) end
  k, t = tonumber(k), tonumber(t)
  if kind == 'd' then return {DONE, 0, -1, 0, k, t} end
  if kind == 'a' and nonce ~= '' and who == nonce then return {ADMITTED, 0, max(t - now, 0), 0, k, t} end
  if kind == 'a' then
    if policy == 'o' then return {UNKNOWN, 0, -1, 0, k, t} end
    if policy == 'd' then return {DUPLICATE, 0, -1, 0, k, t} end
    return nil, k + 1
  end
  return nil, k, t
end

-- blocked: the reply when the block key exists or the consent rule blocks the category.
local function blocked(bkey, ckey, category, exempt, attempt)
  if bkey then
    local v = call('GET', bkey)
    if v then return {BLOCKED, 0, -1, 0, attempt, now, tonumber(v) or 0, 0, 0} end
  end
  if not ckey then return nil end
  local reason, mark = suppressed(ckey, category, exempt)
  if reason == 0 then return nil end
  local code, at = 0, 0
  if mark then
    at = tonumber(smatch(mark, '^%d+:(%d+):')) or 0
    code = tonumber(smatch(mark, ':(%d+)$')) or 0
  end
  return {BLOCKED, 0, -1, 0, attempt, now, code, reason, at}
end

local function reserve_op()
  local member, policy, slack, horizon, book, tmin, late, deadline, sttl, nonce, block,
    consent, category, exempt, lastttl, notettl, notev, n, nc, nh = arg(20)
  slack, horizon, late, sttl = tonumber(slack), tonumber(horizon), tonumber(late), tonumber(sttl)
  book, block, consent, exempt = book == '1', block == '1', consent == '1', exempt == '1'
  lastttl, notettl, n, nc, nh = tonumber(lastttl), tonumber(notettl), tonumber(n), tonumber(nc), tonumber(nh)
  if deadline == '' then deadline = nil else deadline = tonumber(deadline) end
  local limits, wps, drops = cols(n, 3) -- wps: window_ms, made window + slack below
  for i = 1, n do
    limits[i], wps[i], drops[i] = tonumber(limits[i]), tonumber(wps[i]) + slack, drops[i] == '1'
  end
  local closed = {}
  if nc > 0 then closed = numbers(2 * nc) end
  local keys = {key(n)}
  ctr_read(keys)
  dst_read(keys)
  local skey, bkey, ckey, lastkey, notekey
  if policy ~= '' then
    skey = key()
    if block then bkey = key() end
    if consent then ckey = key() end
    if lastttl > 0 then lastkey = key() end
    if notettl > 0 then notekey = key() end
  end
  local hkeys = none
  if nh > 0 then hkeys = {key(nh)} end

  holds(closed, hkeys)
  for i = 1, n do
    if dst[keys[i]] then dst[keys[i]].h = now + horizon end -- what it admits, not books
  end
  local c = start(tmin, late)
  for i = 1, n do trim(keys[i], min(now, c) - wps[i], wps[i]) end

  local attempt, m, heldat = 1, member, nil
  if skey then
    local settled
    settled, attempt, heldat = record(skey, policy, nonce)
    if settled then return settled end
    if attempt > 1 then m = member .. '#' .. attempt end
    if heldat then
      for i = 1, n do
        if dst[keys[i]] then dst[keys[i]].p = heldat end -- its place in a distinct rule's queue
        take(keys[i], m, heldat)
      end
    end
    local b = (bkey or ckey) and blocked(bkey, ckey, category, exempt, attempt)
    if b then
      if heldat then call('DEL', skey) end
      return b
    end
  end
  local held = heldat ~= nil
  -- No state key: a member already inside a window is a duplicate. An admission or booking
  -- learns that from its adds (add with nx); every other answer asks first (inside).
  local nostate = not skey

  c = unclosed(c, closed)
  if not held then
    for i = 1, n do
      if drops[i] then
        local x = earliest(keys[i], limits[i], wps[i], c)
        if x ~= c then
          if nostate and inside(keys, m) then return duplicate() end
          return {DROPPED, i, -1, 0, attempt, c}
        end
      end
    end
  end

  local rule, counts
  c, rule, counts = search(keys, limits, wps, c, closed)
  local wait = max(c - now, 0)
  if deadline and c > deadline then
    if nostate and inside(keys, m) then return duplicate() end
    if held then call('DEL', skey) end
    return {EXPIRED, rule, wait, 0, attempt, c}
  end
  local remaining = -1
  for i = 1, n do
    local left = limits[i] - counts[i] - 1
    if remaining < 0 or left < remaining then remaining = left end
  end
  remaining = max(remaining, 0)
  local admit = wait <= horizon
  if not admit and not book then
    if nostate and inside(keys, m) then return duplicate() end
    if held then call('DEL', skey) end
    return {DENIED, rule, wait, 0, attempt, c}
  end
  if not add(keys, wps, counts, c, m, nostate, not admit) then return duplicate() end
  if admit then
    if skey then call('SET', skey, 'a' .. attempt .. ':' .. fmt(c) .. ':' .. nonce, 'PX', sttl + wait) end
    if lastkey then call('SET', lastkey, category, 'PX', lastttl) end
    if notekey then call('SET', notekey, notev, 'PX', notettl + wait) end
    return {ADMITTED, rule, wait, remaining, attempt, c}
  end
  if skey then call('SET', skey, 'b' .. attempt .. ':' .. fmt(c) .. ':' .. nonce, 'PX', sttl + wait) end
  return {BOOKED, rule, wait, 0, attempt, c}
end

-- reserve runs reserve_op and then, whatever it answers, takes back the optimistic counts of
-- its bucketed keys that no entry used (ctr_settle).
local function reserve()
  local ok, res = pcall(reserve_op) -- main starts ctr empty for it
  ctr_settle()
  if not ok then error(res, 0) end
  return res
end

ops.R, opnames.R = reserve, 'reserve'
