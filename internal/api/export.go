package api

import (
	"net/http"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
)

// ExportRequest asks for a filesystem exported as an OCI image, pushed
// to Ref with optional registry credentials.
type ExportRequest struct {
	Ref      string `json:"ref"`
	Username string `json:"username"`
	Password string `json:"password"`
}

// ExportResponse describes the pushed image.
type ExportResponse struct {
	Ref       string `json:"ref"`
	Digest    string `json:"digest"`
	Layers    int    `json:"layers"`
	Bytes     int64  `json:"bytes"`
	DiffBytes int64  `json:"diffBytes"`
	Changed   int64  `json:"changed"`
	Deleted   int64  `json:"deleted"`
}

func (s *Server) exportRoutes() []route {
	return []route{
		{"POST /sandboxes/{sandboxID}/export", s.exportSandbox, false},
		{"POST /snapshots/{snapshotID}/export", s.exportSnapshot, false},
	}
}

// exportBody reads and checks an export request (the node checks the
// reference's syntax and the registry's).
func exportBody(w http.ResponseWriter, r *http.Request) (nodeapi.ExportRequest, bool) {
	var req ExportRequest
	if !decode(w, r, &req) {
		return nodeapi.ExportRequest{}, false
	}
	switch {
	case req.Ref == "" || len(req.Ref) > 512 || strings.ContainsAny(req.Ref, " \t\n"):
		writeError(w, http.StatusBadRequest, "ref: want an image reference to push to, such as registry.example.com/team/app:v1")
		return nodeapi.ExportRequest{}, false
	case (req.Username == "") != (req.Password == ""):
		writeError(w, http.StatusBadRequest, "give both username and password, or neither")
		return nodeapi.ExportRequest{}, false
	}
	return nodeapi.ExportRequest{Ref: req.Ref, Username: req.Username, Password: req.Password}, true
}

func exportResponse(i nodeapi.ExportInfo) ExportResponse {
	return ExportResponse{Ref: i.Ref, Digest: i.Digest, Layers: i.Layers, Bytes: i.Bytes, DiffBytes: i.DiffBytes, Changed: i.Changed, Deleted: i.Deleted}
}

func (s *Server) exportSandbox(w http.ResponseWriter, r *http.Request) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	req, ok := exportBody(w, r)
	if !ok {
		return
	}
	info, err := s.c.Export(r.Context(), id, req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, exportResponse(info))
}

func (s *Server) exportSnapshot(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("snapshotID")
	if ids.Validate("snapshot ID", ref) != nil && ids.ValidateName("snapshot name", ref) != nil {
		s.fail(w, r, errdefs.Invalidf("snapshot reference %q is neither an ID nor a name", ref))
		return
	}
	req, ok := exportBody(w, r)
	if !ok {
		return
	}
	info, err := s.c.ExportSnapshot(r.Context(), ref, req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, exportResponse(info))
}
