package api

import (
	"net/http"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/store"
)

// Secret is E2B's Secret: a secret's metadata, never its value.
type Secret struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	CurrentVersion int64             `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      string            `json:"createdAt"`
	UpdatedAt      string            `json:"updatedAt"`
}

// NewSecret is E2B's NewSecret (POST /secrets); SecretUpdate (POST
// /secrets/{secretID}) is the same without the name.
type NewSecret struct {
	Name     string            `json:"name"`
	Value    string            `json:"value"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// SecretUpdate is E2B's SecretUpdate.
type SecretUpdate struct {
	Value    string            `json:"value"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

func secretOf(s store.Secret) Secret {
	return Secret{SecretID: s.ID, Name: s.Name, CurrentVersion: s.Version, Metadata: s.Metadata,
		CreatedAt: rfc3339(s.CreatedAt), UpdatedAt: rfc3339(s.UpdatedAt)}
}

func (s *Server) secretRoutes() []route {
	return []route{
		{"GET /secrets", s.listSecrets, user},
		{"POST /secrets", s.createSecret, user},
		{"GET /secrets/{secretID}", s.getSecret, user},
		{"POST /secrets/{secretID}", s.updateSecret, user},
		{"DELETE /secrets/{secretID}", s.deleteSecret, user},
	}
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) {
	limit, err := parseLimit(r.URL.Query(), control.MaxSecretsPage)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	list, next, err := s.c.ListSecrets(r.Context(), teamOf(r), limit, r.URL.Query().Get("nextToken"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]Secret, 0, len(list))
	for _, x := range list {
		out = append(out, secretOf(x))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) createSecret(w http.ResponseWriter, r *http.Request) {
	var body NewSecret
	if !decode(w, r, &body) {
		return
	}
	sec, err := s.c.CreateSecret(r.Context(), teamOf(r), body.Name, body.Value, body.Metadata)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	noteAudit(r, sec.ID, "name "+sec.Name)
	writeJSON(w, http.StatusCreated, secretOf(sec))
}

func (s *Server) getSecret(w http.ResponseWriter, r *http.Request) {
	sec, err := s.c.GetSecret(r.Context(), teamOf(r), r.PathValue("secretID"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, secretOf(sec))
}

func (s *Server) updateSecret(w http.ResponseWriter, r *http.Request) {
	var body SecretUpdate
	if !decode(w, r, &body) {
		return
	}
	sec, err := s.c.UpdateSecret(r.Context(), teamOf(r), r.PathValue("secretID"), body.Value, body.Metadata)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, secretOf(sec))
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	if err := s.c.DeleteSecret(r.Context(), teamOf(r), r.PathValue("secretID")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
