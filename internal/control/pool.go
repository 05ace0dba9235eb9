package control

import (
	"context"
	"reflect"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/netns"
)

// pool keeps sandboxes restored ahead of time for the default templates,
// so a create takes one (a few milliseconds: new environment and policy)
// instead of restoring (~200 ms). Pool sandboxes have no store record: the
// reconcile at start kills any a crash left behind.
type pool struct {
	size      int
	templates []string

	mu      sync.Mutex
	idle    map[string][]engine.Sandbox
	filling map[string]bool
	wake    chan struct{}
}

// PoolConfig sizes the warm pool.
type PoolConfig struct {
	Templates []string
	Size      int // per template; 0 disables the pool
}

// RunPool fills and refills the warm pool until ctx ends, then kills the
// sandboxes still idle in it.
func (s *Service) RunPool(ctx context.Context, cfg PoolConfig) {
	if cfg.Size <= 0 || len(cfg.Templates) == 0 {
		return
	}
	p := &pool{size: cfg.Size, templates: cfg.Templates, idle: map[string][]engine.Sandbox{}, filling: map[string]bool{}, wake: make(chan struct{}, 1)}
	s.mu.Lock()
	s.pool = p
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.pool = nil
		s.mu.Unlock()
		p.mu.Lock()
		defer p.mu.Unlock()
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, list := range p.idle {
			for _, sb := range list {
				s.eng.Kill(cctx, sb.ID)
			}
		}
	}()
	warned := map[string]time.Time{}
	for {
		for _, t := range p.templates {
			for {
				p.mu.Lock()
				need := len(p.idle[t]) < p.size
				p.mu.Unlock()
				if !need || ctx.Err() != nil {
					break
				}
				sb, err := s.eng.Create(ctx, engine.CreateOptions{Template: t})
				if err != nil {
					// Retried every 5 s: say it once a minute (a full host
					// refuses every refill until sandboxes go).
					if time.Since(warned[t]) >= time.Minute {
						s.log.Warn("warm pool: restore failed (retrying every 5 s)", "template_id", t, "err", err)
						warned[t] = time.Now()
					}
					break
				}
				delete(warned, t)
				p.mu.Lock()
				p.idle[t] = append(p.idle[t], sb)
				p.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-time.After(5 * time.Second):
		}
	}
}

// fromPool takes a pooled sandbox of the template and makes it the one r
// asks for; ok is false when the pool cannot serve r.
func (s *Service) fromPool(ctx context.Context, r CreateRequest, env []string, policy netns.Policy) (engine.Sandbox, bool) {
	s.mu.RLock()
	p := s.pool
	s.mu.RUnlock()
	if p == nil || r.CPUCount != 0 || r.MemoryMB != 0 {
		return engine.Sandbox{}, false
	}
	p.mu.Lock()
	list := p.idle[r.TemplateID]
	if len(list) == 0 {
		p.mu.Unlock()
		return engine.Sandbox{}, false
	}
	sb := list[len(list)-1]
	p.idle[r.TemplateID] = list[:len(list)-1]
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	var pol *netns.Policy
	if !reflect.DeepEqual(policy, sb.Policy) {
		pol = &policy
	}
	got, err := s.eng.Reconfigure(ctx, sb.ID, env, pol)
	if err != nil {
		s.log.Warn("warm pool: reconfigure failed", "sandbox_id", sb.ID, "err", err)
		s.eng.Kill(context.WithoutCancel(ctx), sb.ID)
		return engine.Sandbox{}, false
	}
	return got, true
}
