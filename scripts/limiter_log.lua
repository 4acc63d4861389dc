-- limiter_log.lua — a sliding log's earliest fit: where in a rule's sorted set (score = ms of
-- a send, member = its id) one more entry keeps the rule, reading only what it needs.
-- limiter_search.lua dispatches to these for log keys and to limiter_counter.lua's for counters.

-- Entries read past the limit when looking for a gap; beyond them the slot goes after the key's end.
local LOOK = 64

-- log_earliest: the first time >= c at which key takes one more entry: no span of wp ms that
-- contains it holds limit entries. Spans holding limit entries block [last - wp, first + wp];
-- those blocks are ordered by both ends, so one pass finds the first gap. Returns the time and
-- the count of entries within wp of it, or nil when the gap lies past the entries read.
--
-- It reads only what it needs: one ZCOUNT when the key has room at c (the common admission);
-- when it has none and nothing lies after c (a full window, no bookings ahead: the common
-- denial), the slot is just after the limit-th newest entry leaves, read alone; otherwise the
-- spans are walked by rank, each span's first and last entry read in chunks that double (4, 8,
-- 16, …; one read of both when the limit is small), up to LOOK spans past the first.
local function log_earliest(key, limit, wp, c)
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
      -- A span starting more than wp after c, and every later one, ends after c + wp: none
      -- can hold c, which the spans before it left free.
      if first > c + wp then return c, limit - 1 end
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

-- log_past: a time >= c after every entry of key and at least wp+1 after its limit-th newest
-- entry: one more entry fits there and anywhere later.
local function log_past(key, limit, wp, c)
  local last = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last > 0 then c = max(c, tonumber(last[2])) end
  if call('ZCARD', key) >= limit then
    local kth = call('ZRANGE', key, -limit, -limit, 'WITHSCORES')
    c = max(c, tonumber(kth[2]) + wp + 1)
  end
  return c
end
