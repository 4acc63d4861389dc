-- series.lua — how one window of the limiter filled over a span of time, read at one instant
-- of one clock. Read-only: it writes nothing and trims nothing.
--
-- KEYS[1] -> the window's sorted set (score = ms of an admission or a booked slot).
-- ARGV[1] -> now in ms, or "" to read the Redis server clock (TIME). Explicit now is for tests/tools.
-- ARGV[2] -> window_ms: the rule's window.
-- ARGV[3] -> step_ms: the length of one step.
-- ARGV[4] -> steps n (≥ 1): the span read is the n steps before now; the last one ends at now.
--
-- Step i (1-based, oldest first) ends at end_i = now - (n - i) * step_ms.
-- Returns {now_ms, booked, count_1, ..., count_n, in_1, ..., in_n}:
--   booked   entries scored after now (slots booked ahead)
--   count_i  entries in (end_i - step_ms, end_i]: the admissions of step i
--   in_i     entries in [now - window_ms, end_i]: how many of the admissions inside the window
--            now had been made at the end of step i (an entry scored exactly now - window is
--            inside); -1 for a step that ends before the window begins.

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local window, step, n = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local key = KEYS[1]
local function fmt(x) return string.format('%d', x) end

local start = now - window
local out = {now, redis.call('ZCOUNT', key, '(' .. fmt(now), '+inf')}
for i = 1, n do
  local hi = now - (n - i) * step
  out[2 + i] = redis.call('ZCOUNT', key, '(' .. fmt(hi - step), fmt(hi))
  if hi >= start then
    out[2 + n + i] = redis.call('ZCOUNT', key, fmt(start), fmt(hi))
  else
    out[2 + n + i] = -1
  end
end
return out
