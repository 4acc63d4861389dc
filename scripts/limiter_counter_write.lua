-- limiter_counter_write.lua — counter rules (limiter_counter.lua): a check's first calls on a
-- counter key (ctr_begin, ctr_trim), counting an entry (ctr_add), taking one back (ctr_take,
-- ctr_settle), dropping the counts no check can see (ctr_prune), and "U"'s reading (ctr_usage).

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
-- Redis never refuses for memory (limiter.lua, "Memory"), and a useful one: the TTL an entry in the
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
  -- The operation's first write, which Redis never refuses for memory (limiter.lua, "Memory"): a no-op
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
