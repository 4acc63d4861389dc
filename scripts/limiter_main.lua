-- limiter_main.lua — main: one call of the library, a batch of operations on one clock reading
-- (the layout is in limiter.lua). Redis runs it as the function the library registers (FCALL:
-- every definition before it is made once, when the library loads) or, where there are no
-- functions, as the script's last line (EVAL); scripts.go appends the line that does either.

local function main(keys, argv, script)
  KEYS, ARGV, guard = keys, argv, script == true
  tonumber, tostring, type, pcall, error, pairs, ipairs, unpack, next = _G.tonumber, _G.tostring, _G.type, _G.pcall, _G.error, _G.pairs, _G.ipairs, _G.unpack, _G.next
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
    -- The operation's KEYS and ARGV, for key and arg (limiter_prelude.lua).
    opcode, keyat, keyend, argat, opend = code, ka, ka + (nk or 0), aa + 3, aa + 3 + (na or 0)
    if next(ctr) ~= nil then ctr = {} end -- an operation's counter descriptors are its own
    if next(dst) ~= nil then dst = {} end -- and its distinct ones
    local ok, res
    if fn then
      ok, res = pcall(fn, nk)
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
