-- record.lua — apply one consent event to a recipient's suppression hash and append it to the
-- recipient's ledger, in one atomic step (so the hash is always what the ledger's events, in
-- order, leave behind).
--
-- KEYS[1] -> the suppression hash of (tenant, channel, recipient): <prefix>:{<tenant>}:consent:<channel>:<hmac>
-- KEYS[2] -> the ledger list of the same: <prefix>:{<tenant>}:ledger:<channel>:<hmac>
-- KEYS[3] -> action "migrate" only: the recipient's entry on delivery's old suppression list,
--            <prefix>:{<tenant>}:suppressed:<channel>:<hmac> (a string: the provider's error code)
-- ARGV[1] -> now in ms, or "" to read the Redis server clock (TIME). Explicit now is for tests/tools.
-- ARGV[2] -> action: out | in | undeliverable | review | migrate
-- ARGV[3] -> source: keyword | one-click | bounce | complaint | api | cli | provider
-- ARGV[4] -> scope: "*" (every category) or categories separated by ","
-- ARGV[5] -> code: the provider's error code or the SMTP reply code, decimal, 0 for none
-- ARGV[6] -> until: ms at which the mark lapses, 0 for never
-- ARGV[7] -> ref: the message id, provider SID or request id that carried the event, "" for none
-- ARGV[8] -> keyword: the canonical keyword matched ("STOP"), "" for none
-- ARGV[9] -> the ledger's retention in ms
-- ARGV[10] -> the ledger's bound on events per recipient
--
-- The hash's fields, each "<until_ms>:<at_ms>:<source>:<code>" (until 0: no end; at: the latest
-- event that set it):
--   "!"           undeliverable: blocks every category, exempt ones too
--   "*"           opted out of every category: blocks all but the categories the tenant declares exempt
--   "c:<cat>"     opted out of one category: blocks it, exempt or not
--   "+:<cat>"     opted back in to one category while "*" stands
-- out "*" sets "*" and drops every "+:"; out of categories sets their "c:" and drops their "+:";
-- in "*" deletes the hash; in of categories drops their "c:" and, while "*" stands, sets their
-- "+:"; undeliverable sets "!"; review changes nothing. A mark set again keeps the later of the
-- two ends (never is latest). Lapsed fields are dropped here; the hash expires with its last
-- mark's end, or never.
--
-- The ledger is a list, oldest first, of "<at_ms>|<action>|<source>|<scope>|<code>|<until_ms>|<ref>|<keyword>".
-- Each call appends one entry, drops entries older than the retention and the oldest beyond the
-- bound, and sets the list's TTL to the retention.
--
-- Memory: the first write is a PEXPIRE, which Redis never refuses, so at maxmemory under
-- noeviction the script still runs whole: an opt-out is never lost to a full server.
--
-- Returns {now_ms, recorded}: recorded is 0 only for "migrate" when there was no old entry.

local function fmt(x) return string.format('%d', x) end

local now
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(ARGV[1])
end
local hkey, lkey = KEYS[1], KEYS[2]
local action, source, scope, code = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local untl = tonumber(ARGV[6])
local ref, word = ARGV[7], ARGV[8]
local retention, bound = tonumber(ARGV[9]), tonumber(ARGV[10])

redis.call('PEXPIRE', lkey, retention)

if action == 'migrate' then
  local old = redis.call('GET', KEYS[3])
  if not old then return {now, 0} end
  local pttl = redis.call('PTTL', KEYS[3])
  redis.call('DEL', KEYS[3])
  code = string.match(old, '^%d+$') or '0'
  if pttl > 0 then untl = now + pttl else untl = 0 end
  action, source, scope = 'undeliverable', 'provider', '*'
end

-- lapse is a stored value's until, nil when unreadable (which counts as never lapsing).
local function lapse(v) return tonumber(string.match(v, '^(%d+):')) end
local function live(v)
  if not v then return false end
  local u = lapse(v)
  return not u or u == 0 or u > now
end
local function mark(field)
  local u = untl
  local cur = redis.call('HGET', hkey, field)
  if live(cur) then
    local cu = lapse(cur) or 0
    if u == 0 or cu == 0 then u = 0 else u = math.max(u, cu) end
  end
  redis.call('HSET', hkey, field, fmt(u) .. ':' .. fmt(now) .. ':' .. source .. ':' .. code)
end

local cats = {}
if scope ~= '*' then
  for c in string.gmatch(scope, '[^,]+') do cats[#cats + 1] = c end
end

if action == 'out' then
  if scope == '*' then
    mark('*')
    for _, k in ipairs(redis.call('HKEYS', hkey)) do
      if string.sub(k, 1, 2) == '+:' then redis.call('HDEL', hkey, k) end
    end
  else
    for _, c in ipairs(cats) do
      mark('c:' .. c)
      redis.call('HDEL', hkey, '+:' .. c)
    end
  end
elseif action == 'in' then
  if scope == '*' then
    redis.call('DEL', hkey)
  else
    local all = live(redis.call('HGET', hkey, '*'))
    for _, c in ipairs(cats) do
      redis.call('HDEL', hkey, 'c:' .. c)
      if all then redis.call('HSET', hkey, '+:' .. c, '0:' .. fmt(now) .. ':' .. source .. ':' .. code) end
    end
  end
elseif action == 'undeliverable' then
  mark('!')
elseif action ~= 'review' then
  return redis.error_reply('consent: unknown action ' .. action)
end

-- Drop lapsed marks (and re-consents once "*" is gone); the hash lives as long as its longest mark.
local h = redis.call('HGETALL', hkey)
local all = false
for i = 1, #h, 2 do
  if h[i] == '*' and live(h[i + 1]) then all = true end
end
local keep, forever, last = 0, false, 0
for i = 1, #h, 2 do
  local f, v = h[i], h[i + 1]
  if not live(v) or (string.sub(f, 1, 2) == '+:' and not all) then
    redis.call('HDEL', hkey, f)
  else
    keep = keep + 1
    local u = lapse(v)
    if not u or u == 0 then forever = true else last = math.max(last, u) end
  end
end
if keep > 0 then
  if forever then redis.call('PERSIST', hkey) else redis.call('PEXPIRE', hkey, last - now) end
end

redis.call('RPUSH', lkey, fmt(now) .. '|' .. action .. '|' .. source .. '|' .. scope .. '|' .. code .. '|' ..
  fmt(untl) .. '|' .. ref .. '|' .. word)
local n = redis.call('LLEN', lkey)
if n > bound then redis.call('LTRIM', lkey, n - bound, -1) end
while true do
  local head = redis.call('LINDEX', lkey, 0)
  local t = head and tonumber(string.match(head, '^(%d+)|'))
  if not t or t >= now - retention then break end
  redis.call('LPOP', lkey)
end
redis.call('PEXPIRE', lkey, retention)
return {now, 1}
