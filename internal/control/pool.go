package control

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// The warm pool keeps sandboxes of the default templates restored ahead
// of time, so a create takes one (a few milliseconds: new environment and
// policy) instead of restoring (~200 ms). Pooled sandboxes are store rows
// in state pooled (ID, token, node and address), so every replica sees
// and serves them and reconcile knows them:
//
//   - the holder of the store lease "pool" fills the pool (placed like
//     creates, in the crash-safe order: row creating, node create, CAS to
//     pooled) and trims a surplus;
//   - a create of the template (default size) placed on a node that
//     holds one claims it by CompareAndSwapSandbox from pooled to
//     creating: exactly one claimer wins, a loser tries the next one or
//     restores as usual;
//   - pooled rows are never listed to users nor reaped by timeouts; drain,
//     a lost node, a death or reconcile discard them like other rows.
//
// A stopped holder leaves the pool as it is: the next holder (another
// replica, or the next start) serves and tops it up.

// poolPolicy is the egress policy a pooled sandbox is restored with (the
// node's default).
var poolPolicy = nodeapi.Policy{Internet: true}

// PoolConfig sizes the warm pool.
type PoolConfig struct {
	Templates []string
	// Size is the number of pooled sandboxes per template, across the
	// fleet; 0 disables the pool (one pass still removes what an earlier
	// run with a pool left). Every replica should be given the same.
	Size int
	// NodeID, when set, is the node the pool keeps its sandboxes on;
	// otherwise they are placed like creates.
	NodeID string
}

// RunPool fills and refills the warm pool while this instance holds the
// "pool" lease, until ctx ends.
func (s *Service) RunPool(ctx context.Context, cfg PoolConfig) {
	if len(cfg.Templates) == 0 {
		return
	}
	wake := make(chan struct{}, 1)
	s.mu.Lock()
	s.poolWake = wake
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.poolWake = nil
		s.mu.Unlock()
		s.st.ReleaseLease(context.WithoutCancel(ctx), leasePool, s.cfg.Holder)
	}()
	warned := map[string]time.Time{}
	for {
		if s.lease(ctx, leasePool) {
			for _, t := range cfg.Templates {
				if err := s.fillPool(ctx, cfg, t); err != nil && ctx.Err() == nil {
					// Retried every 5 s: say it once a minute (a full host
					// refuses every refill until sandboxes go).
					if time.Since(warned[t]) >= time.Minute {
						s.log.Warn("warm pool: restore failed (retrying every 5 s)", "template_id", t, "err", err)
						warned[t] = time.Now()
					}
				} else {
					delete(warned, t)
				}
			}
		}
		if cfg.Size <= 0 {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-time.After(5 * time.Second):
		}
	}
}

// fillPool brings the pooled rows of a template to cfg.Size.
func (s *Service) fillPool(ctx context.Context, cfg PoolConfig, template string) error {
	rows, _, err := s.st.ListSandboxes(ctx, store.SandboxFilter{States: []string{store.StatePooled}, Template: template, Limit: 1000})
	if err != nil {
		return err
	}
	for i := len(rows) - 1; i >= max(cfg.Size, 0); i-- {
		s.discardPooled(ctx, rows[i], true)
	}
	for n := len(rows); n < cfg.Size && ctx.Err() == nil; n++ {
		if !s.lease(ctx, leasePool) { // renewed per restore; stop when lost
			return nil
		}
		if err := s.addPooled(ctx, cfg, template); err != nil {
			return err
		}
	}
	return nil
}

// addPooled restores one pooled sandbox: row first (creating, due at
// once, so the reaper undoes it after CreateGrace if this process dies),
// then the node's create, then the row to pooled. A draining node is not
// filled: placed elsewhere, or, when the pool is kept on that node, not
// at all until it is undrained.
func (s *Service) addPooled(ctx context.Context, cfg PoolConfig, template string) error {
	if cfg.NodeID != "" {
		if err := s.admitted(ctx, cfg.NodeID); err != nil {
			return fmt.Errorf("warm pool kept on node %s: %w", cfg.NodeID, err)
		}
		return s.addPooledOn(ctx, cfg, template)
	}
	_, err := placing(s, func() (struct{}, error) { return struct{}{}, s.addPooledOn(ctx, cfg, template) })
	return err
}

// addPooledOn is one try of addPooled: on cfg.NodeID, or where placement
// puts it.
func (s *Service) addPooledOn(ctx context.Context, cfg PoolConfig, template string) error {
	var (
		nodeID = cfg.NodeID
		n      nodeapi.Node
		err    error
	)
	if nodeID != "" {
		n, err = s.node(nodeID)
	} else {
		var src *sourceInfo
		if src, err = s.sourceOf(ctx, "", template); err == nil {
			nodeID, n, err = s.place(ctx, CreateRequest{TemplateID: template}, src)
		}
	}
	if err != nil {
		return err
	}
	now := s.now()
	rec := store.Sandbox{ID: ids.New('i'), TemplateID: template, NodeID: nodeID, State: store.StateCreating,
		EnvdAccessToken: newToken(), StartedAt: now, EndAt: now, AllowInternet: poolPolicy.Internet}
	if err := s.st.CreateSandbox(ctx, rec); err != nil {
		return err
	}
	if err := s.admitted(ctx, nodeID); err != nil { // after the row, as a create (drain.go)
		s.dropRow(ctx, rec)
		return err
	}
	ns, err := n.Create(ctx, nodeapi.CreateRequest{SandboxID: rec.ID, AccessToken: rec.EnvdAccessToken, Template: template})
	if err != nil {
		s.abandon(ctx, rec)
		return err
	}
	rec.State, rec.Version = store.StatePooled, 1
	setFromNode(&rec, ns)
	if _, err := s.st.CompareAndSwapSandbox(ctx, rec); err != nil {
		s.killOnNode(ctx, nodeID, rec.ID)
		return err
	}
	s.notePooled(nodeID, template)
	return nil
}

// discardPooled removes a pooled sandbox unless a create claimed it
// first: the row is claimed by compare-and-swap (to creating, due now),
// then the node's sandbox is killed (kill false: a node out of reach,
// whose reconcile kills it when it is back) and the row deleted. It
// reports whether it was this call that removed it.
func (s *Service) discardPooled(ctx context.Context, rec store.Sandbox, kill bool) bool {
	if rec.State != store.StatePooled {
		return false
	}
	rec.State, rec.EndAt = store.StateCreating, s.now()
	got, err := s.st.CompareAndSwapSandbox(ctx, rec)
	if err != nil {
		return false // claimed or gone meanwhile
	}
	if kill {
		s.abandon(ctx, got)
	} else if err := s.st.DeleteSandbox(context.WithoutCancel(ctx), got.ID); err != nil && !errdefs.IsNotFound(err) {
		s.log.Error("drop pooled row (the reaper retries)", "sandbox_id", got.ID, "err", err)
	}
	return true
}

// wakePool asks this instance's pool filler, if it runs, to refill now.
func (s *Service) wakePool() {
	s.mu.RLock()
	wake := s.poolWake
	s.mu.RUnlock()
	if wake != nil {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}

// errNoPooled: the pool cannot serve the create.
var errNoPooled = errors.New("no pooled sandbox")

// fromPool claims a pooled sandbox of the request's template on the node
// placement chose and makes it
// the sandbox rec describes (the request's environment and policy, its
// metadata and timeout); errNoPooled when the pool cannot serve it (the
// caller restores as usual), errNodeClosed when that node takes no new
// work now (the caller places again).
func (s *Service) fromPool(ctx context.Context, r CreateRequest, rec store.Sandbox, nodeID string, env []string, policy nodeapi.Policy) (Sandbox, error) {
	if r.CPUCount != 0 || r.MemoryMB != 0 || !s.mayHavePooled(nodeID, r.TemplateID) {
		return Sandbox{}, errNoPooled
	}
	rows, _, err := s.st.ListSandboxes(ctx, store.SandboxFilter{States: []string{store.StatePooled}, Template: r.TemplateID, NodeID: nodeID, Limit: 16})
	if err != nil || len(rows) == 0 {
		return Sandbox{}, errNoPooled
	}
	// Concurrent creates start at different rows, so they rarely collide.
	start := rand.IntN(len(rows))
	for i := range rows {
		p := rows[(start+i)%len(rows)]
		n, err := s.node(p.NodeID)
		if err != nil || p.NodeID != nodeID {
			continue
		}
		claim := rec
		claim.ID, claim.NodeID, claim.EnvdAccessToken, claim.Addr = p.ID, p.NodeID, p.EnvdAccessToken, p.Addr
		claim.CPUCount, claim.MemoryMB, claim.DiskSizeMB = p.CPUCount, p.MemoryMB, p.DiskSizeMB
		claim.State, claim.Version = store.StateCreating, p.Version
		got, err := s.st.CompareAndSwapSandbox(ctx, claim)
		if err != nil {
			continue // another create won it, or it went
		}
		s.wakePool()
		// Claimed first, then the node's row (as a create's row, then the
		// row: drain.go): a drain it missed kills it, as the drain would.
		if err := s.admitted(ctx, nodeID); err != nil {
			s.abandon(ctx, got)
			return Sandbox{}, err
		}
		var pol *nodeapi.Policy
		if !samePolicy(policy, poolPolicy) {
			pol = &policy
		}
		ns, err := n.Reconfigure(ctx, got.ID, env, pol)
		if err != nil {
			s.log.Warn("warm pool: reconfigure failed", "sandbox_id", got.ID, "err", err)
			s.abandon(ctx, got)
			return Sandbox{}, errNoPooled
		}
		sb, err := s.commitCreated(ctx, got, ns)
		if err != nil {
			return Sandbox{}, errNoPooled
		}
		return sb, nil
	}
	return Sandbox{}, errNoPooled
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
