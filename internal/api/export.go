package api

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
)

// ExportRequest asks for a filesystem exported as an OCI image: pushed
// to Ref with optional registry credentials, or, with Format
// "oci-layout" instead of a Ref, streamed back as an OCI image layout in
// one tar (application/x-tar).
type ExportRequest struct {
	Ref      string `json:"ref,omitempty"`
	Format   string `json:"format,omitempty"`
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

// FormatOCILayout is the ExportRequest Format of an OCI image layout tar.
const FormatOCILayout = "oci-layout"

// ExportDigestHeader carries the exported image's manifest digest on a
// layout tar's response.
const ExportDigestHeader = "Spore-Image-Digest"

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
		{"POST /sandboxes/{sandboxID}/export", s.exportSandbox, user},
		{"POST /snapshots/{snapshotID}/export", s.exportSnapshot, user},
	}
}

// exportBody reads and checks an export request (the node checks the
// reference's syntax and the registry's); layout: the client asked for
// the layout tar.
func exportBody(w http.ResponseWriter, r *http.Request) (_ nodeapi.ExportRequest, layout, ok bool) {
	var req ExportRequest
	if !decode(w, r, &req) {
		return nodeapi.ExportRequest{}, false, false
	}
	switch {
	case req.Format != "" && req.Format != FormatOCILayout:
		writeError(w, http.StatusBadRequest, "format: want "+FormatOCILayout+" (the OCI image layout as a tar), or give a ref to push to instead")
		return nodeapi.ExportRequest{}, false, false
	case req.Format != "" && req.Ref != "":
		writeError(w, http.StatusBadRequest, "give a ref to push to or format "+FormatOCILayout+", not both")
		return nodeapi.ExportRequest{}, false, false
	case req.Format != "" && (req.Username != "" || req.Password != ""):
		writeError(w, http.StatusBadRequest, "username and password are for a registry: format "+FormatOCILayout+" pushes nowhere")
		return nodeapi.ExportRequest{}, false, false
	case req.Format != "":
		return nodeapi.ExportRequest{}, true, true
	case req.Ref == "" || len(req.Ref) > 512 || strings.ContainsAny(req.Ref, " \t\n"):
		writeError(w, http.StatusBadRequest, "ref: want an image reference to push to, such as registry.example.com/team/app:v1 (or format "+FormatOCILayout+" for the image as a tar)")
		return nodeapi.ExportRequest{}, false, false
	case (req.Username == "") != (req.Password == ""):
		writeError(w, http.StatusBadRequest, "give both username and password, or neither")
		return nodeapi.ExportRequest{}, false, false
	}
	return nodeapi.ExportRequest{Ref: req.Ref, Username: req.Username, Password: req.Password}, false, true
}

// exportFunc exports to the destination req names (control's Export or
// ExportSnapshot).
type exportFunc func(ctx context.Context, req nodeapi.ExportRequest) (nodeapi.ExportInfo, error)

// export pushes, or, for a layout, has the node write the layout tar into
// the shared blob store under a key minted here and streams it to the
// client from there. The blob is deleted however the request ends (an
// error, the client gone mid-stream): it exists only for this response.
func (s *Server) export(w http.ResponseWriter, r *http.Request, req nodeapi.ExportRequest, layout bool, export exportFunc) {
	if !layout {
		info, err := export(r.Context(), req)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, exportResponse(info))
		return
	}
	if s.blobs == nil {
		s.fail(w, r, errdefs.Conflictf("this API server has no blob store to carry an OCI layout from the node (start it with --blob-store, the nodes' shared one)"))
		return
	}
	req.BlobKey = control.NewExportKey()
	defer func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), time.Minute)
		defer cancel()
		if err := s.blobs.Delete(ctx, req.BlobKey); err != nil {
			s.log.Warn("delete an exported layout", "key", req.BlobKey, "err", err)
		}
	}()
	info, err := export(r.Context(), req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	st, err := s.blobs.Stat(r.Context(), req.BlobKey)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	rc, err := s.blobs.Get(r.Context(), req.BlobKey)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	defer rc.Close()
	h := w.Header()
	h.Set("Content-Type", "application/x-tar")
	h.Set("Content-Length", strconv.FormatInt(st.Size, 10))
	h.Set(ExportDigestHeader, info.Digest)
	w.WriteHeader(http.StatusOK)
	if n, err := io.Copy(w, rc); err != nil {
		// The status is sent: the client sees a short body.
		s.log.Warn("stream an exported layout", "key", req.BlobKey, "sent", n, "size", st.Size, "err", err)
	}
}

func exportResponse(i nodeapi.ExportInfo) ExportResponse {
	return ExportResponse{Ref: i.Ref, Digest: i.Digest, Layers: i.Layers, Bytes: i.Bytes, DiffBytes: i.DiffBytes, Changed: i.Changed, Deleted: i.Deleted}
}

func (s *Server) exportSandbox(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	req, layout, ok := exportBody(w, r)
	if !ok {
		return
	}
	s.export(w, r, req, layout, func(ctx context.Context, req nodeapi.ExportRequest) (nodeapi.ExportInfo, error) {
		return s.c.Export(ctx, id, req)
	})
}

func (s *Server) exportSnapshot(w http.ResponseWriter, r *http.Request) {
	ref, ok := s.snapshotRef(w, r, "snapshotID")
	if !ok {
		return
	}
	req, layout, ok := exportBody(w, r)
	if !ok {
		return
	}
	s.export(w, r, req, layout, func(ctx context.Context, req nodeapi.ExportRequest) (nodeapi.ExportInfo, error) {
		return s.c.ExportSnapshot(ctx, teamOf(r), ref, req)
	})
}
