-- limiter.lua — Sluice's sliding-window-log limiter: a batch of operations, each one
-- atomic (Redis runs the whole script without interleaving), all sharing one clock reading.
--
-- KEYS    -> the keys of every operation, concatenated in operation order.
-- ARGV[1] -> now in ms, or "" to read the Redis server clock (TIME). Explicit now is for tests/tools.
-- ARGV[2] -> number of operations
-- then, per operation: opcode, number of its KEYS, number of its ARGV, its ARGV...
--
-- Returns {now_ms, reply_1, ..., reply_n}. A reply is an array of integers, or {-1, message}
-- when that operation failed (bad arguments, a key of the wrong type): errors stay per operation.
--
-- Memory: at maxmemory under noeviction Redis refuses a script's first write when it could grow
-- memory (ZADD, SET), and lets every write through once the script has written. Every operation
-- that writes begins with a write Redis never refuses (a trim, ZREM, PEXPIRE), so it runs whole
-- even then: what it admits is recorded in the windows, a done record replaces its admission's.
-- (Asynq's enqueue, dequeue and scheduling scripts begin with a write Redis refuses: meanwhile no
-- task is added or started.) Run as a function (FCALL; scripts.go registers main with the
-- allow-oom flag) every write goes through at maxmemory, as they do here once the first is made,
-- and the writes made only to come first are left out (guard).
--
-- The file defines main(keys, argv) and everything it calls; scripts.go appends the line that
-- registers main as a function or, for EVAL, calls it with KEYS and ARGV.
--
-- Opcode "R" — reserve: admit a member now, admit it for a near-future instant, or book a slot.
--   KEYS  -> one sorted set per rule (score = ms of the send, member = the send's id), then the
--            member's state key when a state policy is given (see below), then, with block = 1,
--            a key whose existence blocks the send (delivery's suppression list of earlier
--            releases), then, with consent = 1, the recipient's suppression hash (consent/), then,
--            with last_ttl > 0, the key that remembers the category last admitted to the recipient,
--            then, with note_ttl > 0, the note key: written with note_value when the send is admitted
--            (a record of the admission, such as whom an SMS goes to, costs no round trip).
--   ARGV  -> member, policy, slack_ms, horizon_ms, book (1/0), tmin_ms or "", late_ms,
--            deadline_ms or "", state_ttl_ms, nonce, block (1/0), n, then per rule: limit, window_ms, drop (1/0), then m, then m
--            closed intervals as start_ms, end_ms pairs (sorted): nothing may be placed in [start, end),
--            then consent (1/0), category, exempt (1/0), last_ttl_ms, note_ttl_ms, note_value, then the counter
--            descriptors (see "Counter rules" below; none when absent), then nh: the
--            operation's last nh KEYS are hold keys (see "H").
--   Consent: the suppression hash's fields are "<until_ms>:<at_ms>:<source>:<code>" (until 0:
--   no end), read with one HMGET: a live "!" blocks (undeliverable), a live "c:<category>"
--   blocks, a live "*" blocks unless the category is exempt or "+:<category>" is live; an
--   unreadable value blocks (consent/check.lua is the same reading, tested against the Go one).
--   A rule holds when no span of window+slack ms holds more than limit entries (window+slack:
--   every entry may land up to slack ms after its score; with slack 0 this is the textbook
--   window, and an entry scored exactly now-window is still inside). The slot is the earliest
--   x >= max(now, tmin), outside every closed interval, at which one more entry keeps every
--   rule — entries booked for the future included. A rule far from its limit does not move it.
--   A tmin up to late_ms in the past is kept as the slot (the other groups of a check across
--   Cluster slots hold that instant; the send goes at once).
--   policy "" : no state key; a member already inside a window is a duplicate (idempotent).
--   policy "d"/"f"/"o": the state key records the member's attempt: "b<k>:<ms>" booked,
--            "a<k>:<ms>" admitted (maybe sent), "d<k>:<ms>" done. Attempt k > 1 uses member
--            "<member>#<k>". A booked member takes its booking back and is placed again. An
--            admitted one that asks again has an unknown outcome: "d" answers duplicate, "f"
--            (at-least-once) gives it attempt k+1 with a fresh slot (the old entry keeps
--            counting), "o" (at-most-once) answers unknown and changes nothing. A call whose
--            nonce (unique per caller's run) is recorded in the state is that run asking again
--            (its reply was lost): it gets its own admission back, at its slot.
--   Returns {status, rule, wait_ms, remaining, attempt, slot_ms}:
--     status 1 admitted at slot (wait 0: now; else the caller sends at slot, within slack)
--            0 denied (book = 0): nothing added; slot is when it would fit
--            4 booked: the member holds slot; asking again from about then admits it
--            2 duplicate, 3 done, 5 unknown outcome (policy "o"): nothing changed
--            6 expired: slot is after the deadline; nothing held (its booking is released)
--            7 dropped: a drop rule was full at max(now, tmin); nothing added
--            8 blocked: the block key exists or the suppression hash blocks the category; nothing
--              added (a booking is released); the reply has three more values: the code (the
--              block key's integer value, or the mark's code), the reason (0 the block key,
--              1 undeliverable, 2 the category opted out, 3 every category opted out) and the
--              mark's at_ms (0 for the block key)
--     rule   1-based index of the rule that set the slot (0: none)
--     remaining  fewest further entries any rule takes around the slot, bookings counted
--
-- Opcode "P" — place (a check whose limits live in several groups, on Redis Cluster: the limits
--   outside the id's own group): KEYS -> rule keys. ARGV -> member, slack_ms, tmin_ms or "",
--   lead_ms, then per rule: limit, window_ms, then m and m closed intervals. Takes the member's
--   earlier entry back and adds it at the earliest slot every rule takes from now + lead, or
--   from tmin when later or at most lead earlier.
--   Returns {slot_ms, rule}.
-- Opcode "D" — done: KEYS -> state key. ARGV -> attempt, ttl_ms. Records "d<attempt>:<now>".
--   Returns {1}.
-- Opcode "X" — release: KEYS -> the rule keys, then the state key. ARGV -> member, attempt, then
--   the counter descriptors (a counter key gives back the count at the attempt's recorded slot).
--   Removes the attempt's entry (admission or booking) from every key and rolls the state back
--   (to nothing for attempt 1, else to attempt k-1 admitted). Returns {entries removed}.
-- Opcode "S" — state (read-only): KEYS -> the member's state key. Returns {kind, attempt, at_ms}: kind 0
--   when there is no record (attempt and at 0), else the record's letter as a byte (98 'b' booked,
--   97 'a' admitted, 100 'd' done); or an error for a record this script cannot read.
-- Opcode "U" — usage (read-only): KEYS -> rule keys. ARGV -> slack_ms, n, per rule limit, window_ms,
--   then the counter descriptors (a counter key answers -1 for oldest and, for newest, the
--   instant it counts nothing any more).
--   Returns per rule: used (entries in [now-window, now]), booked (entries after now), oldest in
--   the window (-1), newest (-1), next free slot (earliest fit at or after now).

-- The globals used per check, bound to locals by main on each call (a global is a table lookup
-- each time it is named; a library loads where they cannot be read).
local tonumber, tostring, type, pcall, error, pairs, ipairs, unpack
local floor, min, max, sformat, smatch, call

local function fmt(x) return sformat('%d', x) end

-- The statuses of "R", as throttle.Status numbers them (TestLuaStatusCodes checks both agree).
local DENIED, ADMITTED, DUPLICATE, DONE, BOOKED, UNKNOWN, EXPIRED, DROPPED, BLOCKED = 0, 1, 2, 3, 4, 5, 6, 7, 8

-- args returns a reader of one operation's ARGV from index a0: each call gives the next value,
-- so an operation binds its arguments to named locals in the order the header lists them.
-- Past the operation's own ARGV it gives nil (opend is set per operation by the loop at the end),
-- so optional trailing values (counter descriptors, holds) read as absent, never as the next
-- operation's.
local KEYS, ARGV, opend -- set by main (the end of this file) for each call
local function args(a0)
  local i = a0 - 1
  return function()
    i = i + 1
    if i >= opend then return nil end
    return ARGV[i]
  end
end

local now -- the call's clock reading, set by main
-- guard: run as a script (EVAL), where Redis refuses a first write that could grow memory at
-- maxmemory, so every writing operation begins with a write it never refuses (see the top). As
-- a function (allow-oom) every write goes through, and those writes are left out.
local guard

-- Entries read past the limit when looking for a gap; beyond them the slot goes after the key's end.
local LOOK = 64

-- earliest: the first time >= c at which key takes one more entry: no span of wp ms that
-- contains it holds limit entries. Spans holding limit entries block [last - wp, first + wp];
-- those blocks are ordered by both ends, so one pass finds the first gap. Returns the time and
-- the count of entries within wp of it, or nil when the gap lies past the entries read.
--
-- It reads only what it needs: one ZCOUNT when the key has room at c (the common admission);
-- when it has none and nothing lies after c (a full window, no bookings ahead: the common
-- denial), the slot is just after the limit-th newest entry leaves, read alone; otherwise the
-- spans are walked by rank, each span's first and last entry read in chunks that double (4, 8,
-- 16, …; one read of both when the limit is small), up to LOOK spans past the first.
local function earliest(key, limit, wp, c)
  local cnt = call('ZCOUNT', key, fmt(c - wp), fmt(c + wp))
  if cnt < limit then return c, cnt end
  local top = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if tonumber(top[2]) <= c then
    -- Every entry from c - wp on lies in [c - wp, c]: each run of limit of them blocks c, the
    -- last run ends at the limit-th newest + wp.
    -- Read with the entry after it: when that one is later, the limit - 1 entries after the
    -- slot's span start are exactly those within wp of the slot (the third value says so, and
    -- the caller need not count again).
    if limit == 1 then return tonumber(top[2]) + wp + 1, 0, true end
    local kth = call('ZRANGE', key, -limit, -limit + 1, 'WITHSCORES')
    return tonumber(kth[2]) + wp + 1, limit - 1, tonumber(kth[4]) > tonumber(kth[2])
  end
  local base = call('ZCOUNT', key, '-inf', '(' .. fmt(c - wp)) -- the rank of the first entry >= c - wp
  local i, k = 0, 4
  while i <= LOOK do
    local m = min(k, LOOK + 1 - i)
    local heads, tails, off
    if limit <= m + 1 then -- small limits: heads and tails in one read
      heads = call('ZRANGE', key, base + i, base + i + limit + m - 2, 'WITHSCORES')
      tails, off = heads, limit - 1
    else
      heads = call('ZRANGE', key, base + i, base + i + m - 1, 'WITHSCORES')
      tails = call('ZRANGE', key, base + i + limit - 1, base + i + limit + m - 2, 'WITHSCORES')
      off = 0
    end
    local nt = min(#tails / 2 - off, m)
    for j = 1, nt do
      local first = tonumber(heads[2 * j])
      local last = tonumber(tails[2 * (j + off)])
      if first + wp >= c and last - first <= wp then
        if last - wp > c then return c, limit - 1 end
        c = first + wp + 1
      end
    end
    if nt < m then return c, limit - 1 end
    i, k = i + m, k * 2
  end
  return nil
end

-- past: a time >= c after every entry of key and at least wp+1 after its limit-th newest
-- entry: one more entry fits there and anywhere later.
local function past(key, limit, wp, c)
  local last = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last > 0 then c = max(c, tonumber(last[2])) end
  if call('ZCARD', key) >= limit then
    local kth = call('ZRANGE', key, -limit, -limit, 'WITHSCORES')
    c = max(c, tonumber(kth[2]) + wp + 1)
  end
  return c
end

-- Counter rules: a calendar period's fixed counter ("c") or a sliding window kept as counts per
-- bucket ("b"), in a hash: field = the period's or bucket's start in ms, value = its count, and
-- beside them "t", the total of the counts, and "o", a start no count held is older than. A check
-- whose total leaves room pays for little: a calendar check reads "o" and "t" and adds its count;
-- a bucketed check counts itself in "t" as it reads it (HINCRBY, taken back unless it is
-- admitted or booked) and adds its bucket's count, three calls in all; old counts are dropped
-- once per period, or once per TRIM_LAG buckets, not per check.
-- An operation names its counter keys in descriptors after its other ARGV: their count k, then
-- per key its 1-based index among the operation's rule keys and "b", bucket_ms, or "c",
-- window_ms (nominal), nb and nb period starts (ascending; outside them the first or last
-- period's length repeats). Every other key stays a sliding log. A calendar slot lies at least
-- slack before its period's end, so the send lands in the period that counts it. A bucketed
-- rule treats every bucket a span of window+slack can touch as wholly inside it (a bucket
-- straddling the span's start counts whole): it never admits what the exact log would not, and
-- admits whatever a log of window+slack rounded up to whole buckets, plus one bucket, would.
local ctr = {}
-- How many gone buckets a bucketed key keeps before a trim drops them together.
local TRIM_LAG = 4
local ctr_prune -- defined with the other writes below

local function ctr_read(keys, arg)
  local k = tonumber(arg() or '0') or 0
  for _ = 1, k do
    local i, kind = tonumber(arg()), arg()
    local d = {kind = kind}
    if kind == 'b' then
      d.w = tonumber(arg())
    else
      d.win = tonumber(arg())
      d.b = {}
      for j = 1, tonumber(arg()) do d.b[j] = tonumber(arg()) end
    end
    ctr[keys[i]] = d
  end
end

-- cal_period: the start and end of the calendar period that holds x.
local function cal_period(d, x)
  local b = d.b
  local nb = #b
  if x < b[1] then
    local len = b[2] - b[1]
    local k = floor((b[1] - x - 1) / len) + 1
    return b[1] - k * len, b[1] - (k - 1) * len
  end
  if x >= b[nb] then
    local len = b[nb] - b[nb - 1]
    local k = floor((x - b[nb]) / len)
    return b[nb] + k * len, b[nb] + (k + 1) * len
  end
  local lo, hi = 1, nb
  while hi - lo > 1 do
    local mid = floor((lo + hi) / 2)
    if b[mid] <= x then lo = mid else hi = mid end
  end
  return b[lo], b[hi]
end

-- ctr_load: the key's counts by start, and the latest start (nil: empty).
local function ctr_load(key)
  local h = call('HGETALL', key)
  local cnt, top = {}, nil
  for j = 1, #h, 2 do
    local f = tonumber(h[j])
    if f then
      cnt[f] = tonumber(h[j + 1])
      if not top or f > top then top = f end
    end
  end
  return cnt, top
end

-- ctr_total: the total, as this operation's trim read and kept it, else read now.
local function ctr_total(d, key)
  if d.t then return d.t end
  return tonumber(call('HGET', key, 't') or '0')
end

local function ctr_span(d, wp) return floor((wp + d.w - 1) / d.w) end

-- b_worst: the fullest run of m+1 buckets that holds bucket k.
local function b_worst(cnt, w, m, k)
  local s = 0
  for i = k - m, k do s = s + (cnt[i * w] or 0) end
  local worst = s
  for j = k - m + 1, k do
    s = s - (cnt[(j - 1) * w] or 0) + (cnt[(j + m) * w] or 0)
    if s > worst then worst = s end
  end
  return worst
end

-- ctr_earliest: earliest for a counter key (the time, and the count around it).
local function ctr_earliest(d, key, limit, wp, c)
  local slack = wp - (d.win or 0)
  if d.kind == 'c' then
    local s, e = cal_period(d, c)
    if c + slack >= e then c = e end
  end
  local total = ctr_total(d, key)
  if total < limit then return c, total end -- every count together leaves room
  if d.kind == 'b' and d.x then
    ctr_prune(d, key, d.x) -- gone buckets left for a later trim: drop them before the full read
    if d.t < limit then return c, d.t end
  end
  local cnt, top = ctr_load(key)
  if d.kind == 'b' then
    if not top then return c, 0 end
    local w, m = d.w, ctr_span(d, wp)
    local k = floor(c / w)
    while true do
      local worst = b_worst(cnt, w, m, k)
      if worst < limit then return max(c, k * w), worst end
      k = k + 1
    end
  end
  for _ = 1, 100000 do
    local s, e = cal_period(d, c)
    if c + slack < e then
      local n = cnt[s] or 0
      if n < limit then return c, n end
    end
    c = e
  end
  return c, limit - 1
end

-- ctr_past: a time >= c after everything the key counts.
local function ctr_past(d, key, wp, c)
  local _, top = ctr_load(key)
  if not top then return c end
  if d.kind == 'b' then return max(c, top + (ctr_span(d, wp) + 1) * d.w) end
  local _, e = cal_period(d, top)
  return max(c, e)
end

-- ctr_field: the field that counts an entry at t.
local function ctr_field(d, t)
  if d.kind == 'b' then return floor(t / d.w) * d.w end
  local s = cal_period(d, t)
  return s
end

-- opt: 1 while a bucketed key's stored total holds this check's optimistic count (ctr_begin).
local function opt(d) if d.opt then return 1 end return 0 end

-- ctr_gone: the key counts nothing any more.
local function ctr_gone(d, key)
  call('DEL', key)
  d.t, d.o, d.opt, d.covered = 0, false, false, false
end

-- ctr_scan: reads every count of key and splits them by gone(start): the gone fields, the sum
-- of their counts, and the oldest start kept (nil: none).
local function ctr_scan(key, gone)
  local h = call('HGETALL', key)
  local old, dropped, oldest = {}, 0, nil
  for j = 1, #h, 2 do
    local f = tonumber(h[j])
    if f then
      if gone(f) then
        old[#old + 1] = h[j]
        dropped = dropped + tonumber(h[j + 1])
      elseif not oldest or f < oldest then
        oldest = f
      end
    end
  end
  return old, dropped, oldest
end

-- ctr_prune: drops a bucketed key's gone buckets (before the bucket ahead of x's, x: the span's
-- start), once TRIM_LAG of them are: a count no check can see only makes the total an
-- overestimate, which the fast path treats conservatively and the bucket-by-bucket count
-- ignores, so a steady rate pays for a trim once per TRIM_LAG buckets. The buckets that can be
-- gone lie on the grid from o to the cut: just those are read, and the cut is kept as o, a
-- bound no start held is older than. o: the key's "o" if already read.
ctr_prune = function(d, key, x, o)
  if o == nil then o = tonumber(call('HGET', key, 'o') or '') end
  if not o then return end
  d.o = o
  local cut = (floor(x / d.w) - 1) * d.w
  local nb = floor((cut - o) / d.w)
  if nb < TRIM_LAG then return end
  local old, dropped, newo = {}, 0, cut
  if o % d.w == 0 and nb <= 64 then
    local fs = {}
    for j = 0, nb - 1 do fs[j + 1] = fmt(o + j * d.w) end
    local vs = call('HMGET', key, unpack(fs))
    for j = 1, nb do
      if vs[j] then old[#old + 1] = fs[j] dropped = dropped + tonumber(vs[j]) end
    end
  else
    old, dropped, newo = ctr_scan(key, function(f) return f < cut end)
    newo = newo or cut
  end
  local st = d.t + opt(d) - dropped
  if st <= 0 then ctr_gone(d, key) return end
  if #old > 0 then call('HDEL', key, unpack(old)) end
  call('HSET', key, 't', fmt(st), 'o', fmt(newo))
  d.t, d.o = st - opt(d), newo
end

-- ctr_begin: a check's first calls on a bucketed key. Run as a script, the first write is one
-- Redis never refuses for memory (see the top), and a useful one: the TTL an entry in the
-- current bucket needs. Then the total is read by counting this check in it (HINCRBY),
-- optimistically: an admission in the current bucket then costs one more call (as a function,
-- that is all: two calls), and any other outcome takes the count back (ctr_settle, after the
-- operation).
local function ctr_begin(d, key, x, wp)
  local cur = floor(now / d.w) * d.w
  if guard then call('PEXPIRE', key, cur + d.w + wp - now + 1, 'GT') end
  local st = call('HINCRBY', key, 't', 1)
  -- covered: the key existed and its TTL was just made to cover the current bucket's end + wp.
  d.t, d.opt, d.cur, d.x, d.covered = st - 1, true, cur, x, guard and st > 1
end

-- ctr_settle: takes back an optimistic count no entry used.
local function ctr_settle()
  for key, d in pairs(ctr) do
    if d.opt then
      d.opt = false
      if call('HINCRBY', key, 't', -1) <= 0 then ctr_gone(d, key) end
    end
  end
end

local function ctr_add(d, key, wp, c, existed)
  local f = ctr_field(d, c)
  local first = call('HINCRBY', key, fmt(f), 1) == 1
  if d.opt then
    d.opt, d.t = false, d.t + 1
  else
    d.t = call('HINCRBY', key, 't', 1)
  end
  local o = d.o
  if d.kind == 'b' then
    -- A bucket counted before set the key's TTL to cover its end already, and o is no later.
    if not first then return end
    if not (d.covered and f == d.cur) then
      local ttl = max(f + d.w + wp - now + 1, 1)
      if existed or call('PEXPIRE', key, ttl, 'NX') == 0 then call('PEXPIRE', key, ttl, 'GT') end
    end
    if o == nil then o = tonumber(call('HGET', key, 'o') or '') end
    if not o or f < o then
      call('HSET', key, 'o', fmt(f))
      d.o = f
    elseif d.x then
      ctr_prune(d, key, d.x, o)
    end
    return
  end
  if o == nil then o = tonumber(call('HGET', key, 'o') or '') end
  if not o or f < o then call('HSET', key, 'o', fmt(f)) o = f end
  d.o = o
  local _, ends = cal_period(d, c)
  -- A period counted before set the key's TTL to cover its end already.
  if not first then return end
  local ttl = max(ends - now + 1, 1)
  if existed or call('PEXPIRE', key, ttl, 'NX') == 0 then call('PEXPIRE', key, ttl, 'GT') end
end

-- ctr_take: takes back the entry counted for t (a booking placed again, a release).
local function ctr_take(d, key, t)
  if guard then call('HDEL', key, '-') end -- a first write Redis never refuses (see ctr_trim)
  local f = fmt(ctr_field(d, t))
  if d.kind == 'c' then -- the latest period started by t: independent of the boundaries passed
    local best = nil
    for _, x in ipairs(call('HKEYS', key)) do
      local v = tonumber(x)
      if v and v <= t and (not best or v > best) then best = v end
    end
    if not best then return 0 end
    f = fmt(best)
  end
  local v = tonumber(call('HGET', key, f) or '0')
  if v <= 0 then return 0 end
  if v == 1 then call('HDEL', key, f) else call('HINCRBY', key, f, -1) end
  d.t = call('HINCRBY', key, 't', -1) - opt(d)
  if d.t <= 0 then ctr_gone(d, key) end
  return 1
end

-- ctr_trim: a calendar key's first calls in a check: drops the counts no check from x + wp on
-- can see, once the oldest one is such (a bucketed key: ctr_begin).
local function ctr_trim(d, key, x, wp)
  local function gone(f)
    local _, e = cal_period(d, f)
    return e <= x + wp - d.win
  end
  -- The operation's first write, which Redis never refuses for memory (see the top): a no-op
  -- HDEL, so that at maxmemory what it admits is still counted.
  if guard then call('HDEL', key, '-') end
  local ot = call('HMGET', key, 'o', 't')
  local o = tonumber(ot[1] or '')
  d.o, d.t = o or false, tonumber(ot[2] or '0')
  if not o or not gone(o) then return end
  local old, dropped, oldest = ctr_scan(key, gone)
  if not oldest then ctr_gone(d, key) return end
  old[#old + 1] = 'o'
  call('HDEL', key, unpack(old))
  if dropped > 0 then d.t = call('HINCRBY', key, 't', fmt(-dropped)) end
  call('HSET', key, 'o', fmt(oldest))
  d.o = oldest
end

-- ctr_usage: "U"'s five values for a counter key: used, booked, -1 (no oldest entry is kept),
-- the instant the key counts nothing any more (-1: empty now), next free slot.
local function ctr_usage(d, key, limit, window, slack)
  local cnt, top = ctr_load(key)
  local used, booked, reset = 0, 0, -1
  local cur, from
  if d.kind == 'b' then
    cur = floor(now / d.w) * d.w
    from = floor((now - window) / d.w) * d.w
  else
    cur = cal_period(d, now)
    from = cur
  end
  for f, v in pairs(cnt) do
    if f > cur then booked = booked + v elseif f >= from then used = used + v end
  end
  if top then
    if d.kind == 'b' then reset = top + d.w + window else local _, e = cal_period(d, top) reset = e end
  end
  local nextfree = ctr_earliest(d, key, limit, window + slack, now)
  return {used, booked, -1, reset, nextfree}
end

-- The log's operations, dispatched to the counter's for counter keys.
local function trim(key, x, wp)
  local d = ctr[key]
  if d then
    if d.kind == 'b' then return ctr_begin(d, key, x, wp) end
    return ctr_trim(d, key, x, wp)
  end
  call('ZREMRANGEBYSCORE', key, '-inf', '(' .. fmt(x))
end

local function take(key, m, t)
  local d = ctr[key]
  if d then
    if t then return ctr_take(d, key, t) end
    return 0
  end
  return call('ZREM', key, m)
end

do
  local log_earliest, log_past = earliest, past
  earliest = function(key, limit, wp, c)
    local d = ctr[key]
    if d then return ctr_earliest(d, key, limit, wp, c) end
    return log_earliest(key, limit, wp, c)
  end
  past = function(key, limit, wp, c)
    local d = ctr[key]
    if d then return ctr_past(d, key, wp, c) end
    return log_past(key, limit, wp, c)
  end
end

local function unclosed(c, closed)
  for j = 1, #closed, 2 do
    if c >= closed[j] and c < closed[j + 1] then c = closed[j + 1] end
  end
  return c
end

-- start: where a search begins: now, or tmin when later — or when at most late ms earlier.
local function start(tmin, late)
  if tmin == '' then return now end
  local t = tonumber(tmin)
  if t >= now - late then return t end
  return now
end

-- search: the earliest time >= c outside the closed intervals at which every key takes one
-- more entry. Each pass moves c past a block of some key; after a bounded number of passes
-- the slot goes after every key's end. Returns the time, the index of the key that set it
-- (0: none), and per key the entries within its span of it.
local function search(keys, limits, wps, c, closed)
  local n = #keys
  if n == 1 and #closed == 0 then
    -- One rule (the common check): the first pass settles unless it moves c, and a moved c
    -- needs one more look at the key (its count there).
    local x, cnt, exact = earliest(keys[1], limits[1], wps[1], c)
    if x == c then return c, 0, {cnt} end
    if exact then return x, 1, {cnt} end
    if x ~= nil then
      local y, cnt2 = earliest(keys[1], limits[1], wps[1], x)
      if y == x then return x, 1, {cnt2} end
    end
  end
  local rule, counts, settled = 0, {}, false
  c = unclosed(c, closed)
  for pass = 1, 8 do
    local moved = false
    for i = 1, n do
      local x, cnt = earliest(keys[i], limits[i], wps[i], c)
      if x == nil then x, cnt = past(keys[i], limits[i], wps[i], c), limits[i] - 1 end
      counts[i] = cnt
      if x > c then c, rule, moved = x, i, true end
    end
    local u = unclosed(c, closed)
    if u > c then c, moved = u, true end
    if not moved then settled = true break end
  end
  if not settled then
    for pass = 1, 2 do
      for i = 1, n do
        local x = past(keys[i], limits[i], wps[i], c)
        counts[i] = limits[i] - 1
        if x > c then c, rule = x, i end
      end
      c = unclosed(c, closed)
    end
  end
  return c, rule, counts
end

-- add puts member at c in every key, with TTLs that cover it (never shortened). With nx, a
-- member already in a log key is a duplicate: add takes back what it added and returns false,
-- having changed nothing (its ZADD NX is the duplicate check, so an admission makes none apart).
local function add(keys, wps, counts, c, m, nx)
  local n, cs = #keys, fmt(c)
  if nx then
    for i = 1, n do
      if not ctr[keys[i]] and call('ZADD', keys[i], 'NX', cs, m) == 0 then
        local own = false -- two rules of one key: the member is there from this add
        for j = 1, i - 1 do
          if keys[j] == keys[i] then own = true break end
        end
        if not own then
          for j = 1, i - 1 do
            if not ctr[keys[j]] then call('ZREM', keys[j], m) end
          end
          return false
        end
      end
    end
  end
  for i = 1, n do
    if ctr[keys[i]] then
      ctr_add(ctr[keys[i]], keys[i], wps[i], c, counts[i] > 0)
    else
      if not nx then call('ZADD', keys[i], cs, m) end
      local ttl = c - now + wps[i] + 1
      if counts[i] > 0 or call('PEXPIRE', keys[i], ttl, 'NX') == 0 then
        call('PEXPIRE', keys[i], ttl, 'GT')
      end
    end
  end
  return true
end

-- duplicate: the reply to a member already inside a window: nothing changed.
local function duplicate() return {DUPLICATE, 0, -1, 0, 1, now} end

-- inside: whether member m is in one of the log keys (a counter key keeps no members).
local function inside(keys, m)
  for i = 1, #keys do
    if not ctr[keys[i]] and call('ZSCORE', keys[i], m) then return true end
  end
  return false
end

-- suppressed: whether the suppression hash key blocks a send of category (see "R" above).
-- Returns the reason (0: not blocked) and the mark that blocks.
local function suppressed(key, category, exempt)
  local f = call('HMGET', key, '!', 'c:' .. category, '*', '+:' .. category)
  local function live(v)
    if not v then return false end
    local u = tonumber(smatch(v, '^(%d+):'))
    return not u or u == 0 or u > now
  end
  if live(f[1]) then return 1, f[1] end
  if live(f[2]) then return 2, f[2] end
  if live(f[3]) and not exempt and not live(f[4]) then return 3, f[3] end
  return 0, nil
end

-- holds: a live hold key (see "H") closes [now, its end) to every slot: prepended to closed as
-- [0, end), which keeps it sorted. The operation's last nh keys are its hold keys.
local function holds(closed, k0, nk, nh)
  if nh == 0 then return end
  local hk = {}
  for j = 1, nh do hk[j] = KEYS[k0 + nk - nh + j - 1] end
  local vs = call('MGET', unpack(hk)) -- one call for every hold of the check
  for j = 1, nh do
    local v = vs[j]
    local u = v and tonumber(smatch(v, '^(%d+)'))
    if u and u > now then
      table.insert(closed, 1, u)
      table.insert(closed, 1, 0)
    end
  end
end

-- Opcode "H" — hold: KEYS -> the hold key. ARGV -> retry_ms (0: none), base_ms, max_ms, linger_ms,
--   code. Holds the scope until now + retry_ms, or now + base·2^level (at most max) where level
--   grows by one when the key's last hold had already lifted (the key lingers linger_ms after it);
--   a live hold is only ever extended. Value "<until>:<level>:<code>". Returns {until, level,
--   extended (1: a live hold was there)}.
local function hold(k0, a0)
  local arg = args(a0)
  local retry, base, cap, linger = tonumber(arg()), tonumber(arg()), tonumber(arg()), tonumber(arg())
  local code = arg()
  local key = KEYS[k0]
  local cu, lvl = 0, -1
  local cur = call('GET', key)
  if cur then
    local a, b = smatch(cur, '^(%d+):(%d+)')
    cu, lvl = tonumber(a) or 0, tonumber(b) or -1
  end
  local live = cu > now
  local dur = retry
  if retry <= 0 then
    if not live then lvl = lvl + 1 end
    lvl = max(lvl, 0)
    dur = min(base * 2 ^ min(lvl, 30), cap)
  else
    lvl = 0
  end
  local u = max(cu, now + dur)
  call('SET', key, fmt(u) .. ':' .. fmt(lvl) .. ':' .. code, 'PX', fmt(u - now + linger))
  local ext = 0
  if live then ext = 1 end
  return {u, lvl, ext}
end

-- Opcode "L" — lease (in-flight caps): KEYS -> one sorted set of leases per cap (member = holder,
--   score = when its lease lapses). ARGV -> holder, ttl_ms, then per key its max. Drops lapsed
--   leases; when every key has a slot besides the holder's own, (re)takes one in each until
--   now + ttl. Returns {1, 0, 0}, or {0, index of the full key, when its next lease lapses}.
local function lease(k0, a0, nk)
  local arg = args(a0)
  local holder, ttl = arg(), tonumber(arg())
  for i = 0, nk - 1 do call('ZREMRANGEBYSCORE', KEYS[k0 + i], '-inf', fmt(now)) end
  for i = 0, nk - 1 do
    local key, max = KEYS[k0 + i], tonumber(arg())
    local n = call('ZCARD', key)
    if call('ZSCORE', key, holder) then n = n - 1 end
    if n >= max then
      local first = call('ZRANGE', key, 0, 0, 'WITHSCORES')
      return {0, i + 1, tonumber(first[2])}
    end
  end
  for i = 0, nk - 1 do
    call('ZADD', KEYS[k0 + i], fmt(now + ttl), holder)
    call('PEXPIRE', KEYS[k0 + i], fmt(ttl + 1000), 'GT')
    if call('PTTL', KEYS[k0 + i]) < 0 then call('PEXPIRE', KEYS[k0 + i], fmt(ttl + 1000)) end
  end
  return {1, 0, 0}
end

-- Opcode "F" — free: KEYS -> lease keys. ARGV -> holder. Returns {leases removed}.
local function free(k0, a0, nk)
  local holder = ARGV[a0]
  local removed = 0
  for i = 0, nk - 1 do removed = removed + call('ZREM', KEYS[k0 + i], holder) end
  return {removed}
end

local function reserve_op(k0, a0, nk)
  -- The fixed arguments are read by position, not through a reader call each (this runs once per
  -- check); an operation too short for them fails.
  local A = ARGV
  local member, policy, slack, horizon = A[a0], A[a0 + 1], tonumber(A[a0 + 2]), tonumber(A[a0 + 3])
  local book, tmin, late, deadline = A[a0 + 4] == '1', A[a0 + 5], tonumber(A[a0 + 6]), A[a0 + 7]
  if deadline == '' then deadline = nil else deadline = tonumber(deadline) end
  local sttl, nonce, block, n = tonumber(A[a0 + 8]), A[a0 + 9], A[a0 + 10] == '1', tonumber(A[a0 + 11])
  local i0 = a0 + 12
  if not n or i0 + 3 * n >= opend then error('reserve: too few arguments') end
  local keys, limits, wps, drops = {}, {}, {}, {}
  for i = 1, n do
    keys[i] = KEYS[k0 + i - 1]
    limits[i] = tonumber(A[i0])
    wps[i] = tonumber(A[i0 + 1]) + slack
    drops[i] = A[i0 + 2] == '1'
    i0 = i0 + 3
  end
  local nc = tonumber(A[i0])
  if not nc or i0 + 2 * nc + 6 >= opend then error('reserve: too few arguments') end
  local closed = {}
  for j = 1, 2 * nc do closed[j] = tonumber(A[i0 + j]) end
  i0 = i0 + 2 * nc + 1
  local consent, category, exempt = A[i0] == '1', A[i0 + 1], A[i0 + 2] == '1'
  local lastttl, notettl, notev = tonumber(A[i0 + 3]), tonumber(A[i0 + 4]), A[i0 + 5]
  local arg = args(i0 + 6)
  ctr_read(keys, arg)
  holds(closed, k0, nk, tonumber(arg() or '0') or 0)
  local c = start(tmin, late)

  for i = 1, n do trim(keys[i], min(now, c) - wps[i], wps[i]) end

  local skey = nil
  if policy ~= '' then skey = KEYS[k0 + n] end
  local attempt, m, held, heldat = 1, member, false, nil
  local lastkey, notekey = nil, nil
  if skey then
    local st = call('GET', skey)
    if st then
      local kind, k, t, who = smatch(st, '^(%a)(%d+):(%-?%d+):?(.*)$')
      if not kind then error('state key holds ' .. st) end
      k, t = tonumber(k), tonumber(t)
      if kind == 'd' then return {DONE, 0, -1, 0, k, t} end
      if kind == 'a' and nonce ~= '' and who == nonce then
        return {ADMITTED, 0, max(t - now, 0), 0, k, t}
      end
      if kind == 'a' then
        if policy == 'o' then return {UNKNOWN, 0, -1, 0, k, t} end
        if policy == 'd' then return {DUPLICATE, 0, -1, 0, k, t} end
        attempt = k + 1
      else
        attempt, held, heldat = k, true, t
      end
    end
    if attempt > 1 then m = member .. '#' .. attempt end
    if held then
      for i = 1, n do take(keys[i], m, heldat) end
    end
    local kx = k0 + n + 1 -- the keys after the state key
    if block then
      local v = call('GET', KEYS[kx])
      if v then
        if held then call('DEL', skey) end
        return {BLOCKED, 0, -1, 0, attempt, now, tonumber(v) or 0, 0, 0}
      end
      kx = kx + 1
    end
    if consent then
      local reason, mark = suppressed(KEYS[kx], category, exempt)
      if reason > 0 then
        if held then call('DEL', skey) end
        local code, at = 0, 0
        if mark then
          at = tonumber(smatch(mark, '^%d+:(%d+):')) or 0
          code = tonumber(smatch(mark, ':(%d+)$')) or 0
        end
        return {BLOCKED, 0, -1, 0, attempt, now, code, reason, at}
      end
      kx = kx + 1
    end
    if lastttl > 0 then lastkey = KEYS[kx]; kx = kx + 1 end
    if notettl > 0 then notekey = KEYS[kx] end
  end
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
  if not add(keys, wps, counts, c, m, nostate) then return duplicate() end
  if admit then
    if skey then call('SET', skey, 'a' .. attempt .. ':' .. fmt(c) .. ':' .. nonce, 'PX', sttl + wait) end
    if lastkey then call('SET', lastkey, category, 'PX', lastttl) end
    if notekey then call('SET', notekey, notev, 'PX', notettl + wait) end
    return {ADMITTED, rule, wait, remaining, attempt, c}
  end
  if skey then call('SET', skey, 'b' .. attempt .. ':' .. fmt(c) .. ':' .. nonce, 'PX', sttl + wait) end
  return {BOOKED, rule, wait, 0, attempt, c}
end

local function reserve(k0, a0, nk)
  ctr = {}
  local ok, res = pcall(reserve_op, k0, a0, nk)
  ctr_settle()
  if not ok then error(res, 0) end
  return res
end

local function place(k0, a0, nkeys)
  local arg = args(a0)
  local m, slack, tmin, lead = arg(), tonumber(arg()), arg(), tonumber(arg())
  local c = now + lead
  if tmin ~= '' then c = start(tmin, lead) end
  local keys, limits, wps = {}, {}, {}
  for i = 1, nkeys do
    keys[i] = KEYS[k0 + i - 1]
    limits[i] = tonumber(arg())
    wps[i] = tonumber(arg()) + slack
    call('ZREMRANGEBYSCORE', keys[i], '-inf', '(' .. fmt(min(now, c) - wps[i]))
    call('ZREM', keys[i], m)
  end
  local closed = {}
  for j = 1, 2 * tonumber(arg()) do closed[j] = tonumber(arg()) end
  local rule, counts
  c, rule, counts = search(keys, limits, wps, c, closed)
  add(keys, wps, counts, c, m)
  return {c, rule}
end

local function done(k0, a0)
  -- A write Redis never refuses for memory comes first (see the top): at maxmemory the
  -- record still replaces the admission's, a few bytes, so a re-run does not send again.
  local arg = args(a0)
  local attempt, ttl = arg(), arg()
  if guard then call('PEXPIRE', KEYS[k0], ttl) end
  call('SET', KEYS[k0], 'd' .. attempt .. ':' .. fmt(now), 'PX', ttl)
  return {1}
end

local function release(k0, a0, nkeys)
  local arg = args(a0)
  local m, attempt = arg(), tonumber(arg())
  if attempt > 1 then m = m .. '#' .. attempt end
  local rkeys = {}
  for i = 0, nkeys - 2 do rkeys[i + 1] = KEYS[k0 + i] end
  ctr_read(rkeys, arg)
  local skey = KEYS[k0 + nkeys - 1]
  local st = call('GET', skey)
  local at = nil -- the attempt's slot, which a counter key counts it at
  if st then
    local kind, k, t = smatch(st, '^(%a)(%d+):(%-?%d+)')
    if (kind == 'a' or kind == 'b') and tonumber(k) == attempt then at = tonumber(t) end
  end
  local removed = 0
  for i = 1, #rkeys do removed = removed + take(rkeys[i], m, at) end
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

local function state(k0)
  local st = call('GET', KEYS[k0])
  if not st then return {0, 0, 0} end
  local kind, k, t = smatch(st, '^(%a)(%d+):(%-?%d+)')
  if not kind then error('state key holds ' .. st) end
  return {string.byte(kind), tonumber(k), tonumber(t)}
end

local function usage(k0, a0)
  local arg = args(a0)
  local slack, n = tonumber(arg()), tonumber(arg())
  local out = {}
  local ukeys, lims, wins = {}, {}, {}
  for i = 1, n do
    ukeys[i] = KEYS[k0 + i - 1]
    lims[i], wins[i] = tonumber(arg()), tonumber(arg())
  end
  ctr_read(ukeys, arg)
  for i = 1, n do
    local key, limit, window = ukeys[i], lims[i], wins[i]
    if ctr[key] then
      for _, v in ipairs(ctr_usage(ctr[key], key, limit, window, slack)) do out[#out + 1] = v end
    else
      local from, nowf = fmt(now - window), fmt(now)
      local used = call('ZCOUNT', key, from, nowf)
      local booked = call('ZCOUNT', key, '(' .. nowf, '+inf')
      local oldest, newest = -1, -1
      local o = call('ZRANGEBYSCORE', key, from, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      if #o > 0 and tonumber(o[2]) <= now then oldest = tonumber(o[2]) end
      local nw = call('ZRANGE', key, -1, -1, 'WITHSCORES')
      if #nw > 0 then newest = tonumber(nw[2]) end
      local nextfree = earliest(key, limit, window + slack, now)
      if nextfree == nil then nextfree = past(key, limit, window + slack, now) end
      out[#out + 1] = used
      out[#out + 1] = booked
      out[#out + 1] = oldest
      out[#out + 1] = newest
      out[#out + 1] = nextfree
    end
  end
  return out
end

local ops = {R = reserve, P = place, D = done, X = release, S = state, U = usage, H = hold, L = lease, F = free}

-- main runs one call: the batch of operations in keys and argv (the layout at the top). Redis
-- runs it as the function the library registers (FCALL: the definitions above are made once,
-- when the library loads) or, where there are no functions, as the script's last line (EVAL).
local function main(keys, argv, script)
  KEYS, ARGV, opend, guard = keys, argv, #argv + 1, script == true
  tonumber, tostring, type, pcall, error, pairs, ipairs, unpack = _G.tonumber, _G.tostring, _G.type, _G.pcall, _G.error, _G.pairs, _G.ipairs, _G.unpack
  floor, min, max, sformat, smatch, call = math.floor, math.min, math.max, string.format, string.match, redis.call
  if ARGV[1] == '' then
    local t = call('TIME')
    now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
  else
    now = tonumber(ARGV[1])
  end
  local out = {now}
  local ka, aa = 1, 3
  for j = 1, tonumber(ARGV[2]) do
    local code, nk, na = ARGV[aa], tonumber(ARGV[aa + 1]), tonumber(ARGV[aa + 2])
    local fn = ops[code]
    opend = aa + 3 + (na or 0)
    ctr = {} -- an operation's counter descriptors are its own
    local ok, res
    if fn then
      ok, res = pcall(fn, ka, aa + 3, nk)
    else
      ok, res = false, 'unknown opcode ' .. tostring(code)
    end
    if ok then
      out[#out + 1] = res
    else
      local msg = res
      if type(res) == 'table' then msg = res.err or 'error' end
      out[#out + 1] = {-1, tostring(msg)}
    end
    ka, aa = ka + nk, aa + 3 + na
  end
  return out
end
-- (scripts.go appends the line that runs or registers main.)
