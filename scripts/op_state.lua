-- op_state.lua — Opcode "S", state (read-only): a member's record, for a check across Cluster
-- groups that must know the attempt before it places it (throttle's across.go).
--
-- KEYS[1]     -> state: the member's record
--
-- Returns {kind, attempt, at_ms}: kind 0 when there is no record (attempt and at 0), else the
-- record's letter as a byte (98 'b' booked, 97 'a' admitted, 100 'd' done); an error for a
-- record this script cannot read.

local function state()
  local st = call('GET', key())
  if not st then return {0, 0, 0} end
  local kind, k, t = smatch(st, '^(%a)(%d+):(%-?%d+)')
  if not kind then error('state key holds ' .. st) end
  return {string.byte(kind), tonumber(k), tonumber(t)}
end

ops.S, opnames.S = state, 'state'
