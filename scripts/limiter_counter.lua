-- limiter_counter.lua — counter rules: a calendar period's fixed counter ("c") or a sliding
-- window kept as counts per bucket ("b"), in a hash instead of a sorted set: field = the period's
-- or bucket's start in ms, value = its count, and beside them "t", the total of the counts, and
-- "o", a start no count held is older than. This file reads them (the descriptors, the earliest
-- fit); limiter_counter_write.lua counts, takes back and trims them.
--
-- An operation names its counter keys in descriptors after its other ARGV (the "counters" of its
-- header); every other rule key stays a sliding log:
-- counters[1]   -> k: how many of the operation's rule keys are counter keys (absent: none)
-- counters[...] -> k × index, ms, nb, nb × start_ms: per counter key, its 1-based index among
--                  the operation's rule keys; a bucketed key ("b") has nb 0 and ms its bucket's
--                  length, a calendar key ("c") ms its nominal window and nb > 0 period starts,
--                  ascending (outside them the first or last period's length repeats)
--
-- A check whose total leaves room pays for little: a calendar check reads "o" and "t" and adds
-- its count; a bucketed check counts itself in "t" as it reads it (HINCRBY, taken back unless it
-- is admitted or booked) and adds its bucket's count, three calls in all; old counts are dropped
-- once per period, or once per TRIM_LAG buckets, not per check. A calendar slot lies at least
-- slack before its period's end, so the send lands in the period that counts it. A bucketed
-- rule treats every bucket a span of window+slack can touch as wholly inside it (a bucket
-- straddling the span's start counts whole): it never admits what the exact log would not, and
-- admits whatever a log of window+slack rounded up to whole buckets, plus one bucket, would.

-- ctr: the operation's counter keys, by key, each with its descriptor (main starts it empty).
local ctr = {}
-- How many gone buckets a bucketed key keeps before a trim drops them together.
local TRIM_LAG = 4
local ctr_prune -- limiter_counter_write.lua

-- ctr_read reads the operation's counter descriptors (after its other ARGV) for its rule keys.
local function ctr_read(keys)
  local k = tonumber(arg() or '0') or 0
  for _ = 1, k do
    local i, ms, nb = arg(3)
    nb = tonumber(nb)
    local d
    if nb == 0 then
      d = {kind = 'b', w = tonumber(ms)}
    else
      d = {kind = 'c', win = tonumber(ms), b = numbers(nb)}
    end
    ctr[keys[tonumber(i)]] = d
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
