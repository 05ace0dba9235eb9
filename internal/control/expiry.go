package control

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// The reaper: timeouts.
const (
	// reapWorkers is how many expired sandboxes a reaper pass acts on at
	// once: a node that is slow or hangs on one sandbox does not hold up
	// the others, and a pass over many does not flood the nodes.
	reapWorkers = 8
	// defaultReapTimeout is Config.ReapTimeout's default: as long as a
	// hibernation's node call may take, so one that finishes is not cut.
	defaultReapTimeout = hibernateCallTimeout
)

// ReapExpired acts on every sandbox whose timeout passed: running ones are
// killed, or hibernated when autoPause was asked; paused ones are
// hibernated (they keep their state but give back their memory); rows of
// creates abandoned longer than CreateGrace ago are undone. With several
// control plane instances on one store, only the holder of the "reaper"
// lease reaps, so each piece of work is done once. A kill or hibernation
// happens only at the row version judged expired (reapKill,
// reapHibernate), so a connect through another replica that commits
// first wins.
//
// The sandboxes are reaped reapWorkers at a time, each within
// Config.ReapTimeout, so a node that hangs on one sandbox delays neither
// the others nor the end of the pass (TestReaperHungNodeDoesNotStallThePass).
// The lease is renewed while the pass runs (holdLease): a pass longer
// than the lease's TTL keeps it, so no other replica starts reaping the
// same sandboxes meanwhile (TestReaperRenewsItsLeaseDuringAPass); a pass
// that cannot renew it stops before it may have expired, taking no new
// sandbox and cutting its node calls short (TestReaperStopsWhenItLosesTheLease).
// Before, the sandboxes were reaped one by one without a deadline, under
// a lease the pass never renewed.
func (s *Service) ReapExpired(ctx context.Context) {
	began := time.Now()
	if !s.lease(ctx, leaseReaper) {
		return
	}
	pass, stop := s.holdLease(ctx, leaseReaper, s.cfg.LeaseTTL, began)
	defer stop()
	expired, err := s.st.Expired(pass, s.now(), store.StateRunning, store.StatePaused, store.StateError, store.StateCreating)
	if err != nil {
		if pass.Err() == nil {
			s.log.Error("list expired sandboxes", "err", err)
		}
		return
	}
	sem := make(chan struct{}, reapWorkers)
	var wg sync.WaitGroup
	for i, listed := range expired {
		select {
		case sem <- struct{}{}:
		case <-pass.Done():
		}
		if pass.Err() != nil {
			if ctx.Err() == nil {
				s.log.Warn("reaper: pass stopped (its lease could not be renewed); the next pass takes the rest", "left", len(expired)-i)
			}
			break
		}
		wg.Go(func() {
			defer func() { <-sem }()
			s.reapOne(pass, listed)
		})
	}
	wg.Wait()
}

// reapOne acts on one sandbox a pass listed as expired, within
// ReapTimeout: under its lifetime lock, it judges the row again (a connect
// or a new timeout may have extended it since the list was read), then
// kills, hibernates or undoes it.
func (s *Service) reapOne(ctx context.Context, listed store.Sandbox) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReapTimeout)
	defer cancel()
	unlock, err := s.life.lock(ctx, listed.ID)
	if err != nil {
		return // a connect held it past the deadline, or the pass stopped: the next pass judges it
	}
	defer unlock()
	sb, err := s.st.GetSandbox(ctx, listed.ID)
	if err != nil || sb.EndAt.After(s.now()) || sb.State == store.StateHibernated || s.claimedElsewhere(sb) {
		return
	}
	switch {
	case sb.State == store.StateCreating:
		if s.now().Sub(sb.StartedAt) < s.cfg.CreateGrace {
			return // its create may still be running
		}
		s.log.Info("timeout: undoing an abandoned create", "sandbox_id", sb.ID)
		s.abandon(ctx, sb)
	case sb.State == store.StateError:
		s.log.Info("timeout: removing dead sandbox", "sandbox_id", sb.ID)
		err = s.reapKill(ctx, sb)
	case sb.State == store.StatePaused || sb.AutoPause:
		s.log.Info("timeout: hibernating", "sandbox_id", sb.ID)
		err = s.reapHibernate(ctx, sb)
	default:
		s.log.Info("timeout: killing", "sandbox_id", sb.ID)
		err = s.reapKill(ctx, sb)
	}
	if err != nil && !errdefs.IsNotFound(err) {
		s.log.Error("timeout action", "sandbox_id", sb.ID, "node_id", sb.NodeID, "err", err)
	}
}

// reapKill kills an expired sandbox unless its row changed since it was
// judged expired. The per-sandbox lock above only serializes this process;
// a connect or a new timeout through another replica changes the row, so
// the row goes first and only at the version that was judged: that change
// wins (the sandbox lives), and a connect after the delete finds no
// sandbox, as it would after the kill. The instance goes next; one that
// survives a failed kill (or one cut by the deadline) is an instance no
// row names, which the periodic reconcile removes.
func (s *Service) reapKill(ctx context.Context, sb store.Sandbox) error {
	if err := s.st.DeleteSandboxIf(ctx, sb.ID, sb.Version); err != nil {
		if errdefs.IsConflict(err) {
			s.log.Info("timeout: the sandbox changed meanwhile (connect or new timeout); not killed", "sandbox_id", sb.ID)
			return nil
		}
		return err
	}
	s.dropTarget(sb.ID)
	if sb.HibernationDurable && sb.Hibernation != "" {
		s.dropDurable(ctx, sb.Hibernation)
	}
	n, err := s.nodeOf(sb)
	if err != nil {
		return err
	}
	s.event(sb, "sandbox.timeout", "killed at its timeout")
	s.egressSummary(sb)
	if err := n.Kill(ctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("kill expired sandbox %s (its row is gone; reconcile frees it): %w", sb.ID, err)
	}
	return nil
}

// Run reaps expired sandboxes every interval until ctx ends.
func (s *Service) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	defer s.st.ReleaseLease(context.WithoutCancel(ctx), leaseReaper, s.cfg.Holder)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.ReapExpired(ctx)
		}
	}
}

// sandboxLocks serializes the decisions about one sandbox's lifetime: the
// reaper's (is it still expired? then kill or hibernate it) against a
// client's connect or new timeout. Without it the reaper acted on a list
// read before a connect extended the sandbox, and killed or hibernated it
// right after the connect had answered "running"
// (TestConnectNeverLosesToReaper). The lock is a per-sandbox semaphore
// taken with a context and held across the engine call, as the engine's
// own per-sandbox lock is; the map's mutex is never held while waiting.
// An entry lives while someone holds or waits for it, so the map holds
// only the sandboxes being decided on (TestLifetimeLocksAreFreed).
type sandboxLocks struct {
	mu sync.Mutex
	m  map[string]*sandboxLock
}

type sandboxLock struct {
	ch   chan struct{}
	refs int // holders and waiters; the entry goes when it drops to 0
}

// lock takes id's lock, or fails when ctx ends first.
func (l *sandboxLocks) lock(ctx context.Context, id string) (unlock func(), err error) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*sandboxLock{}
	}
	e := l.m[id]
	if e == nil {
		e = &sandboxLock{ch: make(chan struct{}, 1)}
		l.m[id] = e
	}
	e.refs++
	l.mu.Unlock()
	release := func() {
		l.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(l.m, id)
		}
		l.mu.Unlock()
	}
	select {
	case e.ch <- struct{}{}:
		return func() { <-e.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// len is how many sandboxes have an entry (tests).
func (l *sandboxLocks) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}
