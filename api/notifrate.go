package api

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyspace"
	"github.com/sluicehq/sluice/tasks"
	"github.com/sluicehq/sluice/throttle"
)

// The API's rate counts notifications, not requests: a 500-notification
// batch takes 500 of a token's SLUICE_API_NOTIFICATION_RATE. It is a
// sliding-window log like the limiter's, weighted: each request is one
// entry (scored by Redis TIME) carrying its count, and a running sum; the
// check, the trim and the add are one script, so the limit holds exactly
// across API replicas.

// KEYS[1] log (zset "id:n" -> ms)  KEYS[2] sum
// ARGV[1] limit  ARGV[2] window ms  ARGV[3] n  ARGV[4] id
// Returns {1, 0} admitted, or {0, retry ms}.
var weightedAllow = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit, window, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local sum = tonumber(redis.call('GET', KEYS[2]) or '0')
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now - window))
for _, m in ipairs(old) do
  sum = sum - tonumber(string.match(m, ':(%d+)$'))
end
if #old > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now - window))
end
if sum < 0 then sum = 0 end
if sum + n > limit then
  local need = sum + n - limit
  local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    need = need - tonumber(string.match(entries[i], ':(%d+)$'))
    if need <= 0 then
      redis.call('SET', KEYS[2], string.format('%d', sum), 'PX', window)
      return {0, tonumber(entries[i + 1]) + window - now + 1}
    end
  end
  return {0, window}
end
redis.call('ZADD', KEYS[1], now, ARGV[4] .. ':' .. string.format('%d', n))
redis.call('SET', KEYS[2], string.format('%d', sum + n), 'PX', window)
redis.call('PEXPIRE', KEYS[1], window)
return {1, 0}
`)

// notificationRate admits n more notifications for tokenID, or says how
// long until they fit.
func (s *Server) notificationRate(ctx context.Context, tokenID string, n int) (time.Duration, bool, error) {
	r := s.notifRate
	log, sum := keyspace.NotificationRate(tokenID)
	res, err := weightedAllow.Run(ctx, s.rdb, []string{log, sum}, r.Limit, r.Window.Milliseconds(), n, tasks.NewID()).Int64Slice()
	if err != nil {
		return 0, false, fmt.Errorf("api: notification rate: %w", err)
	}
	if res[0] == 1 {
		return 0, true, nil
	}
	s.metrics.rateLimited.Inc()
	return time.Duration(res[1]) * time.Millisecond, false, nil
}

// NotificationRule is the per-token notification rule of SLUICE_API_NOTIFICATION_RATE.
func (c Config) NotificationRule() (throttle.Rule, error) {
	return throttle.ParseRule(c.NotificationRate)
}
