package control

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// BuildImage makes template req.Name from an OCI image on a node the
// scheduler picks (the node pulls it from its registry) and catalogs it
// as Snapshot with a template does: the template replaces an older one of
// its name, and is made durable in the background so every node can
// create from it. It returns the template's snapshot ID.
func (s *Service) BuildImage(ctx context.Context, req nodeapi.ImageBuildRequest) (string, error) {
	if err := ids.ValidateName("template name", req.Name); err != nil {
		return "", err
	}
	// On a node that takes new work as its row says now (drain.go).
	nodeID, err := placing(s, func() (string, error) {
		id, _, err := s.place(ctx, CreateRequest{}, nil)
		if err != nil {
			return "", err
		}
		return id, s.admitted(ctx, id)
	})
	if err != nil {
		return "", fmt.Errorf("place the image build: %w", err)
	}
	n, err := s.node(nodeID)
	if err != nil {
		return "", err
	}
	info, err := n.BuildImage(ctx, req)
	if err != nil {
		return "", err
	}
	sn := snapshotRecord(info, nodeID)
	if nr, err := s.st.GetNode(ctx, nodeID); err == nil {
		sn.RunscBuild, sn.CPUFeatures = nr.RunscBuild, nr.CPUFeatures
	}
	old, oerr := s.st.GetTemplate(ctx, req.Name)
	if _, err := s.st.PutTemplate(ctx, store.Template{Name: req.Name, TeamID: old.TeamID, SnapshotID: info.ID, NodeIDs: []string{nodeID},
		Storage: store.StorageLocal, RunscBuild: sn.RunscBuild, CPUFeatures: sn.CPUFeatures, Spec: old.Spec}); err != nil {
		return "", err
	}
	if oerr == nil && old.SnapshotID != "" && old.SnapshotID != info.ID {
		go s.dropEverywhere(context.WithoutCancel(ctx), old.SnapshotID)
	}
	s.invalidateView()
	s.startTemplateUpload(req.Name, info.ID)
	return info.ID, nil
}

// Resolve returns the ID of the snapshot ref names now for a team ("":
// the default team): one of its snapshots by ID or name, or a template it
// may use by name (errdefs.ErrNotFound: none).
func (s *Service) Resolve(ctx context.Context, team, ref string) (string, error) {
	id, err := s.resolveStored(ctx, teamOr(team), ref)
	if errdefs.IsNotFound(err) {
		// A template every node builds (base) has no row: the first
		// node's (in ID order) stands for it.
		list, lerr := s.Templates(ctx)
		if lerr != nil {
			return "", lerr
		}
		for _, m := range list {
			if m.ID == ref || slices.Contains(m.Names, ref) {
				return m.ID, nil
			}
		}
		return "", err
	}
	return id, err
}

// ResolveStored is Resolve from the store's rows alone: no node is asked,
// so a miss costs one read. For names only a store row can carry (the
// snapshots and templates Spore made through the control plane). Team ""
// is the default team.
func (s *Service) ResolveStored(ctx context.Context, team, ref string) (string, error) {
	return s.resolveStored(ctx, teamOr(team), ref)
}

// resolveStored is ResolveStored for a team ("": any snapshot by ID,
// every template).
func (s *Service) resolveStored(ctx context.Context, team, ref string) (string, error) {
	r, err := s.st.ResolveRef(ctx, team, ref)
	if err != nil {
		return "", err
	}
	if r.Template != nil && !store.TemplateVisible(team, *r.Template) {
		return "", errdefs.NotFoundf("template %s not found", ref)
	}
	if r.Snapshot != nil {
		return r.Snapshot.ID, nil
	}
	return r.Template.SnapshotID, nil
}

// ExportKeyPrefix is where exported OCI layouts wait in the blob store
// for the API replica that streams them to its client (and then deletes
// them).
const ExportKeyPrefix = "exports/"

// NewExportKey mints the blob key of one exported OCI layout (a tar).
func NewExportKey() string { return ExportKeyPrefix + ids.New('x') + ".tar" }

// Export writes a running sandbox's filesystem as an OCI image on the
// sandbox's node: pushed to req.Ref, or as a layout tar into the blob
// store under req.BlobKey, which must be one NewExportKey minted (so an
// export never overwrites a snapshot's objects). LayoutDir is for
// operators: the API never sets it.
func (s *Service) Export(ctx context.Context, sandboxID string, req nodeapi.ExportRequest) (nodeapi.ExportInfo, error) {
	if k := req.BlobKey; k != "" && (!strings.HasPrefix(k, ExportKeyPrefix) || !strings.HasSuffix(k, ".tar") || strings.Count(k, "/") != 1) {
		return nodeapi.ExportInfo{}, errdefs.Invalidf("export %s: blob key %q is not an export key (%s<id>.tar)", sandboxID, k, ExportKeyPrefix)
	}
	rec, err := s.st.GetSandbox(ctx, sandboxID)
	if err != nil {
		return nodeapi.ExportInfo{}, err
	}
	if rec.State != store.StateRunning {
		return nodeapi.ExportInfo{}, errdefs.Conflictf("sandbox %s is %s: only a running sandbox exports (connect to it first)", sandboxID, rec.State)
	}
	n, err := s.nodeOf(rec)
	if err != nil {
		return nodeapi.ExportInfo{}, err
	}
	req.SandboxID = sandboxID
	return n.Export(ctx, req)
}

// ExportSnapshot exports the filesystem of snapshot ref (a snapshot or a
// template) for a team: a sandbox of the team's is started from it for
// the export and killed after.
func (s *Service) ExportSnapshot(ctx context.Context, team, ref string, req nodeapi.ExportRequest) (nodeapi.ExportInfo, error) {
	sb, err := s.scratch(ctx, team, ref, "export")
	if err != nil {
		return nodeapi.ExportInfo{}, err
	}
	defer s.dropScratch(ctx, sb.ID)
	return s.Export(ctx, sb.ID, req)
}

// scratch starts snapshot (or template) ref in a sandbox of the team's
// for the control plane's own use (metadata spore.<purpose>: the ref);
// dropScratch kills it, however the work on it ended.
func (s *Service) scratch(ctx context.Context, team, ref, purpose string) (Sandbox, error) {
	return s.Create(ctx, CreateRequest{TeamID: team, TemplateID: ref, Timeout: 30 * time.Minute,
		Metadata: map[string]string{"spore." + purpose: ref}})
}

// dropScratch kills a scratch sandbox, even after ctx ended.
func (s *Service) dropScratch(ctx context.Context, id string) {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := s.Kill(kctx, id); err != nil && !errdefs.IsNotFound(err) {
		s.log.Warn("kill a scratch sandbox", "sandbox_id", id, "err", err)
	}
}
