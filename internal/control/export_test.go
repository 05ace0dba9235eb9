package control

import "context"

// Accessors for the tests of internal/control (package control_test).

// LifetimeLocks is how many sandboxes have a lifetime lock entry.
func (s *Service) LifetimeLocks() int { return s.life.len() }

// LockLifetime takes a sandbox's lifetime lock, as connect and the
// reaper do.
func (s *Service) LockLifetime(ctx context.Context, id string) (func(), error) {
	return s.life.lock(ctx, id)
}

// TargetCount is how many proxy targets this process keeps.
func (s *Service) TargetCount() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.targets)
}

// FillPool runs one fill of a template's warm pool, as the holder of
// the pool lease does in RunPool.
func (s *Service) FillPool(ctx context.Context, cfg PoolConfig, template string) error {
	return s.fillPool(ctx, cfg, template)
}

// InvalidateView makes the next placement rebuild its view from the
// store, as a drain does.
func (s *Service) InvalidateView() { s.invalidateView() }
