package api

import (
	"errors"
	"net/http"
	"os"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/volume"
	"github.com/spore-run/spore/internal/volume/content"
)

// Volume is E2B's Volume (GET /volumes), with Spore's settings beside
// its fields: the stock SDK reads volumeID and name and ignores the rest.
type Volume struct {
	VolumeID  string `json:"volumeID"`
	Name      string `json:"name"`
	Mode      string `json:"mode"`
	SizeMB    int64  `json:"sizeMB"` // the quota, MiB
	CreatedAt string `json:"createdAt"`
	// NodeID is Spore's: the node that holds the volume's content (absent
	// until one does); sandboxes that mount it are placed there.
	NodeID string `json:"sporeNodeID,omitempty"`
}

// VolumeAndToken is E2B's VolumeAndToken (POST /volumes, GET
// /volumes/{volumeID}): the volume and the token of its content API.
type VolumeAndToken struct {
	Volume
	Token string `json:"token"`
	// Usage is Spore's, in GET /volumes/{volumeID} alone: the bytes in
	// use and the capacity, from the node that holds the content; absent
	// when no node holds any yet or its node did not answer.
	Usage *VolumeUsage `json:"usage,omitempty"`
}

// VolumeUsage is a volume's bytes in use and its capacity, as the file
// system of its image counts them (the capacity is the size less that
// file system's own structures).
type VolumeUsage struct {
	UsedBytes     int64 `json:"usedBytes"`
	CapacityBytes int64 `json:"capacityBytes"`
}

// NewVolume is E2B's NewVolume (POST /volumes): the stock SDK sends the
// name; mode and sizeMB are Spore's.
type NewVolume struct {
	Name string `json:"name"`
	// Mode is "shared" (the default: many sandboxes, outside snapshots)
	// or "exclusive" (one sandbox, captured with its snapshots).
	Mode string `json:"mode,omitempty"`
	// SizeMB is the quota in MiB (0: volume.DefaultSize).
	SizeMB int64 `json:"sizeMB,omitempty"`
}

func volumeOf(v store.Volume) Volume {
	return Volume{VolumeID: v.ID, Name: v.Name, Mode: v.Mode, SizeMB: v.SizeBytes / volume.MiB, CreatedAt: rfc3339(v.CreatedAt), NodeID: v.NodeID}
}

func (s *Server) volumeRoutes() []route {
	return []route{
		{"GET /volumes", s.listVolumes, user},
		{"POST /volumes", s.createVolume, user},
		{"GET /volumes/{volumeID}", s.getVolume, user},
		{"DELETE /volumes/{volumeID}", s.deleteVolume, user},
	}
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) {
	limit, err := parseLimit(r.URL.Query(), volume.MaxPage)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	list, next, err := s.vols.List(r.Context(), teamOf(r), limit, r.URL.Query().Get("nextToken"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]Volume, 0, len(list))
	for _, v := range list {
		out = append(out, volumeOf(v))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) {
	var body NewVolume
	if !decode(w, r, &body) {
		return
	}
	if body.SizeMB < 0 || body.SizeMB > volume.MaxSize/volume.MiB {
		s.fail(w, r, errdefs.Invalidf("volume sizeMB %d: must be between %d and %d (0: %d)", body.SizeMB, volume.MinSize/volume.MiB, volume.MaxSize/volume.MiB, volume.DefaultSize/volume.MiB))
		return
	}
	v, err := s.vols.Create(r.Context(), volume.CreateOptions{TeamID: teamOf(r), Name: body.Name, Mode: body.Mode, Size: body.SizeMB * volume.MiB})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	noteAudit(r, v.ID, "name "+v.Name)
	writeJSON(w, http.StatusCreated, VolumeAndToken{Volume: volumeOf(v), Token: v.Token})
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.vols.Get(r.Context(), teamOf(r), r.PathValue("volumeID"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := VolumeAndToken{Volume: volumeOf(v), Token: v.Token}
	if s.c != nil && v.NodeID != "" {
		if u, err := s.c.VolumeUsage(r.Context(), v); err == nil {
			out.Usage = &VolumeUsage{UsedBytes: u.UsedBytes, CapacityBytes: u.CapacityBytes}
		} else if !errdefs.IsNotFound(err) {
			s.log.Warn("volume usage: its node did not answer", "volume_id", v.ID, "node_id", v.NodeID, "err", err)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.vols.Delete(r.Context(), teamOf(r), r.PathValue("volumeID"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if s.c != nil {
		s.c.DropVolumeContent(v)
	}
	w.WriteHeader(http.StatusNoContent)
}

// volumeToken checks a content request's token (Authorization: Bearer
// spv_..., as the stock SDK sends it) and returns its volume.
func (s *Server) volumeToken(r *http.Request, ref string) (store.Volume, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		token = ""
	}
	v, err := s.vols.Authorize(r.Context(), ref, token)
	if errors.Is(err, volume.ErrBadToken) {
		return v, content.StatusError(http.StatusUnauthorized, err.Error())
	}
	if err != nil {
		return v, content.StatusError(StatusOf(err), s.publicMessage(r, StatusOf(err), err))
	}
	return v, nil
}

// forwardVolume serves a content request on a fleet's replica: its token
// checked here, the files served by the node that holds the volume.
func (s *Server) forwardVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.volumeToken(r, r.PathValue("volumeID"))
	if err != nil {
		content.Fail(w, err)
		return
	}
	s.volFwd(w, r, v)
}

// openVolume is the content API's way in: the volume's own token
// (Authorization: Bearer spv_..., as the stock SDK sends it), then its
// directory. A wrong token and an unknown volume are the same 401.
func (s *Server) openVolume(r *http.Request, ref string) (*os.Root, error) {
	v, err := s.volumeToken(r, ref)
	if err != nil {
		return nil, err
	}
	root, err := s.volFS(r.Context(), v)
	if err != nil {
		return nil, content.StatusError(StatusOf(err), s.publicMessage(r, StatusOf(err), err))
	}
	return root, nil
}
