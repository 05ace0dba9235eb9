package control

import (
	"context"
	"reflect"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
)

// pool keeps sandboxes restored ahead of time for the default templates,
// so a create takes one (a few milliseconds: new environment and policy)
// instead of restoring (~200 ms). Pool sandboxes have no store record: the
// reconcile at start kills any a crash left behind. The pool is filled by
// the holder of the store's "pool" lease only (one instance per store);
// its sandboxes live on one node (the only one in `spore up`).
type pool struct {
	size      int
	templates []string
	nodeID    string
	node      nodeapi.Node

	mu      sync.Mutex
	idle    map[string][]nodeapi.Sandbox
	filling map[string]bool
	wake    chan struct{}
}

// PoolConfig sizes the warm pool.
type PoolConfig struct {
	Templates []string
	Size      int    // per template; 0 disables the pool
	NodeID    string // the node it keeps sandboxes on (default: the first)
}

// RunPool fills and refills the warm pool until ctx ends, then kills the
// sandboxes still idle in it.
func (s *Service) RunPool(ctx context.Context, cfg PoolConfig) {
	if cfg.Size <= 0 || len(cfg.Templates) == 0 {
		return
	}
	if cfg.NodeID == "" {
		if nodes := s.nodes.IDs(); len(nodes) > 0 {
			cfg.NodeID = nodes[0]
		}
	}
	n, err := s.node(cfg.NodeID)
	if err != nil {
		s.log.Warn("warm pool: no node", "err", err)
		return
	}
	p := &pool{size: cfg.Size, templates: cfg.Templates, nodeID: cfg.NodeID, node: n, idle: map[string][]nodeapi.Sandbox{}, filling: map[string]bool{}, wake: make(chan struct{}, 1)}
	s.mu.Lock()
	s.pool = p
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.pool = nil
		s.mu.Unlock()
		s.st.ReleaseLease(context.WithoutCancel(ctx), leasePool, s.cfg.Holder)
		p.mu.Lock()
		defer p.mu.Unlock()
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, list := range p.idle {
			for _, sb := range list {
				p.node.Kill(cctx, sb.ID)
			}
		}
	}()
	warned := map[string]time.Time{}
	for {
		held := s.lease(ctx, leasePool)
		for _, t := range p.templates {
			for held {
				p.mu.Lock()
				need := len(p.idle[t]) < p.size
				p.mu.Unlock()
				if !need || ctx.Err() != nil {
					break
				}
				sb, err := p.node.Create(ctx, nodeapi.CreateRequest{SandboxID: ids.New('i'), AccessToken: newToken(), Template: t})
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
func (s *Service) fromPool(ctx context.Context, r CreateRequest, env []string, policy nodeapi.Policy) (nodeapi.Sandbox, string, bool) {
	s.mu.RLock()
	p := s.pool
	s.mu.RUnlock()
	if p == nil || r.CPUCount != 0 || r.MemoryMB != 0 {
		return nodeapi.Sandbox{}, "", false
	}
	p.mu.Lock()
	list := p.idle[r.TemplateID]
	if len(list) == 0 {
		p.mu.Unlock()
		return nodeapi.Sandbox{}, "", false
	}
	sb := list[len(list)-1]
	p.idle[r.TemplateID] = list[:len(list)-1]
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
	var pol *nodeapi.Policy
	if !samePolicy(policy, sb.Policy) {
		pol = &policy
	}
	got, err := p.node.Reconfigure(ctx, sb.ID, env, pol)
	if err != nil {
		s.log.Warn("warm pool: reconfigure failed", "sandbox_id", sb.ID, "err", err)
		p.node.Kill(context.WithoutCancel(ctx), sb.ID)
		return nodeapi.Sandbox{}, "", false
	}
	return got, p.nodeID, true
}

// samePolicy compares policies with nil and empty lists alike.
func samePolicy(a, b nodeapi.Policy) bool {
	norm := func(p nodeapi.Policy) nodeapi.Policy {
		if len(p.Allow) == 0 {
			p.Allow = nil
		}
		if len(p.Deny) == 0 {
			p.Deny = nil
		}
		return p
	}
	return reflect.DeepEqual(norm(a), norm(b))
}
