package control

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// Node lifecycle in a fleet: node agents register and heartbeat (through
// the API role's internal route), a monitor under the store lease "nodes"
// marks a node lost when its heartbeat is older than LostAfter and gives
// its live sandboxes state error (reason ReasonNodeLost), and an operator
// drains and undrains nodes.

// ReasonNodeLost is the reason of a sandbox whose node stopped answering.
const ReasonNodeLost = "node-lost"

// LostAfter is how old a node's last heartbeat may get before the node
// counts as lost (nodes heartbeat every 2 s).
const LostAfter = 10 * time.Second

const leaseNodes = "nodes"

// Heartbeat records a node agent's registration or heartbeat: what it
// offers, where it answers, now. A node that (re)joins (new, restarted,
// back from lost or left, moved to another address, or not yet through
// its join) is recorded joining, not ready, and join is true: the caller
// reconciles it (its sandbox rows against its List) and then calls
// Joined. Until then placement skips it and the fleet does not report it
// ready, so a sandbox of a node that says "ready" is reachable as its row
// says. A join that fails is retried on the next heartbeat.
func (s *Service) Heartbeat(ctx context.Context, id, addr string, info nodeapi.NodeInfo, restarted bool) (join bool, err error) {
	prev, err := s.st.GetNode(ctx, id)
	known := err == nil
	if err != nil && !errdefs.IsNotFound(err) {
		return false, err
	}
	join = !known || restarted || prev.State != store.NodeReady || prev.Addr != addr
	state := store.NodeReady
	if join {
		state = store.NodeJoining
	}
	_, err = s.st.UpsertNode(ctx, store.Node{ID: id, Addr: addr, Labels: info.Labels,
		Capacity: storeRes(info.Capacity), Reserved: storeRes(info.Reserved), Overcommit: store.Overcommit(info.Overcommit), RunscBuild: info.RunscBuild,
		CPUFeatures: info.CPUFeatures, Durable: info.Durable, MemoryFreeMB: info.MemoryFreeMB, LaunchesQueued: info.LaunchesQueued, Heartbeat: s.now(), State: state})
	if err != nil {
		return false, err
	}
	if join {
		s.log.Info("node joining", "node_id", id, "addr", addr, "was", prev.State, "restarted", restarted)
		s.invalidateView()
	}
	return join, nil
}

// Joined marks a joining node ready once it was reconciled. A node that
// meanwhile went lost or left stays so.
func (s *Service) Joined(ctx context.Context, id string) error {
	_, err := s.st.UpdateNode(ctx, id, func(x *store.Node) error {
		if x.State == store.NodeJoining {
			x.State = store.NodeReady
		}
		return nil
	})
	s.invalidateView()
	return err
}

// MonitorNodes marks lost nodes every interval while this instance holds
// the "nodes" lease (one instance per store does it), until ctx ends.
//
// A monitor judges nobody in its first LostAfter: when the whole control
// plane was down, no node could heartbeat, and a stale heartbeat then says
// nothing about the node. Nodes that still answer register again within
// that time.
func (s *Service) MonitorNodes(ctx context.Context, interval time.Duration) {
	start := s.now()
	t := time.NewTicker(interval)
	defer t.Stop()
	defer s.st.ReleaseLease(context.WithoutCancel(ctx), leaseNodes, s.cfg.Holder)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.now().Sub(start) <= LostAfter {
				continue
			}
			if s.lease(ctx, leaseNodes) {
				if err := s.CheckNodes(ctx); err != nil && ctx.Err() == nil {
					s.log.Warn("check nodes", "err", err)
				}
			}
		}
	}
}

// CheckNodes marks every ready or joining node whose heartbeat is older than
// LostAfter lost, and its running and paused sandboxes state error with
// reason node-lost: their instances are out of reach (and gone, if the
// host died). Hibernated sandboxes stay hibernated: their images are on
// that node's disk and come back with it (until snapshots live in shared
// storage, nowhere else). Rows being created are left to their create or
// the reaper. The check and the change are one transaction per node, so
// a heartbeat that lands meanwhile wins.
func (s *Service) CheckNodes(ctx context.Context) error {
	nodes, err := s.st.ListNodes(ctx)
	if err != nil {
		return err
	}
	now := s.now()
	for _, n := range nodes {
		if !live(n.State) || now.Sub(n.Heartbeat) <= LostAfter {
			continue
		}
		marked := false
		_, err := s.st.UpdateNode(ctx, n.ID, func(x *store.Node) error {
			if !live(x.State) || now.Sub(x.Heartbeat) <= LostAfter {
				return nil
			}
			x.State, marked = store.NodeLost, true
			return nil
		})
		if err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		if !marked {
			continue
		}
		s.log.Warn("node lost: no heartbeat", "node_id", n.ID, "last_heartbeat", n.Heartbeat, "after", LostAfter)
		if err := s.nodeLost(ctx, n.ID); err != nil {
			return err
		}
	}
	return nil
}

// live says whether a node in this state is expected to heartbeat.
func live(state string) bool { return state == store.NodeReady || state == store.NodeJoining }

// nodeLost gives the node's running and paused sandboxes state error.
func (s *Service) nodeLost(ctx context.Context, nodeID string) error {
	recs, err := s.rowsOf(ctx, nodeID)
	if err != nil {
		return err
	}
	detail := fmt.Sprintf("node %s stopped answering", nodeID)
	for _, rec := range recs {
		if rec.State == store.StatePooled {
			// Out of reach: the row goes; the node's reconcile kills the
			// sandbox if the node comes back.
			s.discardPooled(ctx, rec, false)
			continue
		}
		if rec.State != store.StateRunning && rec.State != store.StatePaused {
			continue
		}
		s.dropTarget(rec.ID)
		_, err := s.st.UpdateSandbox(ctx, rec.ID, func(x *store.Sandbox) error {
			if x.NodeID != nodeID || (x.State != store.StateRunning && x.State != store.StatePaused) {
				return nil
			}
			x.State, x.Addr, x.Reason, x.ReasonDetail = store.StateError, "", ReasonNodeLost, detail
			return nil
		})
		if err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// Undrain lets placements use a node again.
func (s *Service) Undrain(ctx context.Context, nodeID string) error {
	_, err := s.st.UpdateNode(ctx, nodeID, func(x *store.Node) error { x.Draining = false; return nil })
	s.invalidateView()
	return err
}

func (s *Service) invalidateView() {
	s.view.mu.Lock()
	s.view.view.Nodes = nil
	s.view.gen++
	s.view.mu.Unlock()
}

// NodeStatus is one node as `spore nodes` shows it.
type NodeStatus struct {
	store.Node
	Sandboxes    int   // running, paused and creating rows on it
	MemoryUsedMB int64 // the sum of their memory limits
	HeartbeatAge time.Duration
}

// Nodes lists the fleet with what each node holds.
func (s *Service) Nodes(ctx context.Context) ([]NodeStatus, error) {
	nodes, err := s.st.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	v, _, err := s.usedByNode(ctx)
	if err != nil {
		return nil, err
	}
	now := s.now()
	out := make([]NodeStatus, 0, len(nodes))
	for _, n := range nodes {
		u := v[n.ID]
		out = append(out, NodeStatus{Node: n, Sandboxes: u.Sandboxes, MemoryUsedMB: u.MemoryMB, HeartbeatAge: now.Sub(n.Heartbeat)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Follow subscribes to a node's events (deaths) if this instance does not
// follow it yet; a node that joined after New is followed from then on.
// When the stream ends (the node went away) the node may be followed
// again.
func (s *Service) Follow(id string) {
	n, ok := s.nodes.Node(id)
	if !ok {
		return
	}
	s.follow(s.ctx, id, n)
}
