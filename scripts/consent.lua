-- consent.lua — the consent rule: whether a recipient's suppression hash blocks a send of one
-- category. One file, two uses: the limiter library joins it (op_reserve.lua reads the hash in
-- the call that admits the send, with no extra round trip), and consent_check.lua runs it alone
-- (consent.Store.Check). consent.State.Blocks, the same decision in Go, is checked against both
-- on random histories (consent: TestCheckScriptAgreesWithBlocks).
--
-- The hash's fields (consent/record.lua writes them) hold "<until_ms>:<at_ms>:<source>:<code>",
-- until 0: no end. A field counts while its until is 0 or after now; a value that does not start
-- with a number counts too (fail closed). In this order:
--   "!"        -> blocked, reason 1 (undeliverable), exempt or not
--   "c:<cat>"  -> blocked, reason 2 (the category is opted out), exempt or not
--   "*"        -> blocked, reason 3 (every category is), unless exempt or "+:<cat>" counts
-- One HMGET: O(1). It reads now, call, smatch and tonumber: locals of the file that joins it.

-- suppressed: the reason the suppression hash key blocks a send of category (0: not blocked)
-- and the value of the field that blocks it.
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
