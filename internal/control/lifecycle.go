package control

import (
	"context"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// Pause freezes a running sandbox in memory. A sandbox that is already
// paused (or hibernated) is a conflict.
func (s *Service) Pause(ctx context.Context, id string) error {
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if rec.State == store.StateError {
		return deadErr(rec)
	}
	if rec.State != store.StateRunning {
		return errdefs.Conflictf("sandbox %s is already paused", id)
	}
	if err := s.eng.Pause(ctx, id); err != nil {
		return err
	}
	_, err = s.st.UpdateSandbox(ctx, id, func(x *store.Sandbox) error { x.State = store.StatePaused; return nil })
	s.refreshTarget(ctx, id, store.StatePaused)
	return err
}

// Hibernate checkpoints a sandbox to disk and frees its memory.
func (s *Service) Hibernate(ctx context.Context, id string) error {
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if rec.State == store.StateHibernated {
		return errdefs.Conflictf("sandbox %s is already hibernated", id)
	}
	if err := s.eng.Hibernate(ctx, id); err != nil {
		return err
	}
	s.dropTarget(id)
	_, err = s.st.UpdateSandbox(ctx, id, func(x *store.Sandbox) error { x.State = store.StateHibernated; return nil })
	return err
}

// Connect returns a sandbox ready for use: a paused or hibernated one is
// resumed (resumed = true). The timeout, when given, is only ever
// extended.
func (s *Service) Connect(ctx context.Context, id string, timeout time.Duration) (Sandbox, bool, error) {
	unlock, err := s.life.lock(ctx, id)
	if err != nil {
		return Sandbox{}, false, err
	}
	defer unlock()
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return Sandbox{}, false, err
	}
	if rec.State == store.StateError {
		return Sandbox{}, false, deadErr(rec)
	}
	resumed := false
	if rec.State != store.StateRunning {
		if err := s.eng.Resume(ctx, id); err != nil && !errdefs.IsConflict(err) {
			return Sandbox{}, false, err
		}
		resumed = true
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	rec, err = s.st.UpdateSandbox(ctx, id, func(x *store.Sandbox) error {
		x.State = store.StateRunning
		if end := s.now().Add(timeout); end.After(x.EndAt) {
			x.EndAt = end
		}
		return nil
	})
	if err != nil {
		return Sandbox{}, false, err
	}
	s.refreshTarget(ctx, id, store.StateRunning)
	sb, err := s.Get(ctx, id)
	return sb, resumed, err
}

// SetTimeout sets a sandbox's timeout from now.
func (s *Service) SetTimeout(ctx context.Context, id string, timeout time.Duration) error {
	unlock, err := s.life.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	_, err = s.st.UpdateSandbox(ctx, id, func(x *store.Sandbox) error {
		x.EndAt = s.now().Add(timeout)
		return nil
	})
	return err
}

// UpdateNetwork changes a running sandbox's egress policy.
func (s *Service) UpdateNetwork(ctx context.Context, id string, internet *bool, allow, deny []string) error {
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if internet == nil {
		internet = &rec.AllowInternet
	}
	p, err := ParsePolicy(internet, allow, deny)
	if err != nil {
		return err
	}
	if err := s.eng.SetPolicy(ctx, id, p); err != nil {
		return err
	}
	_, err = s.st.UpdateSandbox(ctx, id, func(x *store.Sandbox) error {
		x.AllowInternet, x.AllowOut, x.DenyOut = p.Internet, allow, deny
		return nil
	})
	return err
}

// ReapExpired acts on every sandbox whose timeout passed: running ones are
// killed, or hibernated when autoPause was asked; paused ones are
// hibernated (they keep their state but give back their memory).
func (s *Service) ReapExpired(ctx context.Context) {
	expired, err := s.st.Expired(ctx, s.now(), store.StateRunning, store.StatePaused, store.StateError)
	if err != nil {
		s.log.Error("list expired sandboxes", "err", err)
		return
	}
	for _, listed := range expired {
		unlock, err := s.life.lock(ctx, listed.ID)
		if err != nil {
			return
		}
		// Decide again under the sandbox's lock: a connect or a new
		// timeout may have extended it since the list was read.
		sb, err := s.st.GetSandbox(ctx, listed.ID)
		if err != nil || sb.EndAt.After(s.now()) || sb.State == store.StateHibernated {
			unlock()
			continue
		}
		switch {
		case sb.State == store.StateError:
			s.log.Info("timeout: removing dead sandbox", "sandbox_id", sb.ID)
			err = s.Kill(ctx, sb.ID)
		case sb.State == store.StatePaused || sb.AutoPause:
			s.log.Info("timeout: hibernating", "sandbox_id", sb.ID)
			err = s.Hibernate(ctx, sb.ID)
		default:
			s.log.Info("timeout: killing", "sandbox_id", sb.ID)
			err = s.Kill(ctx, sb.ID)
		}
		unlock()
		if err != nil && !errdefs.IsNotFound(err) {
			s.log.Error("timeout action", "sandbox_id", sb.ID, "err", err)
		}
	}
}

// Run reaps expired sandboxes every interval until ctx ends.
func (s *Service) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.ReapExpired(ctx)
		}
	}
}

// Reconcile brings the store in line with the node after a restart: store
// records of sandboxes the node no longer has are dropped, sandboxes the
// node has but the store does not (a create interrupted between the two)
// are killed, states are taken from the node, and snapshots are listed
// as the node's repository holds them.
func (s *Service) Reconcile(ctx context.Context) error {
	onNode := map[string]engine.Sandbox{}
	for _, es := range s.eng.List(ctx) {
		onNode[es.ID] = es
	}
	recs, _, err := s.st.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil {
		return err
	}
	inStore := map[string]bool{}
	for _, rec := range recs {
		inStore[rec.ID] = true
		es, ok := onNode[rec.ID]
		if !ok {
			s.log.Warn("reconcile: sandbox gone from the node", "sandbox_id", rec.ID)
			if err := s.st.DeleteSandbox(ctx, rec.ID); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
			continue
		}
		state := storeState(es.State)
		if state != rec.State {
			if _, err := s.st.UpdateSandbox(ctx, rec.ID, func(x *store.Sandbox) error {
				x.State = state
				setReason(x, es)
				return nil
			}); err != nil {
				return err
			}
		}
		if state != store.StateHibernated && state != store.StateError {
			s.setTarget(rec.ID, es.Addr, state)
		}
	}
	for id := range onNode {
		if !inStore[id] {
			s.log.Warn("reconcile: killing a sandbox the store does not know", "sandbox_id", id)
			if err := s.eng.Kill(ctx, id); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
		}
	}
	return s.reconcileSnapshots(ctx)
}

func storeState(st engine.State) string {
	switch st {
	case engine.StatePaused:
		return store.StatePaused
	case engine.StateHibernated:
		return store.StateHibernated
	case engine.StateDead:
		return store.StateError
	default:
		return store.StateRunning
	}
}
