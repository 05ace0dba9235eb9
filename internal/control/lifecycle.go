package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/tenant"
)

// Pause freezes a running sandbox in memory. A sandbox that is already
// paused (or hibernated) is a conflict.
func (s *Service) Pause(ctx context.Context, id string) error {
	rec, err := s.row(ctx, id)
	if err != nil {
		return err
	}
	if rec.State == store.StateError {
		return deadErr(rec)
	}
	if rec.State != store.StateRunning {
		return errdefs.Conflictf("sandbox %s is already paused", id)
	}
	n, err := s.nodeOf(rec)
	if err != nil {
		return err
	}
	if err := n.Pause(ctx, id); err != nil {
		return err
	}
	_, err = s.st.UpdateSandbox(ctx, id, func(x *store.Sandbox) error { x.State = store.StatePaused; return nil })
	s.setTarget(id, rec.Addr, store.StatePaused)
	if err == nil {
		s.event(rec, "sandbox.paused", "in memory")
	}
	return err
}

// Hibernate checkpoints a sandbox to disk and frees its memory.
func (s *Service) Hibernate(ctx context.Context, id string) error {
	rec, err := s.row(ctx, id)
	if err != nil {
		return err
	}
	if rec.State == store.StateHibernated {
		return errdefs.Conflictf("sandbox %s is already hibernated", id)
	}
	return s.hibernate(ctx, rec, time.Time{})
}

// Connect returns a sandbox ready for use: a paused or hibernated one is
// resumed (resumed = true). The timeout, when given, is only ever
// extended. A paused sandbox resumes where it is, on a draining node too
// (its memory is there: not new work; the drain hibernates it); a
// hibernated one on a draining node moves to another (resumeElsewhere) or
// is refused, naming the drain.
//
// Across replicas the row decides: a connect waits while the reaper's
// hibernation claim is on the row (then resumes the sandbox), and it
// records "running" only at the version it read, so a claim (or any
// change) that commits between its read and its write makes it look
// again instead of answering "running" for a sandbox about to be
// hibernated.
func (s *Service) Connect(ctx context.Context, id string, timeout time.Duration) (Sandbox, bool, error) {
	unlock, err := s.life.lock(ctx, id)
	if err != nil {
		return Sandbox{}, false, err
	}
	defer unlock()
	resumed := false
	for attempt := 1; ; attempt++ {
		sb, r, err := s.connect(ctx, id, timeout)
		resumed = resumed || r
		if !errors.Is(err, errRowChanged) || attempt == connectAttempts {
			return sb, resumed, err
		}
	}
}

// connectAttempts bounds how often a connect looks again at a row that
// changed under it (each change is another caller's progress).
const connectAttempts = 10

var errRowChanged = fmt.Errorf("the sandbox changed while it was connected to; try again: %w", errdefs.ErrConflict)

// connect is one attempt of Connect, under the sandbox's lock.
func (s *Service) connect(ctx context.Context, id string, timeout time.Duration) (Sandbox, bool, error) {
	rec, err := s.row(ctx, id)
	if err != nil {
		return Sandbox{}, false, err
	}
	if rec, err = s.awaitClaim(ctx, rec); err != nil {
		return Sandbox{}, false, err
	}
	ctx = tenant.With(ctx, teamOf(rec)) // a resume's launch queues with its team's
	if rec.State == store.StateError {
		return Sandbox{}, false, deadErr(rec)
	}
	if rec.State == store.StateCreating {
		return Sandbox{}, false, errdefs.Conflictf("sandbox %s is being created", id)
	}
	if rec.State == store.StateHibernated {
		if moved, ok, err := s.resumeElsewhere(ctx, rec, false); ok || err != nil {
			if err != nil {
				return Sandbox{}, false, err
			}
			rec = moved
		}
	}
	n, err := s.nodeOf(rec)
	if err != nil {
		return Sandbox{}, false, err
	}
	resumed := false
	addr := rec.Addr
	if rec.State == store.StateHibernated {
		// Resumed, it holds a host's resources again: its team's quotas
		// are asked first (the store's check at the write below is the
		// last word; putBack undoes the resume it refuses).
		if err := s.admitsResume(ctx, rec); err != nil {
			return Sandbox{}, false, err
		}
	}
	if rec.State != store.StateRunning {
		ns, err := n.Resume(ctx, id)
		if errors.Is(err, errdefs.ErrResourceLimit) && rec.State == store.StateHibernated && rec.HibernationDurable {
			// Its node is full: another takes it, if one can.
			moved, ok, merr := s.resumeElsewhere(ctx, rec, true)
			if merr == nil && ok {
				rec = moved
				if n, err = s.nodeOf(rec); err == nil {
					ns, err = n.Resume(ctx, id)
				}
			} else if merr != nil {
				s.log.Info("hibernated sandbox's node is full, and no other can take it", "sandbox_id", id, "err", merr)
			}
		}
		if errdefs.IsConflict(err) { // running already (another resume won): where is it
			ns, err = n.Get(ctx, id)
		}
		if err != nil {
			return Sandbox{}, false, err
		}
		resumed = true
		addr = ns.Addr
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	// Running, at the version read (one statement): a reaper's claim, a
	// hibernation or another connect that came first means what was read
	// no longer holds.
	hib, durable := rec.Hibernation, rec.HibernationDurable
	rec.State, rec.Addr = store.StateRunning, addr
	rec.Hibernation, rec.HibernationDurable = "", false // consumed by the wake
	if end := s.now().Add(timeout); end.After(rec.EndAt) {
		rec.EndAt = end
	}
	wasHibernated := hib != ""
	rec, err = s.st.CompareAndSwapSandbox(ctx, rec)
	if errdefs.IsConflict(err) {
		return Sandbox{}, resumed, errRowChanged
	}
	var qe *store.QuotaError
	if errors.As(err, &qe) && resumed && wasHibernated {
		s.putBack(ctx, id, n)
		return Sandbox{}, false, err
	}
	if err != nil {
		return Sandbox{}, resumed, err
	}
	if resumed {
		s.event(rec, "sandbox.resumed", "")
		if len(rec.VolumeMounts) > 0 {
			s.rehomeVolumes(ctx, rec) // moved with it: their content is on this node now
		}
	}
	if resumed && durable && hib != "" {
		// The image's durable copy is of no more use: removed after the
		// answer, within CleanupTimeout (a crash first leaves it in the
		// store, as one between the row's write and the removal always
		// could; dropDurable says what finds it then).
		s.inBackgroundCleanup(func(ctx context.Context) { s.dropDurable(ctx, hib) })
	}
	s.setTarget(id, rec.Addr, rec.State)
	s.presign.note(id, rec.EnvdAccessToken)
	return Sandbox{rec}, resumed, nil
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

// KeepAlive keeps a sandbox alive at least d from now: its end moves
// later, never earlier (E2B's refresh).
func (s *Service) KeepAlive(ctx context.Context, id string, d time.Duration) error {
	unlock, err := s.life.lock(ctx, id)
	if err != nil {
		return err
	}
	defer unlock()
	_, err = s.st.UpdateSandbox(ctx, id, func(x *store.Sandbox) error {
		if end := s.now().Add(d); end.After(x.EndAt) {
			x.EndAt = end
		}
		return nil
	})
	return err
}

// UpdateNetwork replaces a sandbox's egress policy: its lists and its
// network rules (nil clears them, as E2B's update clears what it omits).
// The first rules a sandbox gets mint its egress CA, which the node puts
// in its trust store.
func (s *Service) UpdateNetwork(ctx context.Context, id string, internet *bool, allow, deny []string, rules map[string][]store.NetworkRule) error {
	rec, err := s.row(ctx, id)
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
	if rec.NetworkRules, err = ParseRules(rules); err != nil {
		return err
	}
	if len(rec.NetworkRules) > 0 && len(rec.EgressCA) == 0 {
		if rec.EgressCA, err = s.mintCA(rec.ID); err != nil {
			return err
		}
	}
	if p, err = s.withRules(ctx, p, rec, true); err != nil {
		return err
	}
	n, err := s.nodeOf(rec)
	if err != nil {
		return err
	}
	if err := n.SetPolicy(ctx, id, p); err != nil {
		return err
	}
	_, err = s.st.UpdateSandbox(ctx, id, func(x *store.Sandbox) error {
		x.AllowInternet, x.AllowOut, x.DenyOut, x.NetworkRules = p.Internet, allow, deny, rec.NetworkRules
		if len(x.EgressCA) == 0 {
			x.EgressCA = rec.EgressCA
		}
		return nil
	})
	return err
}

// Reconcile brings the store in line with every node of the registry
// after a restart (see ReconcileNode), then the snapshot catalog.
func (s *Service) Reconcile(ctx context.Context) error {
	for _, id := range s.nodes.IDs() {
		if err := s.ReconcileNode(ctx, id); err != nil {
			return fmt.Errorf("reconcile node %s: %w", id, err)
		}
	}
	return nil
}

// ReconcileNode compares the store's rows of one node with that node's
// List, and touches nothing of other nodes: rows of sandboxes the node no
// longer has are dropped, sandboxes it has but no row names (a create
// interrupted before its row) are killed, states and addresses are taken
// from the node; a pooled (warm-pool) row stays pooled while its sandbox
// runs and goes otherwise. Rows in state creating are left to their
// create (or to the reaper after CreateGrace), and their sandboxes are
// not killed.
//
// It runs while creates, kills and other reconciles go on (at a node's
// join, periodically, in several replicas), so the rows are read before
// the node's list (a row that is past creating names a sandbox the node
// made before the list was taken), and each difference is checked again
// against the row as it is now before anything is dropped or killed: a
// sandbox whose row appeared meanwhile is some create's, never killed.
func (s *Service) ReconcileNode(ctx context.Context, nodeID string) error {
	n, err := s.node(nodeID)
	if err != nil {
		return err
	}
	recs, err := s.rowsOf(ctx, nodeID)
	if err != nil {
		return err
	}
	list, err := n.List(ctx)
	if err != nil {
		return err
	}
	onNode := map[string]nodeapi.Sandbox{}
	for _, ns := range list {
		onNode[ns.ID] = ns
	}
	inStore := map[string]bool{}
	for _, rec := range recs {
		inStore[rec.ID] = true
		if rec.State == store.StateCreating {
			continue
		}
		ns, ok := onNode[rec.ID]
		if rec.State == store.StatePooled {
			if !ok || ns.State != nodeapi.StateRunning {
				s.log.Warn("reconcile: warm-pool sandbox gone or not running", "sandbox_id", rec.ID, "node_id", nodeID)
				s.discardPooled(ctx, rec, ok)
			}
			continue
		}
		if !ok {
			now, err := s.st.GetSandbox(ctx, rec.ID)
			if err != nil || now.Version != rec.Version {
				continue // killed, or changed meanwhile: the next pass sees it
			}
			s.log.Warn("reconcile: sandbox gone from its node", "sandbox_id", rec.ID, "node_id", nodeID)
			if err := s.st.DeleteSandbox(ctx, rec.ID); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
			s.dropTarget(rec.ID)
			continue
		}
		if !settled(ns.State) {
			// An operation runs on it there (a resume, a hibernation, a
			// snapshot): its caller records what it leaves. The node's
			// view meanwhile is half-way: a resume shows "resuming" with
			// no address yet, which would be recorded as running with no
			// address over the hibernated row; the connect resuming it
			// then took that row for done, and every proxy refused the
			// sandbox as paused (TestReconcileDuringAResumeKeepsTheAddress).
			continue
		}
		state := storeState(ns.State)
		missingImage := state == store.StateHibernated && ns.Hibernation != rec.Hibernation
		if state != rec.State || ns.Addr != rec.Addr || rec.NodeID != nodeID || missingImage {
			if _, err := s.st.UpdateSandbox(ctx, rec.ID, func(x *store.Sandbox) error {
				if x.State == store.StateCreating || x.State == store.StatePooled {
					return nil // claimed from the pool meanwhile: its create decides
				}
				x.State, x.Addr, x.NodeID = state, ns.Addr, nodeID
				if state == store.StateHibernated && ns.Hibernation != x.Hibernation {
					// With its image: a hibernated row without one looks
					// like a sandbox only its node can resume, and a
					// connect resumed it on a draining node while the drain
					// that hibernated it was about to record it
					// (TestReconcileDuringADrainsHibernationRecordsTheImage).
					x.Hibernation, x.HibernationDurable = ns.Hibernation, false
				}
				if state != store.StateError {
					// Alive after all (its node was lost and came back).
					x.Reason, x.ReasonDetail = "", ""
				}
				setReason(x, ns)
				return nil
			}); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
		}
		if state != store.StateHibernated && state != store.StateError {
			s.setTarget(rec.ID, ns.Addr, state)
		}
		if len(rec.NetworkRules) > 0 && !ns.RulesLoaded && state != store.StateError {
			// The node forgot them (its process restarted: it keeps
			// secrets in memory only): they are set again.
			s.reloadRules(ctx, n, rec)
		}
	}
	for id := range onNode {
		if inStore[id] {
			continue
		}
		if now, err := s.st.GetSandbox(ctx, id); err == nil {
			if now.NodeID == nodeID || now.NodeID == "" {
				continue // its row was written after the rows were read: a create's
			}
			if ns := onNode[id]; ns.State == nodeapi.StateHibernated && now.State == store.StateHibernated &&
				ns.Hibernation != "" && ns.Hibernation == now.Hibernation {
				// Adopted here from its row's node, which cannot take it
				// back (resumeElsewhere), before the row was moved: the
				// move is under way. Killing it would lose the connect that
				// is about to resume it here. A move that fails kills this
				// copy itself; one whose row never moves leaves it, as
				// disk only, until the row's hibernation changes.
				continue
			}
			// Its row names another node: it was taken over there (it
			// resumed elsewhere while this node was away); this copy goes.
			s.log.Warn("reconcile: killing a sandbox that moved to another node", "sandbox_id", id, "node_id", nodeID, "now_on", now.NodeID)
			if err := n.Kill(ctx, id); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
			s.dropMovedVolumes(ctx, n, nodeID, now)
			continue
		} else if !errdefs.IsNotFound(err) {
			return err
		}
		s.log.Warn("reconcile: killing a sandbox the store does not know", "sandbox_id", id, "node_id", nodeID)
		if err := n.Kill(ctx, id); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
	}
	return s.reconcileSnapshots(ctx, nodeID, n)
}

// ReconcileEvery is how often RunReconcile reconciles each node.
const ReconcileEvery = 30 * time.Second

// RunReconcile reconciles every node of the registry every interval until
// ctx ends, so a sandbox that vanished from its node, or one its node
// runs that no row names, is handled without a restart; and prunes this
// process's proxy targets (PruneTargets). Each node's pass
// runs under the store lease "reconcile/<node>", held for two intervals
// and renewed each pass, so one instance reconciles a node and another
// takes over within two intervals when it stops.
func (s *Service) RunReconcile(ctx context.Context, interval time.Duration) {
	// Uploads a crash interrupted start again at once.
	if _, err := s.RetryUploads(ctx); err != nil && ctx.Err() == nil {
		s.log.Warn("retry snapshot uploads", "err", err)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	defer func() {
		for _, id := range s.nodes.IDs() {
			s.st.ReleaseLease(context.WithoutCancel(ctx), leaseReconcile+id, s.cfg.Holder)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.ReconcilePass(ctx, 2*interval)
			// Each replica its own: the proxy targets of sandboxes gone
			// through another replica.
			if n, err := s.PruneTargets(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("prune proxy targets", "err", err)
			} else if n > 0 {
				s.log.Info("proxy targets of sandboxes gone elsewhere dropped", "count", n)
			}
			if _, err := s.RetryUploads(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("retry snapshot uploads", "err", err)
			}
		}
	}
}

// ReconcilePass reconciles each reachable, ready node whose
// "reconcile/<node>" lease this instance gets (for ttl), and reports how
// many it reconciled.
func (s *Service) ReconcilePass(ctx context.Context, ttl time.Duration) int {
	done := 0
	for _, id := range s.nodes.IDs() {
		if ctx.Err() != nil {
			return done
		}
		if nr, err := s.st.GetNode(ctx, id); err == nil && nr.State != store.NodeReady {
			continue // lost or left: its rows were dealt with; it reconciles when back
		}
		if !s.leaseFor(ctx, leaseReconcile+id, ttl) {
			continue
		}
		if err := s.ReconcileNode(ctx, id); err != nil && ctx.Err() == nil {
			s.log.Warn("periodic reconcile", "node_id", id, "err", err)
			continue
		}
		done++
	}
	return done
}

// rowsOf lists the store's rows of a node (with the legacy rows that
// name no node, when this is the only node).
func (s *Service) rowsOf(ctx context.Context, nodeID string) ([]store.Sandbox, error) {
	filters := []string{nodeID}
	if len(s.nodes.IDs()) == 1 && nodeID != "" {
		filters = append(filters, "")
	}
	var out []store.Sandbox
	for _, f := range filters {
		cursor := ""
		for {
			// An empty NodeID filter means every node: legacy rows are
			// picked out below.
			page, next, err := s.st.ListSandboxes(ctx, store.SandboxFilter{NodeID: f, Limit: 1000, Cursor: cursor})
			if err != nil {
				return nil, err
			}
			for _, sb := range page {
				if sb.NodeID == f {
					out = append(out, sb)
				}
			}
			if next == "" {
				break
			}
			cursor = next
		}
	}
	return out, nil
}

// settled says whether a state a node reports for a sandbox is one no
// operation is changing (nodeapi's stable states).
func settled(st string) bool {
	switch st {
	case nodeapi.StateRunning, nodeapi.StatePaused, nodeapi.StateHibernated, nodeapi.StateDead:
		return true
	}
	return false
}

func storeState(st string) string {
	switch st {
	case nodeapi.StatePaused:
		return store.StatePaused
	case nodeapi.StateHibernated:
		return store.StateHibernated
	case nodeapi.StateDead:
		return store.StateError
	default:
		return store.StateRunning
	}
}

// putBack hibernates again a sandbox whose resume its team's quota
// refused after the node had resumed it (a create of the team's came
// first): the row, still hibernated, gets the new image.
func (s *Service) putBack(ctx context.Context, id string, n nodeapi.Node) {
	ctx, cancel := s.cleanupContext(ctx)
	defer cancel()
	if err := n.Hibernate(ctx, id); err != nil {
		s.log.Error("a resume refused by its quota: hibernating it again failed (the reconcile records its state)", "sandbox_id", id, "err", err)
		return
	}
	ns, err := n.Get(ctx, id)
	if err != nil {
		s.log.Error("a resume refused by its quota: reading it again failed", "sandbox_id", id, "err", err)
		return
	}
	if _, err := s.st.UpdateSandbox(ctx, id, func(x *store.Sandbox) error {
		x.State, x.Addr, x.Hibernation, x.HibernationDurable = store.StateHibernated, "", ns.Hibernation, false
		return nil
	}); err != nil {
		s.log.Error("a resume refused by its quota: recording it hibernated again failed", "sandbox_id", id, "err", err)
		return
	}
	s.dropTarget(id)
	if ns.Hibernation != "" {
		s.startHibernationUpload(id, ns.Hibernation)
	}
}
