package api

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
)

// What the stock E2B CLI (`e2b template publish/unpublish`) needs beyond
// the SDK's build routes: E2B's template update. Spore has no teams, so
// every API key sees every template whatever the flag says; `public` is
// kept in the template's store row (Spec) and reported by the template
// list, the alias answer and GET /templates/{templateID}, so the CLI and
// scripts reading it see what they set.

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
		writeJSON(w, http.StatusOK, TemplateUpdateResponse{Names: []string{name}})
	}
}

// updateTemplate applies the request to the template {templateID} (a
// name or its snapshot ID) and returns its name; false: it answered.
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
	name, err := s.templateName(r.Context(), ref)
	if errdefs.IsNotFound(err) && s.builtIn(r.Context(), ref) {
		err = errdefs.Conflictf("template %s is built into the nodes: it cannot be published or unpublished", ref)
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
func specPublic(spec []byte) bool {
	var m struct {
		Public bool `json:"public"`
	}
	if len(spec) == 0 || json.Unmarshal(spec, &m) != nil {
		return false
	}
	return m.Public
}

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
