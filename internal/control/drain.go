package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// A draining node takes nothing new. Placement skips it, but placement
// reads a cached view of the fleet (up to viewMaxAge old), and a drain
// committed through another replica is not in it. So every placement of
// new work (a create, fork children, a warm-pool fill, a hibernated
// sandbox's new node, an image build) reads the chosen node's row fresh
// before the node is asked (admitted), and places again, from a view read
// again, when that node now takes nothing.
//
// The order closes the race with the drain itself: a create writes its
// row (state creating, naming the node) and then reads the node's row; a
// drain writes the node's flag and then lists the node's rows. Of the two,
// at least one sees the other: the create goes elsewhere, or the drain
// finds the row and waits for that create to finish before hibernating
// what it made (Drain's settle).
//
// Not new work, so left where it is: a paused sandbox's resume (its
// memory is on the node; the drain hibernates it), a rollback (in place,
// on the sandbox's own node), a snapshot or upload of a sandbox there, and
// a peer's fetch of what the node holds (how work leaves it).

// placeAttempts bounds how often one operation places again after the
// node it was placed on turned out, read fresh, to take no new work: each
// miss is a drain or a loss committed since this replica's view was read.
const placeAttempts = 3

// errNodeClosed: the node a placement chose takes no new work now
// (draining, lost, joining, gone), as its row says.
var errNodeClosed = fmt.Errorf("%w: placed on a node that takes no new work", errdefs.ErrUnavailable)

// admitted reads, fresh from the store, the rows of the nodes new work
// was just placed on (one read: a node's row, or every row for several)
// and fails with errNodeClosed naming the first that takes nothing now.
// A caller that writes a row for the work writes it first (see above).
func (s *Service) admitted(ctx context.Context, nodeIDs ...string) error {
	ids := slices.Compact(slices.Sorted(slices.Values(nodeIDs)))
	rows := make(map[string]store.Node, len(ids))
	if len(ids) == 1 {
		nr, err := s.st.GetNode(ctx, ids[0])
		if err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		if err == nil {
			rows[nr.ID] = nr
		}
	} else {
		all, err := s.st.ListNodes(ctx)
		if err != nil {
			return err
		}
		for _, nr := range all {
			rows[nr.ID] = nr
		}
	}
	for _, id := range ids {
		nr, ok := rows[id]
		switch {
		case !ok:
			return fmt.Errorf("%w: node %s is no longer in the fleet", errNodeClosed, id)
		case nr.Draining:
			return fmt.Errorf("%w: node %s is draining", errNodeClosed, id)
		case nr.State != store.NodeReady:
			return fmt.Errorf("%w: node %s is %s", errNodeClosed, id, nr.State)
		}
	}
	return nil
}

// placing runs try (a placement and what it commits to, admitted last)
// again while it fails with errNodeClosed, placeAttempts times in all,
// with the placement view read again before each retry.
func placing[T any](s *Service, try func() (T, error)) (T, error) {
	for attempt := 1; ; attempt++ {
		v, err := try()
		if !errors.Is(err, errNodeClosed) || attempt == placeAttempts {
			return v, err
		}
		s.invalidateView()
	}
}

// dropRow deletes the row of new work that never reached its node (its
// node takes none), within CleanupTimeout. One that cannot be deleted
// stays creating, and the reaper undoes it once CreateGrace has passed.
func (s *Service) dropRow(ctx context.Context, rec store.Sandbox) {
	dctx, cancel := s.cleanupContext(ctx)
	defer cancel()
	if err := s.st.DeleteSandbox(dctx, rec.ID); err != nil && !errdefs.IsNotFound(err) {
		s.log.Error("drop the row of a create placed on a closed node (the reaper retries)", "sandbox_id", rec.ID, "node_id", rec.NodeID, "err", err)
		return
	}
	s.dropOwnVolumes(ctx, rec.ID, rec.VolumeMounts)
}

// drainRefusal answers new work that only a draining node could take:
// a placement refusal (ErrResourceLimit: 429 with Retry-After, its message
// shown to the client) that names the drain.
func drainRefusal(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errdefs.ErrResourceLimit, fmt.Sprintf(format, args...))
}

// pinnedToDraining is the refusal of a create from a snapshot (or
// template) that only its draining node can serve: it has no blob store,
// or no address peers can fetch from, and the snapshot is not durable.
func pinnedToDraining(src *sourceInfo, origin store.Node) error {
	if origin.Durable {
		return drainRefusal("snapshot %s is not durable yet (its upload to the blob store runs) and its node %s is draining: retry once it is durable", src.id, origin.ID)
	}
	return drainRefusal("snapshot %s is only on node %s (no blob store there to share it from), which is draining: create from it once the node is undrained", src.id, origin.ID)
}

// hibernatedOnDraining is the refusal of a resume of a hibernated
// sandbox whose draining node cannot let its image go.
func hibernatedOnDraining(rec store.Sandbox, origin store.Node) error {
	if origin.Durable {
		return drainRefusal("sandbox %s is hibernated on node %s, which is draining, and its image is not durable yet (its upload to the blob store runs): retry in a moment", rec.ID, origin.ID)
	}
	return drainRefusal("sandbox %s is hibernated on node %s, which is draining, and its image is only on that node (no blob store there): it resumes once the node is undrained", rec.ID, origin.ID)
}

// Drain stops placements on a node, kills its warm-pool sandboxes and
// hibernates its running and paused sandboxes there. With a blob store
// each moves to another node at its next connect (its image durable, or
// fetched from this node while its upload runs); without one it resumes
// here once the node is undrained. Work under way when the drain
// committed (rows being created here: a create, fork children, a pool
// fill) is waited for, up to CreateGrace, and what it made is hibernated
// (or discarded) too. It returns how many were hibernated; the first
// failure is returned after every sandbox was tried (a retry of the drain
// continues).
func (s *Service) Drain(ctx context.Context, nodeID string) (int, error) {
	if _, err := s.st.UpdateNode(ctx, nodeID, func(x *store.Node) error { x.Draining = true; return nil }); err != nil {
		return 0, err
	}
	s.invalidateView()
	began := time.Now()
	wait := 10 * time.Millisecond
	done := 0
	var first error
	for {
		recs, err := s.rowsOf(ctx, nodeID)
		if err != nil {
			return done, errors.Join(first, err)
		}
		n, creating, err := s.drainRows(ctx, nodeID, recs)
		done += n
		if first == nil {
			first = err
		}
		if creating == 0 {
			return done, first
		}
		if time.Since(began) > s.cfg.CreateGrace {
			return done, errors.Join(first, fmt.Errorf("drain %s: %d sandboxes still being created there after %s (drain again): %w",
				nodeID, creating, s.cfg.CreateGrace, errdefs.ErrUnavailable))
		}
		select {
		case <-ctx.Done():
			return done, errors.Join(first, ctx.Err())
		case <-time.After(wait):
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// quiesce readies the hibernation of a draining node's running
// sandboxes, all at once: its proxy forwards them nothing new, and each
// waits for the requests it is answering, up to DrainGrace (nodeapi
// Quiesce), so that the hibernation cuts none. What is still open after
// the grace is logged, and cut. A node that cannot quiesce (a release
// before it) is hibernated as before.
func (s *Service) quiesce(ctx context.Context, nodeID string, recs []store.Sandbox) {
	n, err := s.node(nodeID)
	if err != nil {
		return // the hibernations say why
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, quiesceConcurrency)
	for _, rec := range recs {
		if rec.State != store.StateRunning {
			continue
		}
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			open, err := n.Quiesce(ctx, rec.ID, s.cfg.DrainGrace)
			switch {
			case err != nil && !errdefs.IsNotFound(err):
				s.log.Info("drain: quiesce (the hibernation may cut requests in flight)", "node_id", nodeID, "sandbox_id", rec.ID, "err", err)
			case open > 0:
				s.log.Warn("drain: requests still open after the grace are cut by the hibernation", "node_id", nodeID,
					"sandbox_id", rec.ID, "open", open, "grace", s.cfg.DrainGrace)
			}
		})
	}
	wg.Wait()
}

// quiesceConcurrency bounds a drain's Quiesce calls at once (each one a
// wait on the node, not work).
const quiesceConcurrency = 64

// drainRows discards the pooled sandboxes among a draining node's rows
// and hibernates its running and paused ones. It reports how many it
// hibernated, how many rows are being created there (younger than
// CreateGrace: older ones are the reaper's), and the first failure.
func (s *Service) drainRows(ctx context.Context, nodeID string, recs []store.Sandbox) (done, creating int, first error) {
	s.quiesce(ctx, nodeID, recs)
	for _, rec := range recs {
		switch rec.State {
		case store.StatePooled:
			s.discardPooled(ctx, rec, true) // nobody's: killed, not hibernated
			continue
		case store.StateCreating:
			if s.now().Sub(rec.StartedAt) < s.cfg.CreateGrace {
				creating++
			}
			continue
		case store.StateRunning, store.StatePaused:
		default:
			continue
		}
		err := s.Hibernate(ctx, rec.ID)
		switch {
		case err == nil:
			done++
		case errdefs.IsNotFound(err):
		default:
			s.log.Warn("drain: hibernate", "node_id", nodeID, "sandbox_id", rec.ID, "err", err)
			if first == nil {
				first = fmt.Errorf("drain %s: hibernate %s: %w", nodeID, rec.ID, err)
			}
		}
	}
	return done, creating, first
}
