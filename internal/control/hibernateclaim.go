package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// The reaper's hibernation against connects through other replicas.
//
// The per-sandbox lock (expiry.go) serializes one process only. Across
// replicas the row decides, as for the reaper's kill (reapKill): the
// reaper claims the row (HibernatingAt) by a compare-and-swap at the
// version it judged expired, before the node hibernates anything. A
// connect or new timeout that committed first changed the version: the
// claim fails and the sandbox lives on. A connect that comes after the
// claim waits until the claim is gone (hibernated, or released when the
// hibernation failed) and then resumes the sandbox; a connect that read
// the row before the claim writes "running" only at the version it read
// (Connect), so it looks again. No connect answers "running" for a
// sandbox that is about to be hibernated
// (TestConnectOnAnotherReplicaBeatsTheReaperHibernation,
// TestConnectAfterTheReapersClaimResumes).

const (
	// hibernateCallTimeout bounds the reaper's hibernation on the node,
	// so a claim is resolved (recorded or released) well within
	// hibernateClaimTTL by a live reaper.
	hibernateCallTimeout = 90 * time.Second
	// hibernateClaimTTL is how old a claim is before it is taken for one
	// whose reaper died (it crashed mid-hibernation): then the node's
	// state decides (breakClaim). The margin over hibernateCallTimeout
	// absorbs clock differences between replicas.
	hibernateClaimTTL = 2 * time.Minute
)

var errClaimLost = errors.New("the hibernation claim is no longer this reaper's")

// claimLive says whether a reaper's hibernation claim is on the row and
// young enough for its reaper to be at work.
func (s *Service) claimLive(rec store.Sandbox) bool {
	return !rec.HibernatingAt.IsZero() && s.now().Sub(rec.HibernatingAt) < hibernateClaimTTL
}

// claimedElsewhere says whether another reaper (a replica that held the
// reaper lease before) is hibernating this live sandbox now.
func (s *Service) claimedElsewhere(rec store.Sandbox) bool {
	return s.claimLive(rec) && (rec.State == store.StateRunning || rec.State == store.StatePaused)
}

// reapHibernate hibernates an expired sandbox only if its row is still
// at the version sb was read at: the claim is a compare-and-swap there.
func (s *Service) reapHibernate(ctx context.Context, sb store.Sandbox) error {
	claim := sb
	claim.HibernatingAt = s.now()
	claimed, err := s.st.CompareAndSwapSandbox(ctx, claim)
	if err != nil {
		if errdefs.IsConflict(err) {
			s.log.Info("timeout: the sandbox changed meanwhile (connect or new timeout); not hibernated", "sandbox_id", sb.ID)
			return nil
		}
		return err
	}
	hctx, cancel := context.WithTimeout(ctx, hibernateCallTimeout)
	defer cancel()
	if err := s.hibernate(hctx, claimed, claimed.HibernatingAt); err != nil {
		s.releaseClaim(context.WithoutCancel(ctx), claimed)
		return err
	}
	return nil
}

// releaseClaim takes a failed hibernation's claim off the row (if it is
// still this one), so waiting connects go on with the sandbox as it is;
// the next reaper pass tries again.
func (s *Service) releaseClaim(ctx context.Context, claimed store.Sandbox) {
	_, err := s.st.UpdateSandbox(ctx, claimed.ID, func(x *store.Sandbox) error {
		if !x.HibernatingAt.Equal(claimed.HibernatingAt) {
			return errClaimLost
		}
		x.HibernatingAt = time.Time{}
		return nil
	})
	if err != nil && !errors.Is(err, errClaimLost) && !errdefs.IsNotFound(err) {
		// Connects wait for it to grow stale (hibernateClaimTTL).
		s.log.Error("release hibernation claim", "sandbox_id", claimed.ID, "err", err)
	}
}

// hibernate hibernates rec's sandbox on its node and records it. claim is
// the reaper's claim on the row (zero for a hibernation a client or a
// drain asked for): then the record is written only while the claim is
// still this one, and clears it; a sandbox already hibernated on its node
// (by an earlier claim whose record was lost) counts as done.
func (s *Service) hibernate(ctx context.Context, rec store.Sandbox, claim time.Time) error {
	id := rec.ID
	n, err := s.nodeOf(rec)
	if err != nil {
		return err
	}
	if err := n.Hibernate(ctx, id); err != nil {
		ns, gerr := n.Get(ctx, id)
		if claim.IsZero() || !errdefs.IsConflict(err) || gerr != nil || ns.State != nodeapi.StateHibernated {
			return err
		}
	}
	s.dropTarget(id)
	hib := ""
	if ns, err := n.Get(ctx, id); err == nil {
		hib = ns.Hibernation
	}
	_, err = s.st.UpdateSandbox(ctx, id, func(x *store.Sandbox) error {
		if !claim.IsZero() {
			if !x.HibernatingAt.Equal(claim) {
				return errClaimLost
			}
			x.HibernatingAt = time.Time{}
		}
		x.State, x.Addr, x.Hibernation, x.HibernationDurable = store.StateHibernated, "", hib, false
		return nil
	})
	if errors.Is(err, errClaimLost) {
		// Broken as stale while the node worked (breakClaim): the node
		// has it hibernated; the periodic reconcile records that.
		return fmt.Errorf("sandbox %s hibernated after its claim was taken for stale: %w", id, err)
	}
	if err == nil && hib != "" {
		s.startHibernationUpload(id, hib)
	}
	if err == nil {
		why := "asked"
		if !claim.IsZero() {
			why = "at its timeout (auto-pause)"
		}
		s.event(rec, "sandbox.hibernated", why)
	}
	return err
}

// awaitClaim waits while a reaper's hibernation claim is on a live row,
// and returns the row as it is then. A claim older than
// hibernateClaimTTL is broken (breakClaim).
func (s *Service) awaitClaim(ctx context.Context, rec store.Sandbox) (store.Sandbox, error) {
	wait := 10 * time.Millisecond
	for !rec.HibernatingAt.IsZero() && rec.State != store.StateError {
		if s.claimLive(rec) {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return rec, fmt.Errorf("%w: sandbox %s is being hibernated: %w", errdefs.ErrUnavailable, rec.ID, ctx.Err())
			case <-t.C:
			}
			wait = min(2*wait, 500*time.Millisecond)
		} else if err := s.breakClaim(ctx, rec); err != nil && !errdefs.IsConflict(err) {
			return rec, err
		}
		var err error
		if rec, err = s.row(ctx, rec.ID); err != nil {
			return rec, err
		}
	}
	return rec, nil
}

// breakClaim takes a stale claim off the row (its reaper died mid-way):
// the node says whether the hibernation happened. A conflict means the
// row changed meanwhile (look again).
func (s *Service) breakClaim(ctx context.Context, rec store.Sandbox) error {
	n, err := s.nodeOf(rec)
	if err != nil {
		return err
	}
	ns, err := n.Get(ctx, rec.ID)
	if err != nil {
		return err
	}
	s.log.Warn("a hibernation claim outlived its reaper; the node's state decides", "sandbox_id", rec.ID,
		"claimed_at", rec.HibernatingAt, "node_state", ns.State)
	next := rec
	next.HibernatingAt = time.Time{}
	if ns.State == nodeapi.StateHibernated && rec.State != store.StateHibernated {
		s.dropTarget(rec.ID)
		next.State, next.Addr, next.Hibernation, next.HibernationDurable = store.StateHibernated, "", ns.Hibernation, false
	}
	_, err = s.st.CompareAndSwapSandbox(ctx, next)
	return err
}
