package control

import (
	"context"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/scheduler"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/tenant"
)

// Snapshot takes a live snapshot of a sandbox; it outlives the sandbox
// and is usable as a template ID. The snapshot's ID is minted here; the
// catalog row is written once the node committed it (a crash in between
// leaves a snapshot the node lists and reconcile catalogs).
func (s *Service) Snapshot(ctx context.Context, id, name string, template bool) (store.Snapshot, error) {
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return store.Snapshot{}, err
	}
	if rec.AutoResume && (rec.State == store.StatePaused || rec.State == store.StateHibernated) {
		// autoResume: any use resumes it, a snapshot as much as traffic.
		if rec, err = s.wakeFor(ctx, id, false); err != nil {
			return store.Snapshot{}, err
		}
	}
	var names []string
	if name != "" {
		if err := ids.ValidateName("snapshot name", name); err != nil {
			return store.Snapshot{}, err
		}
		names = []string{name}
	}
	if template && name == "" {
		return store.Snapshot{}, errdefs.Invalidf("a template needs a name")
	}
	if !template {
		if err := s.admitsSnapshot(ctx, teamOf(rec)); err != nil {
			return store.Snapshot{}, err
		}
	}
	if template && len(rec.VolumeMounts) > 0 {
		return store.Snapshot{}, errdefs.Invalidf("sandbox %s mounts volumes: a template carries none (take a snapshot instead: sandboxes made from it mount the same volumes)", id)
	}
	n, err := s.nodeOf(rec)
	if err != nil {
		return store.Snapshot{}, err
	}
	// A snapshot's names are its team's (the store keeps them); the node
	// knows it by ID. A template is named by its key (store.TemplateKey:
	// the API gives it), which the node knows it by too.
	req := nodeapi.SnapshotRequest{SnapshotID: ids.New('s'), Template: template}
	if template {
		req.Names = names
	}
	info, err := retryNodeCall(ctx, s, "snapshot", req.SnapshotID, func(ctx context.Context) (nodeapi.SnapshotInfo, error) {
		return n.Snapshot(ctx, id, req)
	})
	if errdefs.IsConflict(err) && rec.AutoResume {
		// Hibernated under the call (a drain, the reaper, memory
		// pressure): once the row says so, wake it and snapshot it there.
		if rec2, werr := s.wakeFor(ctx, id, true); werr == nil {
			if n2, nerr := s.nodeOf(rec2); nerr == nil {
				rec, n = rec2, n2
				info, err = retryNodeCall(ctx, s, "snapshot", req.SnapshotID, func(ctx context.Context) (nodeapi.SnapshotInfo, error) {
					return n.Snapshot(ctx, id, req)
				})
			}
		}
	}
	if err != nil {
		return store.Snapshot{}, err
	}
	sn := snapshotRecord(info, rec.NodeID)
	sn.TeamID, sn.Names, sn.VolumeMounts = teamOf(rec), names, rec.VolumeMounts
	durable := false
	if nr, err := s.st.GetNode(ctx, rec.NodeID); err == nil {
		sn.RunscBuild, sn.CPUFeatures, durable = nr.RunscBuild, nr.CPUFeatures, nr.Durable
	}
	if template {
		old, oerr := s.st.GetTemplate(ctx, name)
		owner := old.TeamID // a template keeps its team (the API lets only that team replace it)
		if oerr != nil {
			owner = teamOf(rec)
		}
		if _, err := s.st.PutTemplate(ctx, store.Template{Name: name, TeamID: owner, SnapshotID: info.ID, NodeIDs: []string{rec.NodeID},
			Storage: store.StorageLocal, RunscBuild: sn.RunscBuild, CPUFeatures: sn.CPUFeatures, Spec: old.Spec}); err != nil {
			return store.Snapshot{}, err
		}
		if oerr == nil && old.SnapshotID != "" && old.SnapshotID != info.ID {
			// The template it replaces goes (its node deleted it; copies
			// elsewhere and the durable one go too), after the answer.
			s.inBackgroundCleanup(func(ctx context.Context) { s.dropEverywhere(ctx, old.SnapshotID) })
		}
		s.startTemplateUpload(name, info.ID)
		return sn, nil // templates are listed from the nodes, not the snapshot catalog
	}
	if durable {
		// The upload's intent goes in with the row: a crash before the
		// upload begins leaves it to RetryUploads, not local for good.
		sn.Storage = store.StorageUploading
	}
	if err := s.st.PutSnapshot(ctx, sn); err != nil {
		// Refused (a quota, a name taken meanwhile): the node's copy goes.
		s.inBackgroundCleanup(func(ctx context.Context) { s.dropEverywhere(ctx, sn.ID) })
		return store.Snapshot{}, err
	}
	s.startUpload(sn.ID)
	return sn, nil
}

func snapshotRecord(m nodeapi.SnapshotInfo, nodeID string) store.Snapshot {
	return store.Snapshot{ID: m.ID, Names: m.Names, SandboxID: m.Origin, Kind: m.Kind, CreatedAt: m.CreatedAt,
		SizeBytes: m.SizeBytes, NodeID: nodeID, Storage: store.StorageLocal, Template: m.Template}
}

// ListSnapshots lists user snapshots.
func (s *Service) ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]store.Snapshot, string, error) {
	return s.st.ListSnapshots(ctx, f)
}

// DeleteSnapshot deletes a snapshot or a template by ID (or name): on
// the node that took it, on every node holding a copy, and in the blob
// store (a node with one removes the durable copy too; its chunks go at
// the next GC unless another snapshot uses them). A durable snapshot
// whose node is gone is still deleted from the store.
func (s *Service) DeleteSnapshot(ctx context.Context, ref string) error {
	var found *nodeapi.SnapshotInfo
	var lastErr error = errdefs.NotFoundf("snapshot %s", ref)
	for _, nodeID := range s.nodes.IDs() {
		n, _ := s.nodes.Node(nodeID)
		m, err := n.GetSnapshot(ctx, ref)
		if err != nil {
			if !errdefs.IsNotFound(err) {
				lastErr = err
			}
			continue
		}
		if m.Kind == nodeapi.KindHibernation {
			return errdefs.Conflictf("snapshot %s holds a paused sandbox: kill the sandbox instead", m.ID)
		}
		if found == nil || !m.Copy {
			found = &m
		}
	}
	id := ""
	switch {
	case found != nil:
		id = found.ID
	default:
		// On no node: a durable snapshot (by ID) may still be in the store.
		sn, err := s.st.GetSnapshot(ctx, ref)
		if err != nil || sn.Storage != store.StorageDurable {
			return lastErr
		}
		id = sn.ID
	}
	deleted := false
	for _, nodeID := range s.nodes.IDs() {
		n, _ := s.nodes.Node(nodeID)
		switch err := n.DeleteSnapshot(ctx, id); {
		case err == nil:
			deleted = true
		case errdefs.IsNotFound(err):
		case errdefs.IsUnavailable(err) && !s.nodeReady(ctx, nodeID):
			// A node that is away keeps its copy: a fetched copy goes at
			// its reconcile when it is back (no row names it); the copy of
			// the node that took it is catalogued again then (delete it
			// again).
			s.log.Warn("delete snapshot: a node holding it is away", "snapshot_id", id, "node_id", nodeID, "err", err)
		default:
			return err
		}
	}
	if !deleted {
		return lastErr
	}
	if err := s.st.DeleteSnapshot(ctx, id); err != nil && !errdefs.IsNotFound(err) {
		return err
	}
	if found != nil && found.Kind == nodeapi.KindTemplate {
		for _, name := range found.Names {
			if err := s.st.DeleteTemplate(ctx, name); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
		}
	}
	return nil
}

// Templates lists the templates the nodes hold (one per name, the first
// node's in ID order).
func (s *Service) Templates(ctx context.Context) ([]nodeapi.SnapshotInfo, error) {
	seen := map[string]bool{}
	var out []nodeapi.SnapshotInfo
	for _, nodeID := range s.nodes.IDs() {
		n, _ := s.nodes.Node(nodeID)
		list, err := n.Snapshots(ctx)
		if err != nil {
			return nil, err
		}
		for _, m := range list {
			if m.Kind != nodeapi.KindTemplate || seen[m.ID] {
				continue
			}
			seen[m.ID] = true
			out = append(out, m)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// ForkResult is one child's outcome.
type ForkResult struct {
	Sandbox Sandbox
	Err     error
}

// Fork makes count copies of a running sandbox; each child has the
// parent's metadata and template, its own identity and token (minted
// here, rows written first as for a create), and its own timeout.
// Placement puts the children on the parent's node while it has room
// (one capture there, restored locally); the rest spill to other nodes,
// which restore a durable snapshot of the parent taken for them (and
// removed once they are made). Without a blob store every child goes to
// the parent's node. Children that fit nowhere (by limits, or by the
// memory the nodes really have free: memory.go) are refused each with the
// reason, the others made; when none fits the fork is refused.
func (s *Service) Fork(ctx context.Context, id string, count int, timeout time.Duration) ([]ForkResult, error) {
	parent, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return nil, err
	}
	if parent.State == store.StateHibernated {
		return nil, errdefs.Conflictf("sandbox %s is paused: connect to it first", id)
	}
	ctx = tenant.With(ctx, teamOf(parent)) // the children's launches queue with their team's
	if parent.State == store.StateError {
		return nil, deadErr(parent)
	}
	if count < 1 || count > nodeapi.MaxFork {
		return nil, errdefs.Invalidf("fork count %d out of range 1..%d", count, nodeapi.MaxFork)
	}
	if err := s.admitsChildren(ctx, parent, count); err != nil {
		return nil, err
	}
	n, err := s.nodeOf(parent)
	if err != nil {
		return nil, err
	}
	var short error // why the children past rows fit nowhere
	rows, err := placing(s, func() (rows []store.Sandbox, err error) {
		rows, short, err = s.forkRows(ctx, parent, count, timeout)
		return rows, err
	})
	if err != nil {
		return nil, err
	}
	out := make([]ForkResult, count)
	for i := len(rows); i < count; i++ {
		out[i].Err = short
	}
	var local, spill []int
	for i, rec := range rows {
		if rec.NodeID == parent.NodeID {
			local = append(local, i)
		} else {
			spill = append(spill, i)
		}
	}
	var wg sync.WaitGroup
	if len(spill) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.forkElsewhere(ctx, parent, n, rows, spill, out)
		}()
	}
	if len(local) > 0 {
		req := nodeapi.ForkRequest{Children: make([]nodeapi.ForkChildSpec, len(local))}
		for k, i := range local {
			req.Children[k] = nodeapi.ForkChildSpec{SandboxID: rows[i].ID, AccessToken: rows[i].EnvdAccessToken}
		}
		fr, err := retryNodeCall(ctx, s, "fork", id, func(ctx context.Context) (nodeapi.ForkResult, error) { return n.Fork(ctx, id, req) })
		s.commitFork(ctx, rows, local, fr, err, out)
		wg.Wait()
		if err != nil && len(spill) == 0 {
			return nil, err // nothing was made: the fork failed as a whole
		}
	}
	wg.Wait()
	return out, nil
}

// forkRows places the children and writes their rows (creating), then
// reads their nodes' rows (drain.go): errNodeClosed, with no row left,
// when one of them takes no new work now. The children that fit nowhere
// get no row; short says why.
func (s *Service) forkRows(ctx context.Context, parent store.Sandbox, count int, timeout time.Duration) (rows []store.Sandbox, short, err error) {
	where, short, err := s.placeFork(ctx, parent, count)
	if err != nil {
		return nil, nil, err
	}
	now := s.now()
	rows = make([]store.Sandbox, len(where))
	for i := range rows {
		rec := parent
		rec.ID, rec.State, rec.StartedAt, rec.EndAt = ids.New('i'), store.StateCreating, now, now.Add(timeout)
		rec.EnvdAccessToken, rec.Addr, rec.NodeID, rec.Reason, rec.ReasonDetail = newToken(), "", where[i], "", ""
		rec.Hibernation, rec.HibernationDurable = "", false
		rec.ForkedFrom = parent.ID
		rec.Version = 0 // a new row (not the parent's version): CreateSandbox writes 1
		// Its parent's exclusive volumes come as volumes of its own.
		if rec.VolumeMounts, err = s.ownVolumes(ctx, rec.TeamID, rec.ID, rec.NodeID, parent.VolumeMounts); err == nil {
			if err = s.st.CreateSandbox(ctx, rec); err != nil {
				s.dropOwnVolumes(ctx, rec.ID, rec.VolumeMounts)
			}
		}
		if err != nil {
			for _, done := range rows[:i] {
				s.abandon(ctx, done)
			}
			return nil, nil, err
		}
		// The child shows its parent's volumes: it is one of their users.
		if _, err := claimVolumes(ctx, s.st, rec.ID, rec.NodeID, rec.VolumeMounts); err != nil {
			for _, done := range rows[:i+1] {
				s.abandon(ctx, done)
			}
			return nil, nil, err
		}
		rows[i] = rec
	}
	if err := s.admitted(ctx, where...); err != nil {
		for _, rec := range rows {
			s.dropRow(ctx, rec)
		}
		return nil, nil, err
	}
	return rows, short, nil
}

// placeFork decides each child's node: the parent's while it has room,
// then others (Origin in the scheduler's rules), each child taking the
// memory the parent holds now (forkTakesMB). The children that fit
// nowhere are left out (Partial; short says why); placement that finds
// no room at all is ErrResourceLimit. The parent's node, read fresh, gets
// none while it drains; without a blob store there the children can go
// nowhere else, and the fork is refused.
func (s *Service) placeFork(ctx context.Context, parent store.Sandbox, count int) (where []string, short, err error) {
	req := scheduler.Request{Count: count, Origin: parent.NodeID, Each: sizeOf(parent.MemoryMB, parent.CPUCount),
		Takes: s.forkTakesMB(ctx, parent), Partial: true}
	if slices.ContainsFunc(parent.VolumeMounts, func(m store.VolumeMount) bool { return !captured(m) }) {
		// A volume it shares with others: its content is there. (Exclusive
		// volumes come with the fork's image: a child elsewhere gets its
		// own from the copy.)
		req.Hint = parent.NodeID
	}
	if nr, err := s.st.GetNode(ctx, parent.NodeID); err == nil {
		req.RunscBuild, req.CPUFeatures = nr.RunscBuild, nr.CPUFeatures // the children restore the parent's image
		if nr.Draining && !nr.Durable {
			return nil, nil, drainRefusal("sandbox %s is on node %s, which is draining and has no blob store to share its image from: its children can be made once the node is undrained", parent.ID, parent.NodeID)
		}
	}
	p, err := s.placeAll(ctx, req, nil)
	if err != nil {
		return nil, nil, err
	}
	return p.Nodes, p.Short, nil
}

// forkElsewhere makes the children at idx on other nodes: a snapshot of
// the parent, made durable, restored by each child's node (the parent's
// node serves the chunks as a peer); the snapshot goes afterwards. A node
// without a blob store cannot share the image: those children are made
// on the parent's node instead.
func (s *Service) forkElsewhere(ctx context.Context, parent store.Sandbox, origin nodeapi.Node, rows []store.Sandbox, idx []int, out []ForkResult) {
	snapID := ids.New('s')
	fail := func(err error) {
		for _, i := range idx {
			s.abandon(ctx, rows[i])
			out[i].Err = err
		}
	}
	if _, err := retryNodeCall(ctx, s, "snapshot", snapID, func(ctx context.Context) (nodeapi.SnapshotInfo, error) {
		return origin.Snapshot(ctx, parent.ID, nodeapi.SnapshotRequest{SnapshotID: snapID})
	}); err != nil {
		fail(err)
		return
	}
	defer s.dropForkImage(ctx, snapID)
	if _, err := origin.Upload(ctx, snapID); err != nil {
		if !errdefs.IsConflict(err) { // Conflict: no blob store; the parent's node makes them
			fail(err)
			return
		}
		s.forkOnOrigin(ctx, parent, origin, rows, idx, out)
		return
	}
	var peers []string
	if nr, err := s.st.GetNode(ctx, parent.NodeID); err == nil && nr.Addr != "" {
		peers = []string{nr.Addr}
	}
	policy, err := s.policyOf(ctx, parent)
	if err != nil {
		fail(err)
		return
	}
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for _, i := range idx {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			rec := rows[i]
			n, err := s.node(rec.NodeID)
			if err == nil {
				req := nodeapi.CreateRequest{SandboxID: rec.ID, AccessToken: rec.EnvdAccessToken, Template: snapID,
					VCPUs: float64(rec.CPUCount), MemoryMB: int64(rec.MemoryMB), Policy: &policy, Peers: peers}
				var ns nodeapi.Sandbox
				ns, err = retryNodeCall(ctx, s, "create", rec.ID, func(ctx context.Context) (nodeapi.Sandbox, error) { return n.Create(ctx, req) })
				if err == nil {
					out[i].Sandbox, out[i].Err = s.commitCreated(ctx, rec, ns)
					return
				}
			}
			s.abandon(ctx, rec)
			out[i].Err = err
		}()
	}
	wg.Wait()
}

// forkOnOrigin makes the children at idx on the parent's node after all
// (their rows are moved there first).
func (s *Service) forkOnOrigin(ctx context.Context, parent store.Sandbox, origin nodeapi.Node, rows []store.Sandbox, idx []int, out []ForkResult) {
	req := nodeapi.ForkRequest{Children: make([]nodeapi.ForkChildSpec, len(idx))}
	for k, i := range idx {
		rec, err := s.st.UpdateSandbox(ctx, rows[i].ID, func(x *store.Sandbox) error { x.NodeID = parent.NodeID; return nil })
		if err == nil {
			rows[i] = rec
		}
		req.Children[k] = nodeapi.ForkChildSpec{SandboxID: rows[i].ID, AccessToken: rows[i].EnvdAccessToken}
	}
	fr, err := retryNodeCall(ctx, s, "fork", parent.ID, func(ctx context.Context) (nodeapi.ForkResult, error) { return origin.Fork(ctx, parent.ID, req) })
	s.commitFork(ctx, rows, idx, fr, err, out)
}

// commitFork records a node's fork of the children at idx (the k-th of
// fr is rows[idx[k]]): each made one committed, each failed one (or all,
// when the call failed) undone.
func (s *Service) commitFork(ctx context.Context, rows []store.Sandbox, idx []int, fr nodeapi.ForkResult, err error, out []ForkResult) {
	for k, i := range idx {
		switch {
		case err != nil:
			s.abandon(ctx, rows[i])
			out[i].Err = err
		case fr.Children[k].Err != nil:
			s.abandon(ctx, rows[i])
			out[i].Err = fr.Children[k].Err
		default:
			out[i].Sandbox, out[i].Err = s.commitCreated(ctx, rows[i], fr.Children[k].Sandbox)
		}
	}
}

// nodeReady says whether the store counts a node ready.
func (s *Service) nodeReady(ctx context.Context, id string) bool {
	nr, err := s.st.GetNode(ctx, id)
	return err == nil && nr.State == store.NodeReady
}

// dropEverywhere removes a snapshot from every node that holds it and
// from the blob store (a node with the store removes the durable copy),
// within CleanupTimeout (and ctx). A node that fails keeps its copy,
// which it still lists (GET /templates shows it): delete it again; the
// failure is logged with the IDs.
func (s *Service) dropEverywhere(ctx context.Context, snapID string) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CleanupTimeout)
	defer cancel()
	for _, id := range s.nodes.IDs() {
		n, _ := s.nodes.Node(id)
		if err := n.DeleteSnapshot(ctx, snapID); err != nil && !errdefs.IsNotFound(err) {
			s.log.Warn("remove a replaced snapshot", "snapshot_id", snapID, "node_id", id, "err", err)
		}
	}
}

// dropForkImage removes the snapshot a spilled fork was made from: on
// every node holding it and in the blob store, within CleanupTimeout.
func (s *Service) dropForkImage(ctx context.Context, snapID string) {
	ctx, cancel := s.cleanupContext(ctx)
	defer cancel()
	if err := s.DeleteSnapshot(ctx, snapID); err != nil && !errdefs.IsNotFound(err) {
		s.log.Warn("remove a fork's image (reconcile catalogs it as a snapshot; delete it by hand)", "snapshot_id", snapID, "err", err)
	}
}

// Rollback puts a sandbox back to a snapshot in place (same ID). A paused
// sandbox is rolled back too and runs afterwards; a failed rollback leaves
// it as it was.
func (s *Service) Rollback(ctx context.Context, id, snapshotID string) (Sandbox, error) {
	// The snapshot is looked up among the sandbox's team's.
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	src, err := s.sourceOf(ctx, teamOf(rec), snapshotID)
	if err != nil {
		return Sandbox{}, err
	}
	ctx = tenant.With(ctx, teamOf(rec))
	if rec.State == store.StateHibernated {
		if _, _, err := s.Connect(ctx, id, 0); err != nil {
			return Sandbox{}, err
		}
	}
	n, err := s.nodeOf(rec)
	if err != nil {
		return Sandbox{}, err
	}
	// A user snapshot goes by its ID: a node that does not hold it (it was
	// taken on another node) fetches it when it is durable.
	ns, err := n.Rollback(ctx, id, src.sourceID(snapshotID))
	if err == nil {
		s.noteCopy(ctx, src, rec.NodeID)
	}
	if err != nil {
		return Sandbox{}, err
	}
	// A running sandbox keeps its address across a rollback: its row then
	// says the truth already, and the write (a transaction on PostgreSQL)
	// is skipped.
	if rec.State != store.StateRunning || rec.Addr != ns.Addr {
		rec, err = s.st.UpdateSandbox(ctx, id, func(x *store.Sandbox) error {
			x.State, x.Addr = store.StateRunning, ns.Addr
			return nil
		})
		if err != nil {
			return Sandbox{}, err
		}
	}
	s.setTarget(id, ns.Addr, store.StateRunning)
	s.event(rec, "sandbox.rolled_back", "to "+snapshotID)
	return Sandbox{rec}, nil
}

// reconcileSnapshots makes the catalog list exactly the user snapshots a
// node holds, among the rows of that node (and legacy rows naming no
// node, when it is the only one).
func (s *Service) reconcileSnapshots(ctx context.Context, nodeID string, n nodeapi.Node) error {
	list, err := n.Snapshots(ctx)
	if err != nil {
		return err
	}
	held := map[string]bool{}
	for _, m := range list {
		if m.Kind != nodeapi.KindSnapshot {
			continue
		}
		if m.Copy {
			// A copy fetched from the store: its row is the origin's. One
			// whose snapshot was deleted (while this node was away) goes.
			if _, err := s.st.GetSnapshot(ctx, m.ID); errdefs.IsNotFound(err) {
				if err := n.DeleteSnapshot(ctx, m.ID); err != nil && !errdefs.IsNotFound(err) {
					return err
				}
			}
			continue
		}
		held[m.ID] = true
		cur, err := s.st.GetSnapshot(ctx, m.ID)
		switch {
		case errdefs.IsNotFound(err):
			// Committed on the node, its row never written (a crash in
			// between). Only if there is still none: a Snapshot that
			// wrote its row since knows more (an upload under way).
			sn := snapshotRecord(m, nodeID)
			// Its sandbox's team, when its row is still there; otherwise
			// it stays no team's (listed to none) until an operator
			// deletes it: a guess could hand it to another team.
			if origin, err := s.st.GetSandbox(ctx, m.Origin); err == nil && m.Origin != "" {
				sn.TeamID = teamOf(origin)
			} else {
				s.log.Warn("a snapshot catalogued by reconcile has no team (its sandbox is gone)", "snapshot_id", m.ID, "sandbox_id", m.Origin)
			}
			if err := s.st.CreateSnapshot(ctx, sn); err != nil && !errdefs.IsAlreadyExists(err) {
				return err
			}
		case err == nil && cur.NodeID == "":
			if _, err := s.st.UpdateSnapshot(ctx, m.ID, func(x *store.Snapshot) error {
				if x.NodeID == "" {
					x.NodeID = nodeID
				}
				return nil
			}); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
		case err != nil:
			return err
		}
	}
	only := len(s.nodes.IDs()) == 1
	cursor := ""
	for {
		page, next, err := s.st.ListSnapshots(ctx, store.SnapshotFilter{Limit: 500, Cursor: cursor})
		if err != nil {
			return err
		}
		for _, sn := range page {
			mine := sn.NodeID == nodeID || (sn.NodeID == "" && only)
			if !mine || held[sn.ID] || sn.Storage == store.StorageDurable {
				continue
			}
			// Asked again: the node's list was taken before this page
			// was read, and a snapshot committed in between (its row
			// written just after) is not in it. A snapshot's row is
			// written after its commit, so the node holds it now if it
			// is not gone. Dropping its row made its upload, on finding
			// no row, delete the node's copy: the user's snapshot lost.
			if _, err := n.GetSnapshot(ctx, sn.ID); err == nil {
				continue
			} else if !errdefs.IsNotFound(err) {
				return err
			}
			if err := s.st.DeleteSnapshot(ctx, sn.ID); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
		}
		if next == "" {
			return nil
		}
		cursor = next
	}
}

// wakeFor resumes an autoResume sandbox that is paused or hibernated for
// an operation that needs it running, and returns its row. conflicted:
// the node just refused the operation as the sandbox is not running, so
// a row that still says running is one whose hibernation is not
// recorded yet: it is looked at again (for up to 5 s) rather than taken.
func (s *Service) wakeFor(ctx context.Context, id string, conflicted bool) (store.Sandbox, error) {
	for range 25 {
		rec, err := s.st.GetSandbox(ctx, id)
		if err != nil {
			return store.Sandbox{}, err
		}
		if rec.State == store.StateRunning && rec.HibernatingAt.IsZero() && !conflicted {
			return rec, nil
		}
		if woken, err := s.Wake(ctx, id); err != nil {
			return store.Sandbox{}, err
		} else if woken {
			return s.st.GetSandbox(ctx, id)
		}
		select {
		case <-ctx.Done():
			return store.Sandbox{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return store.Sandbox{}, errdefs.Conflictf("sandbox %s is not running, and did not resume", id)
}
