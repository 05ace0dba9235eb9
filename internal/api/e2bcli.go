package api

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
)

// What the stock E2B CLI (`e2b template publish/unpublish`) needs beyond
// the SDK's build routes: E2B's template update. `public` is kept in the
// template's store row (Spec) and reported by the template list, the
// alias answer and GET /templates/{templateID}; a public template is
// every team's to use (teamtemplates.go).

// TemplateUpdate is E2B's TemplateUpdateRequest.
type TemplateUpdate struct {
	Public *bool `json:"public"`
}

// TemplateUpdateResponse is E2B's TemplateUpdateResponse (PATCH /v2).
type TemplateUpdateResponse struct {
	Names []string `json:"names"`
}

// templateUpdateV1 serves PATCH /templates/{templateID}: E2B's v1 answers
// 200 with no body.
func (s *Server) templateUpdateV1(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.updateTemplate(w, r); ok {
		w.WriteHeader(http.StatusOK)
	}
}

// templateUpdateV2 serves PATCH /v2/templates/{templateID} (the CLI's
// publish and unpublish): 200 with the template's names.
func (s *Server) templateUpdateV2(w http.ResponseWriter, r *http.Request) {
	if name, ok := s.updateTemplate(w, r); ok {
		writeJSON(w, http.StatusOK, TemplateUpdateResponse{Names: []string{s.shownName(r.Context(), name)}})
	}
}

// updateTemplate applies the request to the template {templateID} (a
// name of the team's, a key or its snapshot ID) and returns its key;
// false: it answered.
func (s *Server) updateTemplate(w http.ResponseWriter, r *http.Request) (string, bool) {
	ref := r.PathValue("templateID")
	if ids.Validate("template ID", ref) != nil && ids.ValidateName("template name", ref) != nil {
		s.fail(w, r, errdefs.Invalidf("template ID %q is malformed", ref))
		return "", false
	}
	var req TemplateUpdate
	if !decode(w, r, &req) {
		return "", false
	}
	name, err := s.teamTemplateName(r.Context(), teamOf(r), ref)
	if errdefs.IsNotFound(err) && s.builtIn(r.Context(), ref) {
		err = errdefs.Conflictf("template %s is built into the nodes: it cannot be published or unpublished", ref)
	}
	if err == nil {
		err = s.templateAccess(r.Context(), teamOf(r), name, true)
	}
	if err != nil {
		s.fail(w, r, err)
		return "", false
	}
	if req.Public != nil {
		if err := s.setPublic(r.Context(), name, *req.Public); err != nil {
			s.fail(w, r, err)
			return "", false
		}
	}
	return name, true
}

// setPublic writes the flag into the template row's Spec, keeping the
// other keys there.
func (s *Server) setPublic(ctx context.Context, name string, public bool) error {
	_, err := s.st.UpdateTemplate(ctx, name, func(t *store.Template) error {
		spec, err := withSpecKey(t.Spec, "public", public)
		if err != nil {
			return fmt.Errorf("template %s: %w", name, err)
		}
		t.Spec = spec
		return nil
	})
	if errdefs.IsNotFound(err) {
		// A name known only from its builds (none finished) or a template
		// built into every node (base): no row holds its flags.
		return errdefs.Conflictf("template %s has no stored template (built into the nodes, or no build of it finished): it cannot be published or unpublished", name)
	}
	return err
}

// builtIn reports whether a node holds a template named ref that the
// store has no row for (base).
func (s *Server) builtIn(ctx context.Context, ref string) bool {
	list, err := s.c.Templates(ctx)
	if err != nil {
		return false
	}
	for _, m := range list {
		if slices.Contains(m.Names, ref) {
			return true
		}
	}
	return false
}

// withSpecKey sets one key of a Spec JSON object, keeping the others.
func withSpecKey(spec []byte, key string, v any) ([]byte, error) {
	m := map[string]json.RawMessage{}
	if len(bytes.TrimSpace(spec)) > 0 {
		if err := json.Unmarshal(spec, &m); err != nil {
			return nil, fmt.Errorf("template spec is not a JSON object: %w", err)
		}
		if m == nil { // the spec was JSON null
			m = map[string]json.RawMessage{}
		}
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	m[key] = b
	return json.Marshal(m)
}

// specPublic reads the public flag of a template row's Spec (false when
// absent or unreadable).
func specPublic(spec []byte) bool { return store.TemplatePublic(spec) }

// templatePublic reads a template's public flag by name (false without a
// row).
func (s *Server) templatePublic(ctx context.Context, name string) (bool, error) {
	t, err := s.st.GetTemplate(ctx, name)
	switch {
	case errdefs.IsNotFound(err):
		return false, nil
	case err != nil:
		return false, err
	}
	return specPublic(t.Spec), nil
}

// The upload URL of GET /templates/{templateID}/files/{hash} must work
// for an SDK that PUTs to it with no headers: the E2B CLI 2.19 bundles
// one (it expects a presigned S3 URL). So the URL is presigned: a
// signature over the template and the hash, keyed by the ID of the
// template's waiting build. That ID is random (122 bits), lives in the
// store (so any API replica checks the signature) and is known only to
// API key holders; the URL stops working when the build starts (no build
// waits) or goes, which is when the SDK is done uploading.

// SignedUploadRoute is the presigned upload: public, its signature is
// its credential (without one it answers 401).
const SignedUploadRoute = "PUT /templates/{templateID}/files/{hash}/signed"

func uploadSignature(buildID, template, hash string) string {
	m := hmac.New(sha256.New, []byte(buildID))
	m.Write([]byte("spore-template-upload\x00" + template + "\x00" + hash))
	return hex.EncodeToString(m.Sum(nil))
}

// signedUploadPath is the presigned upload path for template's files
// hash, signed with its newest waiting build ("": no build waits).
func (s *Server) signedUploadPath(ctx context.Context, template, hash string) (string, error) {
	builds, err := s.st.ListBuilds(ctx, template)
	if err != nil {
		return "", err
	}
	for _, b := range builds { // newest first
		if b.Status == store.BuildWaiting {
			return "/templates/" + template + "/files/" + hash + "/signed?signature=" + uploadSignature(b.ID, template, hash), nil
		}
	}
	return "", nil
}

// signedUpload serves the presigned upload: the signature must be one of
// a waiting build of the template; then it is the authenticated PUT.
func (s *Server) signedUpload(w http.ResponseWriter, r *http.Request) {
	sig, err := hex.DecodeString(r.URL.Query().Get("signature"))
	if err != nil || len(sig) != sha256.Size {
		writeError(w, http.StatusUnauthorized, "the upload URL has no valid signature: ask GET /templates/{templateID}/files/{hash} for one")
		return
	}
	t := r.PathValue("templateID")
	if err := ids.ValidateName("template ID", t); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if !s.buildsOrFail(w) {
		return
	}
	builds, err := s.st.ListBuilds(r.Context(), t)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	for _, b := range builds {
		want, _ := hex.DecodeString(uploadSignature(b.ID, t, r.PathValue("hash")))
		if b.Status == store.BuildWaiting && hmac.Equal(sig, want) {
			s.putFiles(w, r)
			return
		}
	}
	writeError(w, http.StatusUnauthorized, "the upload URL's signature is not valid (or its build no longer waits for files)")
}
