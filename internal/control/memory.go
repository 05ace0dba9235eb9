package control

import (
	"context"
	"errors"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// The memory a node really has, in placement and after the node relieved
// its own pressure.
//
// A node reports, with every heartbeat, the memory its host has for new
// sandboxes now (nodeapi.NodeInfo.MemoryFreeMB: MemAvailable less its
// memory floor and what its admissions hold). Placement binds on it beside
// the sandboxes' limits (scheduler.NodeView.MemoryFree), while it is
// fresh: a fork's children take the memory their parent holds
// (forkTakesMB), so they fill the parent's node as far as its memory goes
// and spill to nodes that have it, instead of all landing where the
// limits (a 10x bet) still allow them. The node's own admission stays the
// last word, on figures fresher than any heartbeat.
//
// A node whose memory falls under its floor hibernates its coldest
// sandboxes itself (engine.RelievePressure) and says so
// (nodeapi.EventHibernated); sandboxHibernated records them here like a
// hibernation asked for, so a connect resumes them.

// freeFigureAge is how old a node's reported free memory may be and still
// bind placement: a node heartbeats every 2 s; past this its figure says
// little (a node of `spore up` reports it only when it registers).
const freeFigureAge = 5 * time.Second

// freshFree is node n's reported free memory when fresh enough to place
// by, else nil (only limits bind).
func (s *Service) freshFree(n store.Node) *int64 {
	if n.MemoryFreeMB == nil || s.now().Sub(n.Heartbeat) > freeFigureAge {
		return nil
	}
	v := *n.MemoryFreeMB
	return &v
}

// busy: node n had launches waiting for a slot at its last heartbeat,
// fresh enough to place by (the engine's launch gate; scheduler rule 5).
func (s *Service) busy(n store.Node) bool {
	return n.LaunchesQueued > 0 && s.now().Sub(n.Heartbeat) <= freeFigureAge
}

// lessFree is a view's free memory after an item taking mb was placed.
func lessFree(free *int64, mb int64) *int64 {
	if free == nil || mb == 0 {
		return free
	}
	v := *free - mb
	return &v
}

// forkTakesMB is what each child of parent really takes: every child
// restores its own copy of the parent's memory, which the parent's node
// reads from the host side now (0 when it cannot tell: only limits and
// the nodes' floors bind).
func (s *Service) forkTakesMB(ctx context.Context, parent store.Sandbox) int64 {
	n, err := s.nodeOf(parent)
	if err != nil {
		return 0
	}
	st, err := n.Stats(ctx, parent.ID)
	if err != nil || st.MemoryBytes <= 0 {
		return 0
	}
	return (st.MemoryBytes + 1<<20 - 1) >> 20
}

var errNotToRecord = errors.New("nothing to record")

// sandboxHibernated records a sandbox its node hibernated on its own
// (memory pressure): hibernated, with the node's hibernation snapshot
// (uploaded when the node has a blob store, as for any hibernation), so
// its next connect resumes it. A warm-pool sandbox leaves the pool. A row
// that changed meanwhile (resumed, killed, moved) is left as it is; the
// periodic reconcile catches what an event missed.
func (s *Service) sandboxHibernated(nodeID string, ev nodeapi.Event) {
	s.dropTarget(ev.SandboxID)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := s.node(nodeID)
	if err != nil {
		return
	}
	ns, err := n.Get(ctx, ev.SandboxID)
	if err != nil || ns.State != nodeapi.StateHibernated {
		return // gone or resumed meanwhile
	}
	var pooled store.Sandbox
	_, err = s.st.UpdateSandbox(ctx, ev.SandboxID, func(x *store.Sandbox) error {
		switch {
		case x.NodeID != nodeID && x.NodeID != "":
			return errNotToRecord // moved
		case x.State == store.StatePooled:
			pooled = *x
			return errPooledDied
		case x.State != store.StateRunning && x.State != store.StatePaused:
			return errNotToRecord // being created (its create decides), hibernated already, dead
		}
		x.State, x.Addr, x.Hibernation, x.HibernationDurable = store.StateHibernated, "", ns.Hibernation, false
		return nil
	})
	switch {
	case errors.Is(err, errPooledDied):
		s.discardPooled(ctx, pooled, true)
	case errors.Is(err, errNotToRecord) || errdefs.IsNotFound(err):
	case err != nil:
		s.log.Error("record a hibernation under memory pressure (reconcile records it)", "sandbox_id", ev.SandboxID, "node_id", nodeID, "err", err)
	default:
		s.log.Warn("node hibernated a sandbox under memory pressure; a connect resumes it", "sandbox_id", ev.SandboxID,
			"node_id", nodeID, "reason", ev.Reason, "detail", ev.Detail, "snapshot_id", ns.Hibernation)
		if ns.Hibernation != "" {
			s.startHibernationUpload(ev.SandboxID, ns.Hibernation)
		}
	}
}
