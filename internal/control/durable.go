package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/scheduler"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/tenant"
)

// Durability: a snapshot committed on a node's disk is uploaded to the
// blob store in the background (the node does the work: nodeapi Upload);
// its row's Storage goes local → uploading → durable. Once durable, any
// node can restore it (placement is free to choose; the node fetches it
// from its peers or the store), and losing its node loses nothing.
//
// The row is the truth: an upload whose snapshot was deleted meanwhile
// removes what it stored; an upload a replica's death interrupted is
// found by the periodic pass (RetryUploads) and run again (uploads are
// idempotent and resume where they stopped).

const (
	uploadTries     = 6
	uploadBackoff   = time.Second
	uploadRetryIdle = ReconcileEvery // the lease of a retry pass over one snapshot (a dead holder's lapses by the next pass)
	uploadWorkers   = 2              // uploads at once per control plane instance
)

// startUpload makes a snapshot durable in the background.
func (s *Service) startUpload(id string) {
	s.inBackground(func(ctx context.Context) error { return s.Upload(ctx, id) },
		"snapshot upload (the periodic pass tries again)", "snapshot_id", id)
}

// inBackground runs an upload in the background, at most uploadWorkers
// at once, until done or Close; a failure is logged with msg and args.
func (s *Service) inBackground(f func(context.Context) error, msg string, args ...any) {
	s.uploads.Add(1)
	s.uploading.Add(1)
	go func() {
		defer s.uploads.Done()
		defer s.uploading.Add(-1)
		select {
		case s.uploadSem <- struct{}{}:
		case <-s.ctx.Done():
			return
		}
		defer func() { <-s.uploadSem }()
		if err := f(s.ctx); err != nil && s.ctx.Err() == nil {
			s.log.Warn(msg, append(args, "err", err)...)
		}
	}()
}

// uploadOn asks node n to upload snapshot id, again while it is
// unavailable (backoff from uploadBackoff, uploadTries in all). A
// Conflict (no blob store there) or NotFound (deleted meanwhile) ends it
// at once.
func (s *Service) uploadOn(ctx context.Context, n nodeapi.Node, id string) (nodeapi.UploadInfo, error) {
	backoff := uploadBackoff
	for try := 1; ; try++ {
		res, err := n.Upload(ctx, id)
		if err == nil || errdefs.IsConflict(err) || errdefs.IsNotFound(err) || try >= uploadTries || ctx.Err() != nil {
			return res, err
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return res, ctx.Err()
		}
		backoff *= 2
	}
}

// Upload makes one snapshot durable now: row uploading, the node's
// upload (retried while the node is unavailable), row durable with the
// bytes it added. A node without a blob store leaves the row local.
func (s *Service) Upload(ctx context.Context, id string) error {
	sn, err := s.st.GetSnapshot(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil // deleted before its upload began (queued behind others): nothing to do
	}
	if err != nil {
		return err
	}
	if sn.Storage == store.StorageDurable {
		return nil
	}
	n, err := s.node(sn.NodeID)
	if err != nil {
		return err
	}
	if err := s.setStorage(ctx, id, store.StorageUploading, nil); errdefs.IsNotFound(err) {
		return nil // deleted just now
	} else if err != nil {
		return err
	}
	info, err := s.uploadOn(ctx, n, id)
	switch {
	case errdefs.IsConflict(err): // no blob store on that node
		return s.setStorage(ctx, id, store.StorageLocal, nil)
	case errdefs.IsNotFound(err): // deleted meanwhile
		return nil
	case err != nil:
		return err
	}
	was := ""
	err = s.setStorage(ctx, id, store.StorageDurable, func(x *store.Snapshot) {
		// Two uploads of one snapshot can end together (RetryUploads joins
		// one it takes for abandoned; the node answers a finished one with
		// nothing added): the one that found everything stored must not
		// erase what the other reported (TestSnapshotsAcrossNodes read a
		// durable snapshot with 0 bytes stored).
		if was = x.Storage; was == store.StorageDurable {
			x.StoredBytes = max(x.StoredBytes, info.StoredBytes)
		} else {
			x.StoredBytes = info.StoredBytes
		}
	})
	if errdefs.IsNotFound(err) {
		// Deleted while it uploaded: what the upload stored goes too,
		// within CleanupTimeout. If that fails, the node's copy is
		// catalogued again by its reconcile (reconcileSnapshots: a
		// snapshot the node holds that no row names), to be deleted
		// again; the durable copy goes with that delete.
		dctx, cancel := s.cleanupContext(ctx)
		defer cancel()
		if derr := n.DeleteSnapshot(dctx, id); derr != nil && !errdefs.IsNotFound(derr) {
			s.log.Warn("remove the upload of a deleted snapshot (its node's reconcile catalogs it again)", "snapshot_id", id, "node_id", sn.NodeID, "err", derr)
		}
		return nil
	}
	if err == nil && was != store.StorageDurable {
		s.log.Info("snapshot durable", "snapshot_id", id, "node_id", sn.NodeID, "bytes", info.TotalBytes, "stored", info.StoredBytes)
	}
	return err
}

// setStorage changes a snapshot row's storage state (and whatever more
// f sets, called with the row as it was), if the row still exists: in one transaction, so a delete that
// lands meanwhile is not undone (a read and a put brought the row back,
// naming a snapshot that no longer was).
func (s *Service) setStorage(ctx context.Context, id, state string, f func(*store.Snapshot)) error {
	_, err := s.st.UpdateSnapshot(ctx, id, func(sn *store.Snapshot) error {
		if f != nil {
			f(sn)
		}
		sn.Storage = state
		return nil
	})
	return err
}

// RetryUploads starts again the uploads of snapshots whose row says
// "uploading" (one instance per pass, by the lease "upload/<id>"): their
// uploader may have died. An upload still running is joined by the node,
// one already done answers at once. It returns how many it started.
func (s *Service) RetryUploads(ctx context.Context) (int, error) {
	started := 0
	cursor := ""
	for {
		page, next, err := s.st.ListSnapshots(ctx, store.SnapshotFilter{Limit: 500, Cursor: cursor})
		if err != nil {
			return started, err
		}
		for _, sn := range page {
			if sn.Storage != store.StorageUploading {
				continue
			}
			if !s.leaseFor(ctx, "upload/"+sn.ID, uploadRetryIdle) {
				continue // another instance has it
			}
			s.startUpload(sn.ID)
			started++
		}
		if next == "" {
			return started, nil
		}
		cursor = next
	}
}

// sourceInfo is what placement and the node need to know of what a
// sandbox is restored from, when it is a user snapshot or a user
// template (a template built on every node, such as base, has none).
type sourceInfo struct {
	id       string // the snapshot's ID: what the node is given
	snapshot bool   // a user snapshot (its row records copies), not a template
	origin   string // the node that took it
	durable  bool
	runsc    string
	cpu      []string
	holders  []string            // origin and known copies
	peers    []string            // the origin's address, when it is ready (set by placement)
	volumes  []store.VolumeMount // a user snapshot's sandbox's volumes: they come with it
}

// sourceOf resolves a create's or rollback's reference for a team in one
// store read: a snapshot of the team's by ID or name, or a template made
// from a sandbox (`template: true`) or built, by name. nil: a template
// every node builds (passed on by name). team "" is the control plane's
// own lookup (the warm pool's): anything by ID.
//
// What the store does not resolve for the team: see beyondTeam.
func (s *Service) sourceOf(ctx context.Context, team, ref string) (*sourceInfo, error) {
	r, err := s.st.ResolveRef(ctx, team, ref)
	switch {
	case errdefs.IsNotFound(err):
		return s.beyondTeam(ctx, team, ref)
	case err != nil:
		return nil, err
	case r.Template != nil && !store.TemplateVisible(team, *r.Template):
		return nil, errdefs.NotFoundf("template or snapshot %s not found", ref)
	case r.Snapshot != nil:
		sn := r.Snapshot
		return &sourceInfo{id: sn.ID, snapshot: true, origin: sn.NodeID, durable: sn.Storage == store.StorageDurable,
			runsc: sn.RunscBuild, cpu: sn.CPUFeatures, holders: append([]string{sn.NodeID}, sn.Copies...), volumes: sn.VolumeMounts}, nil
	}
	if src := templateSource(*r.Template); src != nil || r.Template.Name == ref {
		return src, nil
	}
	// A team's template with no snapshot stored, named by its name: the
	// nodes know it by its key.
	return &sourceInfo{id: r.Template.Name}, nil
}

// templateSource is where a template's snapshot is; nil for a template
// with none stored (the node resolves its name).
func templateSource(tp store.Template) *sourceInfo {
	if tp.SnapshotID == "" || len(tp.NodeIDs) == 0 {
		return nil
	}
	return &sourceInfo{id: tp.SnapshotID, origin: tp.NodeIDs[0], durable: tp.Storage == store.StorageDurable,
		runsc: tp.RunscBuild, cpu: tp.CPUFeatures, holders: tp.NodeIDs}
}

// beyondTeam resolves what the store does not resolve for a team: a
// template by its snapshot ID (E2B's template ID; templates are the
// deployment's), or a name passed on to the node as it is, only when it
// cannot name another team's snapshot there: a template every node
// builds, or, for the default team, a name the nodes knew before teams
// (the default team's then) that is no other snapshot's ID.
func (s *Service) beyondTeam(ctx context.Context, team, ref string) (*sourceInfo, error) {
	if team == "" || nodeapi.BuiltinTemplate(ref) {
		return nil, nil
	}
	tpls, err := s.st.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	for _, tp := range tpls {
		if tp.SnapshotID == ref {
			if !store.TemplateVisible(team, tp) {
				break // another team's private template
			}
			return templateSource(tp), nil
		}
	}
	if team == store.DefaultTeam && !slices.ContainsFunc(tpls, func(tp store.Template) bool { return tp.SnapshotID == ref }) {
		other, err := s.st.ResolveRef(ctx, "", ref)
		switch {
		case err == nil && other.Snapshot != nil:
		case err != nil && !errdefs.IsNotFound(err):
			return nil, err
		default:
			return nil, nil
		}
	}
	return nil, errdefs.NotFoundf("template or snapshot %s not found", ref)
}

// sourceID is what the node is given for ref.
func (src *sourceInfo) sourceID(ref string) string {
	if src == nil {
		return ref
	}
	return src.id
}

// GetSnapshot returns the row of a team's snapshot ("": the default
// team's) by ID or name; another team's is ErrNotFound.
func (s *Service) GetSnapshot(ctx context.Context, team, ref string) (store.Snapshot, error) {
	team = teamOr(team)
	sn, err := s.st.GetSnapshot(ctx, ref)
	if err == nil && sn.TeamID != team {
		err = errdefs.NotFoundf("snapshot %s", ref)
	}
	if !errdefs.IsNotFound(err) && !errdefs.IsInvalidArgument(err) {
		return sn, err
	}
	page, _, lerr := s.st.ListSnapshots(ctx, store.SnapshotFilter{TeamID: team, Name: ref, Limit: 1})
	if lerr != nil {
		return store.Snapshot{}, lerr
	}
	if len(page) == 0 {
		return store.Snapshot{}, errdefs.NotFoundf("snapshot %s", ref)
	}
	return page[0], nil
}

// UploadsIdle says whether no background upload of this instance runs.
func (s *Service) UploadsIdle() bool { return s.uploading.Load() == 0 }

// Uploads is how many background uploads this instance runs or has
// queued (at most uploadWorkers run at once).
func (s *Service) Uploads() int { return int(s.uploading.Load()) }

// CollectGarbage frees the blob store's chunks no snapshot uses, through
// the first reachable node that has the store (they share one).
func (s *Service) CollectGarbage(ctx context.Context, req nodeapi.GCRequest) (string, nodeapi.GCReport, error) {
	var errs []error
	for _, id := range s.nodes.IDs() {
		if nr, err := s.st.GetNode(ctx, id); err == nil && nr.State != store.NodeReady {
			continue
		}
		n, _ := s.nodes.Node(id)
		rep, err := n.CollectGarbage(ctx, req)
		if err == nil {
			s.log.Info("blob store garbage collected", "node_id", id, "deleted_chunks", rep.DeletedChunks, "freed_bytes", rep.FreedBytes,
				"kept_chunks", rep.KeptChunks, "dry_run", req.DryRun)
			return id, rep, nil
		}
		if errdefs.IsInvalidArgument(err) {
			return "", nodeapi.GCReport{}, err
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return "", nodeapi.GCReport{}, errdefs.Conflictf("no ready node")
	}
	all := errors.Join(errs...)
	for _, e := range errs {
		if !errdefs.IsConflict(e) {
			return "", nodeapi.GCReport{}, all
		}
	}
	return "", nodeapi.GCReport{}, errdefs.Conflictf("no node has a blob store (start nodes with --blob-store)")
}

// startHibernationUpload makes a hibernated sandbox's image durable in
// the background, so that it can resume on another node; the row says
// so once it is (HibernationDurable), if it still names that image.
func (s *Service) startHibernationUpload(id, hib string) {
	s.inBackground(func(ctx context.Context) error { return s.uploadHibernation(ctx, id, hib) },
		"hibernation upload (it resumes on its own node only)", "sandbox_id", id, "snapshot_id", hib)
}

func (s *Service) uploadHibernation(ctx context.Context, id, hib string) error {
	rec, err := s.st.GetSandbox(ctx, id)
	if err != nil || rec.Hibernation != hib {
		return nil // gone or woken meanwhile
	}
	n, err := s.node(rec.NodeID)
	if err != nil {
		return err
	}
	_, err = s.uploadOn(ctx, n, hib)
	switch {
	case errdefs.IsConflict(err), errdefs.IsNotFound(err):
		return nil // no blob store there; or woken and consumed meanwhile
	case err != nil:
		return err
	}
	still := false
	_, err = s.st.UpdateSandbox(ctx, id, func(x *store.Sandbox) error {
		if x.Hibernation == hib && x.State == store.StateHibernated {
			x.HibernationDurable, still = true, true
		}
		return nil
	})
	if errdefs.IsNotFound(err) || (err == nil && !still) {
		// Killed or woken while it uploaded: the durable copy is not wanted.
		s.dropDurable(context.WithoutCancel(ctx), hib)
		return nil
	}
	if err == nil {
		s.log.Info("hibernation durable", "sandbox_id", id, "snapshot_id", hib, "node_id", rec.NodeID)
	}
	return err
}

// dropDurable removes a snapshot's durable copy from the blob store,
// through the first node that can, within CleanupTimeout (and ctx). A
// copy that could not be removed stays in the blob store: no reconcile
// or GC finds a manifest that no row names yet (its chunks stay with it;
// docs/reliability.md, "Reliability fixes of issue 30, item 10"); the
// failure is logged with the snapshot's ID.
func (s *Service) dropDurable(ctx context.Context, snapshotID string) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.CleanupTimeout)
	defer cancel()
	for _, id := range s.nodes.IDs() {
		if nr, err := s.st.GetNode(ctx, id); err == nil && nr.State != store.NodeReady {
			continue
		}
		n, _ := s.nodes.Node(id)
		err := n.DeleteSnapshot(ctx, snapshotID)
		if err == nil || errdefs.IsNotFound(err) {
			return
		}
		s.log.Warn("remove a durable snapshot (GC leaves its chunks until its manifest goes)", "snapshot_id", snapshotID, "node_id", id, "err", err)
	}
}

// resumeElsewhere moves a hibernated sandbox to another node when its
// own cannot take it back (lost, left, draining, or full: originFull,
// its resume refused for lack of room) and its image can leave it: the
// target node adopts it (fetching the image from its peers or the store)
// and the row names the target; the caller then resumes it there. The
// image leaves when it is durable, or, from a draining node that is ready
// and has a blob store and an address, while its upload still runs (the
// target fetches it from that node as a peer). ok false: it stays where
// it is (its node is fine, or the image is only on that node's disk); a
// draining node that cannot let it go is a refusal naming the drain.
//
// Its node's row is read fresh, not from the placement view: a drain
// committed through another replica moves the sandbox at its next
// connect instead of resuming it there.
func (s *Service) resumeElsewhere(ctx context.Context, rec store.Sandbox, originFull bool) (store.Sandbox, bool, error) {
	ctx = tenant.With(ctx, teamOf(rec)) // a drain's moves too
	origin, err := s.st.GetNode(ctx, rec.NodeID)
	known := err == nil
	if err != nil && !errdefs.IsNotFound(err) {
		return rec, false, err
	}
	if known && origin.State == store.NodeReady && !origin.Draining && !originFull {
		if _, ok := s.nodes.Node(rec.NodeID); ok {
			return rec, false, nil
		}
	}
	if rec.Hibernation == "" {
		if known && origin.Draining {
			// Recorded hibernated before its image was (a reconcile met
			// the drain's hibernation): resuming it on the draining node
			// would race the drain that moves it. Retried once the image
			// is recorded.
			return rec, false, drainRefusal("sandbox %s is being hibernated on node %s, which is draining: retry in a moment", rec.ID, origin.ID)
		}
		return rec, false, nil
	}
	if ok, err := s.volumesMove(ctx, rec); err != nil || !ok {
		// Its volumes' content stays on its node: it resumes there
		// (docs/volumes.md), not on a draining one.
		if err == nil && known && origin.Draining {
			err = drainRefusal("sandbox %s mounts volumes whose content is on node %s, which is draining: it resumes once the node is undrained", rec.ID, origin.ID)
		}
		return rec, false, err
	}
	drainingReady := known && origin.Draining && origin.State == store.NodeReady
	if !rec.HibernationDurable && !(drainingReady && origin.Durable && origin.Addr != "") {
		if drainingReady {
			return rec, false, hibernatedOnDraining(rec, origin)
		}
		return rec, false, nil
	}
	// Only a node that can restore the image: the origin's runtime build
	// and CPU features; and one that takes new work as its row says now.
	target, err := placing(s, func() (string, error) {
		placed, err := s.placeN(ctx, scheduler.Request{Count: 1, Source: rec.Hibernation, Each: sizeOf(rec.MemoryMB, rec.CPUCount),
			RunscBuild: origin.RunscBuild, CPUFeatures: origin.CPUFeatures, Avoid: []string{rec.NodeID}}, nil)
		if err != nil {
			return "", err
		}
		return placed[0], s.admitted(ctx, placed[0])
	})
	if err != nil {
		return rec, false, err
	}
	n, err := s.node(target)
	if err != nil {
		return rec, false, err
	}
	if target == rec.NodeID {
		return rec, false, nil
	}
	var peers []string
	if origin.State == store.NodeReady && origin.Addr != "" {
		peers = []string{origin.Addr}
	}
	policy, err := s.policyOf(ctx, rec)
	if err != nil {
		return rec, false, err
	}
	if _, err := n.Adopt(ctx, nodeapi.AdoptRequest{SandboxID: rec.ID, Hibernation: rec.Hibernation, Policy: &policy, Peers: peers}); err != nil {
		return rec, false, fmt.Errorf("sandbox %s: take it over on node %s: %w", rec.ID, target, err)
	}
	from := rec.NodeID
	rec, err = s.st.UpdateSandbox(ctx, rec.ID, func(x *store.Sandbox) error {
		if x.State != store.StateHibernated || x.Hibernation != rec.Hibernation {
			return errdefs.Conflictf("sandbox %s changed while it moved", rec.ID)
		}
		x.NodeID = target
		return nil
	})
	if err != nil {
		s.killOnNode(ctx, target, rec.ID)
		return rec, false, err
	}
	s.log.Info("hibernated sandbox moved", "sandbox_id", rec.ID, "from", from, "to", target, "snapshot_id", rec.Hibernation)
	s.event(rec, "sandbox.moved", "from node "+from+" to "+target)
	return rec, true, nil
}

// noteCopy records that a node now holds a copy of a durable snapshot
// or template (it fetched it), so placement prefers it; best effort.
func (s *Service) noteCopy(ctx context.Context, src *sourceInfo, nodeID string) {
	if src == nil || src.origin == nodeID || slices.Contains(src.holders, nodeID) {
		return
	}
	var err error
	if src.snapshot {
		_, err = s.st.UpdateSnapshot(ctx, src.id, func(sn *store.Snapshot) error {
			if !slices.Contains(sn.Copies, nodeID) {
				sn.Copies = append(sn.Copies, nodeID)
			}
			return nil
		})
	} else {
		tp, terr := s.templateOf(ctx, src.id)
		if err = terr; err == nil && !slices.Contains(tp.NodeIDs, nodeID) {
			_, err = s.st.UpdateTemplate(ctx, tp.Name, func(x *store.Template) error {
				if x.SnapshotID != src.id {
					return errdefs.NotFoundf("template of snapshot %s (rebuilt meanwhile)", src.id)
				}
				if !slices.Contains(x.NodeIDs, nodeID) {
					x.NodeIDs = append(x.NodeIDs, nodeID)
				}
				return nil
			})
		}
	}
	if err != nil && !errdefs.IsNotFound(err) {
		s.log.Warn("note a copy", "snapshot_id", src.id, "node_id", nodeID, "err", err)
	}
}

// templateOf finds the template row naming snapshot id.
func (s *Service) templateOf(ctx context.Context, id string) (store.Template, error) {
	list, err := s.st.ListTemplates(ctx)
	if err != nil {
		return store.Template{}, err
	}
	for _, tp := range list {
		if tp.SnapshotID == id {
			return tp, nil
		}
	}
	return store.Template{}, errdefs.NotFoundf("template of snapshot %s", id)
}

// startTemplateUpload makes a template made from a sandbox durable in
// the background: every node can then create from it (fetching it).
func (s *Service) startTemplateUpload(name, snapID string) {
	s.inBackground(func(ctx context.Context) error { return s.uploadTemplate(ctx, name, snapID) },
		"template upload (it stays on its node)", "template_id", name, "snapshot_id", snapID)
}

func (s *Service) uploadTemplate(ctx context.Context, name, snapID string) error {
	tp, err := s.st.GetTemplate(ctx, name)
	if err != nil || tp.SnapshotID != snapID || len(tp.NodeIDs) == 0 {
		return nil // replaced or deleted meanwhile
	}
	n, err := s.node(tp.NodeIDs[0])
	if err != nil {
		return err
	}
	_, err = s.uploadOn(ctx, n, snapID)
	switch {
	case errdefs.IsConflict(err), errdefs.IsNotFound(err):
		return nil
	case err != nil:
		return err
	}
	tp, err = s.st.GetTemplate(ctx, name)
	if err != nil || tp.SnapshotID != snapID {
		s.dropDurable(context.WithoutCancel(ctx), snapID) // replaced while it uploaded
		return nil
	}
	tp.Storage = store.StorageDurable
	if _, err := s.st.PutTemplate(ctx, tp); err != nil {
		return err
	}
	s.log.Info("template durable", "template_id", name, "snapshot_id", snapID)
	return nil
}
