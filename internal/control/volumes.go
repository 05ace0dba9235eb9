package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/volume"
)

// VolumeRequest is a volume a create asks to show at Path (E2B's
// volumeMounts entry, named by the volume's name or ID).
type VolumeRequest struct {
	Name     string
	Path     string
	ReadOnly bool
}

// validateVolumeRequests checks a create's mounts without the store:
// names or IDs well formed, paths valid and apart, at most MaxMounts.
func validateVolumeRequests(reqs []VolumeRequest) error {
	paths := make([]string, len(reqs))
	for i, r := range reqs {
		if err := volume.ValidateRef(r.Name); err != nil {
			return err
		}
		paths[i] = r.Path
	}
	return volume.ValidateMounts(paths)
}

// resolveVolumes checks a create's volume mounts and reads their
// volumes: the mounts to record, and the node that holds their content
// ("" when none has yet). Volumes on two nodes cannot be mounted
// together.
func resolveVolumes(ctx context.Context, st store.Volumes, team string, reqs []VolumeRequest) ([]store.VolumeMount, string, error) {
	if len(reqs) == 0 {
		return nil, "", nil
	}
	paths := make([]string, len(reqs))
	for i, r := range reqs {
		paths[i] = r.Path
	}
	if err := volume.ValidateMounts(paths); err != nil {
		return nil, "", err
	}
	var out []store.VolumeMount
	home := ""
	for _, r := range reqs {
		if err := volume.ValidateRef(r.Name); err != nil {
			return nil, "", err
		}
		v, err := st.GetVolume(ctx, team, r.Name)
		if errdefs.IsNotFound(err) {
			return nil, "", fmt.Errorf("%w: no volume %q", errdefs.ErrNotFound, r.Name)
		}
		if err != nil {
			return nil, "", err
		}
		if slices.ContainsFunc(out, func(m store.VolumeMount) bool { return m.VolumeID == v.ID }) {
			return nil, "", errdefs.Invalidf("volume %s is mounted twice", v.Name)
		}
		if v.NodeID != "" {
			if home != "" && home != v.NodeID {
				return nil, "", errdefs.Conflictf("volumes on different nodes (%s, %s) cannot be mounted in one sandbox", home, v.NodeID)
			}
			home = v.NodeID
		}
		out = append(out, store.VolumeMount{VolumeID: v.ID, Name: v.Name, Path: r.Path, ReadOnly: r.ReadOnly,
			Exclusive: v.Mode == store.VolumeExclusive, SizeBytes: v.SizeBytes})
	}
	return out, home, nil
}

// volumesOf is what a create mounts: the volumes it asks for, or those of
// the snapshot it is made from (which come with it: it asks for none).
// An exclusive volume the snapshot holds read-write comes from the
// snapshot's copy of it, whatever became of the volume since (ownVolumes
// gives the sandbox its own): on the snapshot's node, or, once the
// snapshot is durable, on any (its copy travels with it through the blob
// store).
func volumesOf(ctx context.Context, st store.Volumes, team string, reqs []VolumeRequest, src *sourceInfo) ([]store.VolumeMount, string, error) {
	if src == nil || len(src.volumes) == 0 {
		return resolveVolumes(ctx, st, team, reqs)
	}
	if len(reqs) > 0 {
		return nil, "", errdefs.Invalidf("snapshot %s brings its sandbox's volumes: mount none at create", src.id)
	}
	home := ""
	for _, m := range src.volumes {
		if captured(m) && !src.durable {
			if src.origin == "" {
				return nil, "", errdefs.NotFoundf("snapshot %s holds a volume's content and is on no node", src.id)
			}
			home = src.origin // its copy of the content is where it was taken
		}
	}
	for _, m := range src.volumes {
		if captured(m) {
			continue
		}
		v, err := st.GetVolume(ctx, "", m.VolumeID)
		if errdefs.IsNotFound(err) {
			return nil, "", fmt.Errorf("%w: snapshot %s mounts volume %s, which was deleted", errdefs.ErrNotFound, src.id, m.Name)
		}
		if err != nil {
			return nil, "", err
		}
		if v.NodeID != "" {
			if home != "" && home != v.NodeID {
				return nil, "", errdefs.Conflictf("snapshot %s mounts volumes on different nodes (%s, %s)", src.id, home, v.NodeID)
			}
			home = v.NodeID
		}
	}
	return src.volumes, home, nil
}

// captured reports whether a mount's content is captured with snapshots.
func captured(m store.VolumeMount) bool { return m.Exclusive && !m.ReadOnly }

// ownVolumes gives sandbox id, restored on nodeID from an image with
// mounts (a fork child, a create from a snapshot), a volume of its own
// for each exclusive volume the image holds read-write: a new record
// (volume.CopyFor) whose content the node makes from the image's copy.
// The mounts returned name them. On failure the records made are gone.
func (s *Service) ownVolumes(ctx context.Context, team, id, nodeID string, mounts []store.VolumeMount) ([]store.VolumeMount, error) {
	out := slices.Clone(mounts)
	for i, m := range mounts {
		if !captured(m) {
			continue
		}
		v := volume.CopyFor(m, team, id, nodeID)
		if err := s.st.CreateVolume(ctx, v); err != nil {
			s.dropOwnVolumes(ctx, id, out[:i])
			if errdefs.IsAlreadyExists(err) {
				return nil, fmt.Errorf("%w: the copy of volume %s for sandbox %s is named %s, which a volume has", errdefs.ErrAlreadyExists, m.Name, id, v.Name)
			}
			return nil, err
		}
		out[i] = store.VolumeMount{VolumeID: v.ID, Name: v.Name, Path: m.Path, Exclusive: true, SizeBytes: v.SizeBytes}
	}
	return out, nil
}

// dropOwnVolumes deletes the volumes made for sandbox id (ownVolumes)
// among mounts, and their content on their node: its create failed.
func (s *Service) dropOwnVolumes(ctx context.Context, id string, mounts []store.VolumeMount) {
	dctx, cancel := s.cleanupContext(ctx)
	defer cancel()
	for _, m := range mounts {
		if !captured(m) {
			continue
		}
		var gone store.Volume
		err := s.st.DeleteVolume(dctx, "", m.VolumeID, func(v store.Volume) error {
			if v.MadeFor != id {
				return errNotMine
			}
			gone = v
			return nil
		})
		switch {
		case err == nil:
			s.DropVolumeContent(gone)
		case errdefs.IsNotFound(err) || errors.Is(err, errNotMine):
		default:
			s.log.Error("volume made for a failed create left", "sandbox_id", id, "volume_id", m.VolumeID, "err", err)
		}
	}
}

var errNotMine = errors.New("not made for this sandbox")

// claimVolumes records sandbox id as a user of its volumes, on nodeID:
// the node a volume's content lives on is the first that mounts it, and
// an exclusive volume mounted read-write has one holder at a time (a
// holder whose row is gone holds nothing). A volume deleted meanwhile is
// ErrNotFound; one another create put on another node, or gave to
// another holder, meanwhile is ErrConflict. The node's mounts follow.
func claimVolumes(ctx context.Context, st store.Store, id, nodeID string, mounts []store.VolumeMount) ([]nodeapi.VolumeMount, error) {
	var out []nodeapi.VolumeMount
	for _, m := range mounts {
		holder := ""
		if captured(m) {
			v, err := st.GetVolume(ctx, "", m.VolumeID)
			if err != nil && !errdefs.IsNotFound(err) {
				return nil, err
			}
			if v.Holder != "" && v.Holder != id {
				_, err := st.GetSandbox(ctx, v.Holder)
				if err == nil {
					return nil, errdefs.Conflictf("volume %s is exclusive and sandbox %s has it mounted read-write: kill that sandbox first, or mount it read-only", m.Name, v.Holder)
				}
				if !errdefs.IsNotFound(err) {
					return nil, err
				}
			}
			holder = v.Holder
		}
		if m.Exclusive && m.ReadOnly {
			if err := holderSettled(ctx, st, m); err != nil {
				return nil, err
			}
		}
		v, err := st.UpdateVolume(ctx, "", m.VolumeID, func(v *store.Volume) error {
			if captured(m) {
				if v.Holder != holder && v.Holder != id {
					return errdefs.Conflictf("volume %s is exclusive and sandbox %s just mounted it read-write", v.Name, v.Holder)
				}
				v.Holder = id
			}
			if v.NodeID == "" {
				v.NodeID = nodeID
			}
			if v.NodeID != nodeID {
				return errdefs.Conflictf("volume %s is on node %s, not %s", v.Name, v.NodeID, nodeID)
			}
			if !slices.Contains(v.Users, id) {
				v.Users = append(v.Users, id)
			}
			return nil
		})
		if errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("%w: volume %s was deleted", errdefs.ErrNotFound, m.Name)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, nodeapi.VolumeMount{VolumeID: v.ID, SizeBytes: v.SizeBytes, Path: m.Path, ReadOnly: m.ReadOnly, Exclusive: m.Exclusive})
	}
	return out, nil
}

// holderSettled refuses a read-only mount of an exclusive volume whose
// holder is moving to another node with it (its row names another node
// than the volume's): until it runs there, neither node has the volume
// as it will be.
func holderSettled(ctx context.Context, st store.Store, m store.VolumeMount) error {
	v, err := st.GetVolume(ctx, "", m.VolumeID)
	if err != nil || v.Holder == "" || v.NodeID == "" {
		return nil // the update that follows says what is wrong
	}
	h, err := st.GetSandbox(ctx, v.Holder)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if h.NodeID != "" && h.NodeID != v.NodeID {
		return errdefs.Conflictf("volume %s is moving with sandbox %s to node %s: mount it once that sandbox runs there (connect to it)", m.Name, h.ID, h.NodeID)
	}
	return nil
}

// VolumeUsage asks the node that holds a volume's content for its bytes
// in use and its capacity. ErrNotFound when no node holds it yet (never
// mounted, nothing written); ErrUnavailable when its node cannot answer.
func (s *Service) VolumeUsage(ctx context.Context, v store.Volume) (nodeapi.VolumeUsage, error) {
	if v.NodeID == "" {
		return nodeapi.VolumeUsage{}, errdefs.NotFoundf("volume %s holds nothing yet", v.Name)
	}
	n, err := s.node(v.NodeID)
	if err != nil {
		return nodeapi.VolumeUsage{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, volumeUsageTimeout)
	defer cancel()
	return n.VolumeUsage(ctx, v.ID)
}

// volumeUsageTimeout bounds a volume info's wait for its node.
const volumeUsageTimeout = 5 * time.Second

// DropVolumeContent removes a deleted volume's content from the node that
// holds it, after the answer (in the background, as a snapshot's drop): a
// node that cannot be reached keeps the image, and the failure is logged
// with the IDs.
func (s *Service) DropVolumeContent(v store.Volume) {
	if v.NodeID == "" {
		return // never mounted: no node holds anything
	}
	s.inBackgroundCleanup(func(ctx context.Context) {
		n, err := s.node(v.NodeID)
		if err == nil {
			err = n.DeleteVolume(ctx, v.ID)
		}
		if err != nil {
			s.log.Warn("volume content left on its node", "volume_id", v.ID, "node_id", v.NodeID, "err", err)
		}
	})
}

// volumesMove reports whether a hibernated sandbox's volumes can move
// with it to another node: each is an exclusive volume it holds
// read-write (its content at the hibernation is captured with it and
// travels with its image; the new node makes the volume from it), and no
// other sandbox alive uses it (a reader on the old node keeps its view
// there). A shared or read-only mount keeps it on its node.
func (s *Service) volumesMove(ctx context.Context, rec store.Sandbox) (bool, error) {
	for _, m := range rec.VolumeMounts {
		if !captured(m) {
			return false, nil
		}
		v, err := s.st.GetVolume(ctx, "", m.VolumeID)
		if errdefs.IsNotFound(err) {
			continue // deleted meanwhile: nothing to keep it here
		}
		if err != nil {
			return false, err
		}
		for _, u := range v.Users {
			if u == rec.ID {
				continue
			}
			if _, err := s.st.GetSandbox(ctx, u); err == nil {
				return false, nil
			} else if !errdefs.IsNotFound(err) {
				return false, err
			}
		}
	}
	return true, nil
}

// rehomeVolumes records, once a sandbox that moved with its exclusive
// volumes runs on its new node, that their content is there now (the
// node made it from the hibernation's copies). The old node's image is
// removed once that node has dropped its copy of the sandbox
// (ReconcileNode). Best effort: a failure is logged, and the next resume
// tries again.
func (s *Service) rehomeVolumes(ctx context.Context, rec store.Sandbox) {
	for _, m := range rec.VolumeMounts {
		if !captured(m) {
			continue
		}
		_, err := s.st.UpdateVolume(ctx, "", m.VolumeID, func(v *store.Volume) error {
			if v.Holder != rec.ID || v.NodeID == rec.NodeID {
				return errUnchanged
			}
			v.NodeID = rec.NodeID
			return nil
		})
		switch {
		case err == nil:
			s.log.Info("volume moved with its sandbox", "volume_id", m.VolumeID, "sandbox_id", rec.ID, "node_id", rec.NodeID)
		case errors.Is(err, errUnchanged) || errdefs.IsNotFound(err):
		default:
			s.log.Warn("record a volume's new node (retried at the next resume)", "volume_id", m.VolumeID, "sandbox_id", rec.ID, "err", err)
		}
	}
}

var errUnchanged = errors.New("unchanged")

// dropMovedVolumes removes from nodeID the images of the exclusive
// volumes that moved away from it with their sandbox rec (the node's copy
// of the sandbox was just killed): those it still holds (the new node has
// their content from its hibernation; rehomeVolumes records it once it
// runs there) and those recorded elsewhere already.
func (s *Service) dropMovedVolumes(ctx context.Context, n nodeapi.Node, nodeID string, rec store.Sandbox) {
	if rec.NodeID == nodeID {
		return
	}
	for _, m := range rec.VolumeMounts {
		if !captured(m) {
			continue
		}
		v, err := s.st.GetVolume(ctx, "", m.VolumeID)
		if err != nil || v.NodeID == "" || v.NodeID == nodeID && v.Holder != rec.ID {
			continue
		}
		if err := n.DeleteVolume(ctx, m.VolumeID); err != nil {
			s.log.Warn("the old image of a volume that moved is left on its old node", "volume_id", m.VolumeID, "node_id", nodeID, "err", err)
		}
	}
}
