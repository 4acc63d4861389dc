-- limiter_distinct.lua — distinct-count rules ("LIMIT/WINDOW@distinct"): at most limit distinct
-- subjects (e.g. recipients) sent to in any window, a subject sent to again inside its window
-- costing nothing. One sorted set per rule key holds two kinds of members:
--   <subject>    a subject's latest admitted send: score = its ms. A subject counts at t while
--                its latest send is at or after t - window (it "leaves the window" one window
--                after its LAST send: a repeat keeps it counted, Meta's moving 24 hours).
--   ~<subject>   a new subject's place in the queue (its sends wait for a slot): score = OFF +
--                its slot, so bookings and admissions never share a score range.
-- An admission is decided on the admitted members alone (bookings are a queue, never presence):
-- a new subject needs fewer than limit others counted at its slot (and, so that a due booking is
-- not overtaken, fewer than limit together with the bookings due by then); a repeat needs
-- fewer than limit others counted one window after the subject's latest send, where its own
-- presence grows. Presence is only ever over-stated (a subject's latest send stands for all of
-- its sends; an admission given back keeps counting until its window passes), so no instant
-- ever holds more than limit distinct subjects; a booking may have to wait again when a repeat
-- extended a subject it waited for. A new subject that does not fit is booked where the
-- admitted and the booked, together, first leave room: the oldest counted subject's exit,
-- then the next one's for the next booking.
--
-- An operation names its distinct keys in descriptors after its counters (the "distinct" of
-- its header):
-- distinct[1]   -> k: how many of the operation's rule keys are distinct keys (absent: none)
-- distinct[...] -> k × index, subject: per distinct key, its 1-based index among the
--                  operation's rule keys and the subject it counts, keyed ("" for a read)
--
-- Read and written by: limiter_search.lua (trim, take, earliest, past, add) and op_usage.lua;
-- op_reserve.lua tells a booked send's place in the queue when it is placed again (d.p) and
-- the end of the horizon it admits within (d.h).

-- dst: the operation's distinct keys, by key (main starts it empty).
local dst = {}
-- OFF: the score offset of bookings (2^50: ms since 1970 stay below 2^42, sums below 2^53).
local OFF = 1125899906842624

-- dst_read reads the operation's distinct descriptors (after its counters).
local function dst_read(keys)
  local k = tonumber(arg() or '0') or 0
  for _ = 1, k do
    local i, s = arg(2)
    dst[keys[tonumber(i)]] = {s = s}
  end
end

-- dst_own: the subject's latest admitted send (nil: none), read once per operation.
local function dst_own(d, key)
  if d.own == nil then
    d.own = false
    if d.s ~= '' then d.own = tonumber(call('ZSCORE', key, d.s)) or false end
  end
  return d.own or nil
end

-- dst_others: the admitted subjects other than the check's own counted at t.
local function dst_others(d, key, wp, t)
  local n = call('ZCOUNT', key, fmt(t - wp), fmt(OFF - 1))
  local own = dst_own(d, key)
  if own and own >= t - wp then n = n - 1 end
  return n
end

-- dst_booked: the check's subject's own booking (its slot; nil: none), read once.
local function dst_booked(d, key)
  if d.bk == nil then
    d.bk = false
    if d.s ~= '' then
      local b = tonumber(call('ZSCORE', key, '~' .. d.s))
      if b then d.bk = b - OFF end
    end
  end
  return d.bk or nil
end

-- dst_queued: the bookings of other subjects with a slot in [lo, hi].
local function dst_queued(d, key, lo, hi)
  if hi < lo then return 0 end
  local n = call('ZCOUNT', key, fmt(OFF + lo), fmt(OFF + hi))
  local b = dst_booked(d, key)
  if b and b >= lo and b <= hi then n = n - 1 end
  return n
end

-- dst_nth: the score of the j-th newest admitted subject other than the check's own.
local function dst_nth(d, key, j)
  local nb = call('ZCOUNT', key, fmt(OFF), '+inf') -- bookings rank above every admission
  local r = nb + j - 1
  local own = dst_own(d, key)
  if own then
    local rk = call('ZREVRANK', key, d.s)
    if rk and rk <= r then r = r + 1 end
  end
  local e = call('ZREVRANGE', key, r, r, 'WITHSCORES')
  return tonumber(e[2])
end

-- dst_new: the first time >= c at which a new subject fits. Bookings are a queue of subjects in
-- the order of their slots; the check's place in it is p, the slot it held (d.p, a booking placed
-- again), else its end. It fits at c when fewer than limit others are admitted and the bookings
-- ahead of it that are due; else it joins its subject's booking, if one lies ahead, or takes the
-- exit that is its turn: the admitted and the bookings ahead of it, as one queue by time, leave
-- room one window after the limit-th newest.
local function dst_new(d, key, limit, wp, c)
  local p = d.p or (OFF - 1)
  local others = dst_others(d, key, wp, c)
  local due = dst_queued(d, key, c - wp, min(c, p - 1))
  if others + due < limit then return c, others + due end
  local b = dst_booked(d, key)
  if b and b > c and not d.p then return b, limit - 1 end
  -- A later send of a subject that holds a place: booked for c, it will find the subject
  -- counted (admitted at b) and go as a repeat, so it takes no place of its own. Only a booking:
  -- an admission (c within the horizon, d.h) needs the room itself.
  if b and b <= c and c <= b + wp and d.h and c > d.h then return c, limit - 1 end
  local ahead = dst_queued(d, key, c - wp, p - 1)
  if ahead >= limit then
    local e = call('ZREVRANGEBYSCORE', key, '(' .. fmt(OFF + p), fmt(OFF + c - wp), 'WITHSCORES', 'LIMIT', limit - 1, 2)
    local x = tonumber(e[2])
    -- the subject's own place, when it ranks at or above that one, is not ahead of it
    if b and b >= c - wp and b < p and OFF + b >= x and #e > 2 then x = tonumber(e[4]) end
    return x - OFF + wp + 1, limit - 1
  end
  return dst_nth(d, key, limit - ahead) + wp + 1, limit - 1
end

-- dst_earliest: the first time >= c at which the check's subject fits, and the others counted.
local function dst_earliest(d, key, limit, wp, c)
  local own = dst_own(d, key)
  if not own or own < c - wp then return dst_new(d, key, limit, wp, c) end
  if own > c then
    -- Admitted for a later instant already: a send at c adds [c, own) to its presence.
    local others = dst_others(d, key, wp, c)
    if others < limit then return c, others end
    return own, limit - 1
  end
  -- Counted at c: a repeat costs nothing unless its presence, now ending one window after c,
  -- would cross an instant the others fill.
  local beyond = dst_others(d, key, wp, own + wp + 1)
  if beyond < limit then return c, beyond end
  return dst_new(d, key, limit, wp, own + wp + 1)
end

-- dst_past: a time >= c after every admission and booking of the key has left its window.
local function dst_past(key, wp, c)
  local top = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #top == 0 then return c end
  local t = tonumber(top[2])
  if t >= OFF then t = t - OFF end
  local adm = call('ZREVRANGEBYSCORE', key, fmt(OFF - 1), '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #adm > 0 then t = max(t, tonumber(adm[2])) end
  return max(c, t + wp + 1)
end

-- dst_trim: drops the admissions and bookings no check from x on can see.
local function dst_trim(key, x)
  call('ZREMRANGEBYSCORE', key, '-inf', '(' .. fmt(x))
  call('ZREMRANGEBYSCORE', key, fmt(OFF), '(' .. fmt(OFF + x))
end

-- dst_add: counts the subject at c: an admission moves its latest send to c (never back) and
-- ends its booking; a booking of a subject not counted at c queues it as ~subject at c (one
-- place per subject, whatever its sends); a repeat's booking adds nothing.
local function dst_add(d, key, wp, c, booking)
  if d.s == '' then return end
  local own = dst_own(d, key)
  if booking then
    if own and own >= c - wp then return end
    local b = dst_booked(d, key)
    if b and b <= c and c <= b + wp then return end -- the subject's place comes first
    call('ZADD', key, fmt(OFF + c), '~' .. d.s)
    d.bk = c
    return
  end
  if not own or c > own then
    call('ZADD', key, fmt(c), d.s)
    d.own = c
  end
  if dst_booked(d, key) then call('ZREM', key, '~' .. d.s) d.bk = false end
end

-- dst_take: gives back a booking held for t (a booked send placed again, or released): the
-- subject's place in the queue, when it is still the one t holds.
local function dst_take(d, key, t)
  if not t or d.s == '' then return 0 end
  local b = dst_booked(d, key)
  if b ~= t then return 0 end
  d.bk = false
  return call('ZREM', key, '~' .. d.s)
end

-- dst_usage: "U"'s five values for a distinct key: subjects counted now, sends ahead (admitted
-- ahead and bookings), the oldest counted subject's latest send, the newest entry, next free slot.
local function dst_usage(d, key, limit, window, slack)
  local from, nowf = fmt(now - window), fmt(now)
  local used = call('ZCOUNT', key, from, nowf)
  local booked = call('ZCOUNT', key, '(' .. nowf, '+inf')
  local oldest, newest = -1, -1
  local o = call('ZRANGEBYSCORE', key, from, nowf, 'WITHSCORES', 'LIMIT', 0, 1)
  if #o > 0 then oldest = tonumber(o[2]) end
  local nw = call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #nw > 0 then
    newest = tonumber(nw[2])
    if newest >= OFF then newest = newest - OFF end
  end
  local nextfree = dst_new(d, key, limit, window + slack, now)
  return {used, booked, oldest, newest, nextfree}
end
