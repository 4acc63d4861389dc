package api

import "context"

// startRedisGuard checks every Redis node's settings as the workers do
// (docs/operations.md, "Redis requirements"): an eviction policy stops the
// API unless SLUICE_REDIS_ALLOW_EVICTION; evictions and full memory
// degrade /readyz. The API admits no sends, so it waits for no replica.
func (s *Server) startRedisGuard(ctx context.Context) (stop func(), err error) {
	g, _, err := s.deps.StartGuard(ctx, s.cfg.Base, 0, "start api")
	if err != nil {
		return nil, err
	}
	s.redisGuard.Store(g)
	return g.Stop, nil
}
