-- limiter_prelude.lua — what every part of the limiter library uses: the globals it binds to
-- locals, the statuses of "R", the call's state (KEYS, ARGV, now, guard), and the readers an
-- operation takes its own KEYS and ARGV with, in the order its header lists them.

-- The globals used per check, bound to locals by main on each call (a global is a table lookup
-- each time it is named; a library loads where they cannot be read).
local tonumber, tostring, type, pcall, error, pairs, ipairs, unpack, next
local floor, min, max, sformat, smatch, call

local function fmt(x) return sformat('%d', x) end

-- The statuses of "R", as throttle.Status numbers them (TestLuaStatusCodes checks both agree).
local DENIED, ADMITTED, DUPLICATE, DONE, BOOKED, UNKNOWN, EXPIRED, DROPPED, BLOCKED = 0, 1, 2, 3, 4, 5, 6, 7, 8

local KEYS, ARGV -- the call's, set by main
local now -- the call's clock reading, set by main
-- guard: run as a script (EVAL), where Redis refuses a first write that could grow memory at
-- maxmemory, so every writing operation begins with a write it never refuses (limiter.lua,
-- "Memory"). As a function (allow-oom) every write goes through, and those writes are left out.
local guard

-- The operation being run, set by main before each: its opcode, its KEYS from keyat up to
-- keyend and its ARGV from argat up to opend (both ends exclusive).
local opcode, keyat, keyend, argat, opend

-- The operations by opcode, and their names: each op_*.lua adds its own; main dispatches.
local ops, opnames = {}, {}

-- arg reads the operation's ARGV in order: arg() gives the next value, nil past the operation's
-- own ARGV (so optional trailing values — counter descriptors, holds — read as absent, never as
-- the next operation's); arg(k) gives the next k values at once, and fails when fewer are left.
local function arg(k)
  local i = argat
  if k == nil then
    if i >= opend then return nil end
    argat = i + 1
    return ARGV[i]
  end
  argat = i + k
  if argat > opend then error(opnames[opcode] .. ': too few arguments') end
  return unpack(ARGV, i, argat - 1)
end

-- cols reads a repeat of the header, "n × a, b" or "n × a, b, c" (k = 2 or 3 values a group),
-- at once: it gives the lists of the groups' first, second (and third) values.
local function cols(n, k)
  local i = argat
  argat = i + n * k
  if argat > opend then error(opnames[opcode] .. ': too few arguments') end
  local a, b, c = {}, {}, nil
  if k == 3 then c = {} end
  for j = 1, n do
    a[j], b[j] = ARGV[i], ARGV[i + 1]
    if c then c[j] = ARGV[i + 2] end
    i = i + k
  end
  return a, b, c
end

-- numbers reads the next k values as a list of numbers.
local function numbers(k)
  local l = {arg(k)}
  for j = 1, k do l[j] = tonumber(l[j]) end
  return l
end

-- key reads the operation's KEYS in order, the way arg reads its ARGV.
local function key(k)
  local i = keyat
  if k == nil then
    if i >= keyend then return nil end
    keyat = i + 1
    return KEYS[i]
  end
  keyat = i + k
  if keyat > keyend then error(opnames[opcode] .. ': too few keys') end
  return unpack(KEYS, i, keyat - 1)
end

-- none: an empty list, shared (a list that is empty costs no table).
local none = {}
