-- op_place.lua — Opcode "P", place: a check whose limits live in several groups, on Redis
-- Cluster, puts the member in the limits outside its own group first (throttle's across.go).
-- Takes the member's earlier entry back and adds it at the earliest slot every rule takes from
-- now + lead_ms, or from tmin_ms when that is later or at most lead_ms earlier.
--
-- KEYS[1..n]  -> n × rule: per rule a sorted set (score = ms of a send, member = its id)
--
-- ARGV[1]     -> member: the send's id (with "#<attempt>" past the first), as stored
-- ARGV[2]     -> slack_ms: a send may land up to this long after its slot
-- ARGV[3]     -> tmin_ms: the slot the groups placed so far agree on ("" none)
-- ARGV[4]     -> lead_ms: how far ahead of now the search starts
-- ARGV[5]     -> nc: the number of closed intervals
-- ARGV[6...]  -> n × limit, window_ms
-- ARGV[...]   -> nc × start_ms, end_ms: sorted; no slot lies in [start, end)
--
-- Returns {slot_ms, rule}: rule is the 1-based index of the rule that set the slot (0: none).

local function place(nk)
  local member, slack, tmin, lead, nc = arg(5)
  slack, lead, nc = tonumber(slack), tonumber(lead), tonumber(nc)
  local keys = {key(nk)}
  local limits, wps = cols(nk, 2) -- wps: window_ms, made window + slack below
  local c = now + lead
  if tmin ~= '' then c = start(tmin, lead) end
  for i = 1, nk do
    limits[i], wps[i] = tonumber(limits[i]), tonumber(wps[i]) + slack
    -- The first write, one Redis never refuses (limiter.lua, "Memory").
    call('ZREMRANGEBYSCORE', keys[i], '-inf', '(' .. fmt(min(now, c) - wps[i]))
    call('ZREM', keys[i], member)
  end
  local closed = {}
  if nc > 0 then closed = numbers(2 * nc) end
  local rule, counts
  c, rule, counts = search(keys, limits, wps, c, closed)
  add(keys, wps, counts, c, member)
  return {c, rule}
end

ops.P, opnames.P = place, 'place'
