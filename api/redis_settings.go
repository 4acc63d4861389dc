package api

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/internal/redisguard"
)

// startRedisGuard checks every Redis node's settings as the workers do
// (README, "Redis requirements"): an eviction policy stops the API unless
// SLUICE_REDIS_ALLOW_EVICTION; evictions and full memory degrade /readyz.
func (s *Server) startRedisGuard(ctx context.Context) (stop func(), err error) {
	o := s.wcfg.GuardOptions()
	o.WaitReplicas = 0 // the API admits no sends; the workers warn about replicas
	o.Logger, o.Registerer = s.log.With("component", "redis"), s.registry
	g := redisguard.New(s.rdb, o)
	if _, err := g.Start(ctx); err != nil {
		return nil, fmt.Errorf("start api: %w", err)
	}
	s.redisGuard.Store(g)
	return g.Stop, nil
}
