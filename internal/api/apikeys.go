package api

import (
	"net/http"

	"github.com/spore-run/spore/internal/apikey"
	"github.com/spore-run/spore/internal/store"
)

// The API key routes (E2B's /api-keys paths, Spore's shapes: a role, a
// revocation time). Admin keys only: a key's role decides what it may do,
// so making keys is an operator's act.
func (s *Server) keyRoutes() []route {
	return []route{
		{"GET /api-keys", s.listKeys, admin},
		{"POST /api-keys", s.createKey, admin},
		{"DELETE /api-keys/{apiKeyID}", s.revokeKey, admin},
	}
}

// KeyInfo is a key as listed: never the key itself, nor its hash.
type KeyInfo struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	Role      string `json:"role"`
	Source    string `json:"source"`
	Mask      string `json:"mask"`
	CreatedAt string `json:"createdAt"`
	RevokedAt string `json:"revokedAt,omitempty"`
}

// CreatedKey is a key just made: the only answer that carries it.
type CreatedKey struct {
	KeyInfo
	Key string `json:"key"`
}

func keyInfo(k store.APIKey) KeyInfo {
	ki := KeyInfo{ID: k.ID, Name: k.Name, Role: k.Role, Source: k.Source, Mask: k.Mask, CreatedAt: rfc3339(k.CreatedAt)}
	if k.Revoked() {
		ki.RevokedAt = rfc3339(k.RevokedAt)
	}
	return ki
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	all := false
	switch v := r.URL.Query().Get("revoked"); v {
	case "", "false":
	case "true":
		all = true
	default:
		writeError(w, http.StatusBadRequest, "revoked must be true or false, got "+v)
		return
	}
	list, err := s.st.ListAPIKeys(r.Context(), all)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]KeyInfo, 0, len(list))
	for _, k := range list {
		out = append(out, keyInfo(k))
	}
	writeJSON(w, http.StatusOK, out)
}

// CreateKeyRequest is POST /api-keys's body.
type CreateKeyRequest struct {
	Name string `json:"name"`
	Role string `json:"role"` // "user" (default) or "admin"
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) {
	var req CreateKeyRequest
	if !decode(w, r, &req) {
		return
	}
	key, rec, err := apikey.Create(r.Context(), s.st, s.keys, req.Name, req.Role, store.SourceAPI)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	by, _ := KeyOf(r.Context())
	s.log.Info("api key created", "key_id", rec.ID, "role", rec.Role, "by", by.ID)
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, CreatedKey{KeyInfo: keyInfo(rec), Key: key})
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) {
	rec, err := apikey.Revoke(r.Context(), s.st, s.keys, r.PathValue("apiKeyID"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	by, _ := KeyOf(r.Context())
	s.log.Info("api key revoked", "key_id", rec.ID, "by", by.ID, "effective_within", apikey.KeysFresh.String())
	w.WriteHeader(http.StatusNoContent)
}
