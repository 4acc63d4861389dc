-- limiter_search.lua — what an operation does to any rule key, a sliding log's (limiter_log.lua)
-- or a counter's (limiter_counter*.lua) alike: trim, take an entry back, find the earliest fit;
-- then the search for the earliest slot every rule of a check takes, outside the closed spans
-- (quiet hours, holds), and the add that puts an entry there in every key.

-- trim: drops from key what no check from x on can see: a check's first write on a key, one
-- Redis never refuses (limiter.lua, "Memory"); on a counter key, ctr_begin or ctr_trim.
local function trim(key, x, wp)
  if dst[key] then return dst_trim(key, x) end
  local d = ctr[key]
  if d then
    if d.kind == 'b' then return ctr_begin(d, key, x, wp) end
    return ctr_trim(d, key, x, wp)
  end
  call('ZREMRANGEBYSCORE', key, '-inf', '(' .. fmt(x))
end

-- take: takes member m back from key (on a counter key, the count at t, the attempt's recorded
-- slot; none without it) and returns how many entries it removed.
local function take(key, m, t)
  -- A distinct key gives back a booking; an admission keeps counting (its subject's earlier
  -- sends are not kept apart from it), never under-stating presence.
  if dst[key] then return dst_take(dst[key], key, t) end
  local d = ctr[key]
  if d then
    if t then return ctr_take(d, key, t) end
    return 0
  end
  return call('ZREM', key, m)
end

-- earliest: the first time >= c at which key takes one more entry, and the entries within wp of
-- it (limiter_log.lua, limiter_counter.lua); nil when a log's gap lies past the entries read.
local function earliest(key, limit, wp, c)
  if dst[key] then return dst_earliest(dst[key], key, limit, wp, c) end
  local d = ctr[key]
  if d then return ctr_earliest(d, key, limit, wp, c) end
  return log_earliest(key, limit, wp, c)
end

-- past: a time >= c after everything key holds: one more entry fits there and anywhere later.
local function past(key, limit, wp, c)
  if dst[key] then return dst_past(key, wp, c) end
  local d = ctr[key]
  if d then return ctr_past(d, key, wp, c) end
  return log_past(key, limit, wp, c)
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
    -- No gap among the entries read (a deep backlog): the slot goes after the key's end, as
    -- the loop below would put it, without walking the same entries again.
    if x == nil then x = past(keys[1], limits[1], wps[1], c) end
    local y, cnt2 = earliest(keys[1], limits[1], wps[1], x)
    if y == x then return x, 1, {cnt2} end
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
-- booking: the slot is booked, not admitted (a distinct key queues it: limiter_distinct.lua).
local function add(keys, wps, counts, c, m, nx, booking)
  local n, cs = #keys, fmt(c)
  if nx then
    for i = 1, n do
      if not ctr[keys[i]] and not dst[keys[i]] and call('ZADD', keys[i], 'NX', cs, m) == 0 then
        local own = false -- two rules of one key: the member is there from this add
        for j = 1, i - 1 do
          if keys[j] == keys[i] then own = true break end
        end
        if not own then
          for j = 1, i - 1 do
            if not ctr[keys[j]] and not dst[keys[j]] then call('ZREM', keys[j], m) end
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
      if dst[keys[i]] then
        dst_add(dst[keys[i]], keys[i], wps[i], c, booking)
      elseif not nx then
        call('ZADD', keys[i], cs, m)
      end
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
    if not ctr[keys[i]] and not dst[keys[i]] and call('ZSCORE', keys[i], m) then return true end
  end
  return false
end

-- holds: a live hold key (op_hold.lua) closes [now, its end) to every slot: prepended to closed
-- as [0, end), which keeps it sorted. hkeys: the operation's hold keys.
local function holds(closed, hkeys)
  local nh = #hkeys
  if nh == 0 then return end
  local vs = call('MGET', unpack(hkeys)) -- one call for every hold of the check
  for j = 1, nh do
    local v = vs[j]
    local u = v and tonumber(smatch(v, '^(%d+)'))
    if u and u > now then
      table.insert(closed, 1, u)
      table.insert(closed, 1, 0)
    end
  end
end
