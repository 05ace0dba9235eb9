package api

import (
	"net/http"
	"time"

	"github.com/spore-run/spore/internal/apikey"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
)

// The API key routes (E2B's /api-keys paths, Spore's shapes: a team, a
// role, a scope, an expiry, a revocation time). A team's admin key
// manages its team's keys; an operator key every team's and the operator
// keys (docs/teams.md).
func (s *Server) keyRoutes() []route {
	return []route{
		{"GET /api-keys", s.listKeys, teamAdmin},
		{"POST /api-keys", s.createKey, teamAdmin},
		{"DELETE /api-keys/{apiKeyID}", s.revokeKey, teamAdmin},
	}
}

// KeyInfo is a key as listed: never the key itself, nor its hash.
type KeyInfo struct {
	ID         string          `json:"id"`
	Name       string          `json:"name"`
	TeamID     string          `json:"teamID,omitempty"` // "" for an operator key
	Role       string          `json:"role"`
	Scope      *store.KeyScope `json:"scope,omitempty"`
	Source     string          `json:"source"`
	Mask       string          `json:"mask"`
	CreatedAt  string          `json:"createdAt"`
	ExpiresAt  string          `json:"expiresAt,omitempty"`
	LastUsedAt string          `json:"lastUsedAt,omitempty"`
	RevokedAt  string          `json:"revokedAt,omitempty"`
}

// CreatedKey is a key just made: the only answer that carries it.
type CreatedKey struct {
	KeyInfo
	Key string `json:"key"`
}

func keyInfo(k store.APIKey) KeyInfo {
	ki := KeyInfo{ID: k.ID, Name: k.Name, TeamID: k.TeamID, Role: k.Role, Scope: k.Scope, Source: k.Source, Mask: k.Mask, CreatedAt: rfc3339(k.CreatedAt)}
	if !k.ExpiresAt.IsZero() {
		ki.ExpiresAt = rfc3339(k.ExpiresAt)
	}
	if !k.LastUsedAt.IsZero() {
		ki.LastUsedAt = rfc3339(k.LastUsedAt)
	}
	if k.Revoked() {
		ki.RevokedAt = rfc3339(k.RevokedAt)
	}
	return ki
}

// isOperator reports whether the request's key is an operator's.
func isOperator(r *http.Request) bool {
	c, _ := CallerOf(r.Context())
	return c.Key.Role == store.RoleOperator
}

// keyVisible reports whether the caller may see and revoke key k: an
// operator every key, a team admin its team's.
func keyVisible(r *http.Request, k store.APIKey) bool {
	return isOperator(r) || (k.TeamID != "" && k.TeamID == teamOf(r))
}

// listKeys lists the caller's team's keys; an operator's, every key (or
// one team's: ?teamID=).
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
	only := r.URL.Query().Get("teamID")
	if !isOperator(r) {
		if only != "" && only != teamOf(r) {
			writeError(w, http.StatusNotFound, "team "+only+" not found")
			return
		}
		only = teamOf(r)
	}
	list, err := s.st.ListAPIKeys(r.Context(), all)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]KeyInfo, 0, len(list))
	for _, k := range list {
		if only == "" || k.TeamID == only {
			out = append(out, keyInfo(k))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// CreateKeyRequest is POST /api-keys's body.
type CreateKeyRequest struct {
	Name string `json:"name"`
	// Role: "member" (the default), "admin" (the team's keys too) or
	// "operator" (no team; operators only).
	Role string `json:"role"`
	// TeamID: the key's team (a team admin: its own, the default; an
	// operator: any, the team it acts in by default).
	TeamID string `json:"teamID"`
	// Scope narrows the key to operations and templates.
	Scope *store.KeyScope `json:"scope"`
	// ExpiresAt (RFC 3339) or TTLSeconds, at most one: when it stops.
	ExpiresAt  string `json:"expiresAt"`
	TTLSeconds int64  `json:"ttlSeconds"`
}

// maxKeyTTL bounds a key's life when one is given.
const maxKeyTTL = 10 * 365 * 24 * time.Hour

func (s *Server) createKey(w http.ResponseWriter, r *http.Request) {
	var req CreateKeyRequest
	if !decode(w, r, &req) {
		return
	}
	spec, err := s.keySpec(r, req)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	key, rec, err := apikey.Create(r.Context(), s.st, s.keys, spec)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	by, _ := KeyOf(r.Context())
	s.log.Info("api key created", "key_id", rec.ID, "team_id", rec.TeamID, "role", rec.Role, "by", by.ID)
	w.Header().Set("Cache-Control", "no-store")
	noteAudit(r, rec.ID, "role "+rec.Role+" in team "+orDash(rec.TeamID))
	writeJSON(w, http.StatusCreated, CreatedKey{KeyInfo: keyInfo(rec), Key: key})
}

// keySpec checks what the caller may make: a team admin only its team's
// admin and member keys; an operator any team's, and operator keys.
func (s *Server) keySpec(r *http.Request, req CreateKeyRequest) (apikey.Spec, error) {
	spec := apikey.Spec{Name: req.Name, Role: req.Role, Scope: req.Scope, Source: store.SourceAPI}
	if spec.Role == "" {
		spec.Role = store.RoleMember
	}
	switch {
	case spec.Role == store.RoleOperator && !isOperator(r):
		return spec, errdefs.Forbiddenf("only an operator key makes operator keys")
	case spec.Role == store.RoleOperator:
		if req.TeamID != "" {
			return spec, errdefs.Invalidf("an operator key belongs to no team: omit teamID")
		}
	case req.TeamID == "" || req.TeamID == teamOf(r):
		spec.TeamID = teamOf(r)
	case !isOperator(r):
		return spec, errdefs.NotFoundf("team %s not found", req.TeamID)
	default:
		if err := ids.Validate("team ID", req.TeamID); err != nil {
			return spec, err
		}
		spec.TeamID = req.TeamID
	}
	if err := apikey.ValidateScope(req.Scope, Operations()); err != nil {
		return spec, err
	}
	switch {
	case req.ExpiresAt != "" && req.TTLSeconds != 0:
		return spec, errdefs.Invalidf("give expiresAt or ttlSeconds, not both")
	case req.ExpiresAt != "":
		t, err := time.Parse(time.RFC3339, req.ExpiresAt)
		if err != nil {
			return spec, errdefs.Invalidf("expiresAt %q: want RFC 3339 (2027-01-02T15:04:05Z)", req.ExpiresAt)
		}
		spec.ExpiresAt = t
	case req.TTLSeconds < 0 || time.Duration(req.TTLSeconds)*time.Second > maxKeyTTL:
		return spec, errdefs.Invalidf("ttlSeconds %d: want 1 to %d", req.TTLSeconds, int64(maxKeyTTL/time.Second))
	case req.TTLSeconds > 0:
		spec.ExpiresAt = time.Now().Add(time.Duration(req.TTLSeconds) * time.Second)
	}
	return spec, nil
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("apiKeyID")
	if err := ids.Validate("key ID", id); err != nil {
		s.fail(w, r, err)
		return
	}
	if !isOperator(r) {
		// Another team's key, like none, is not found.
		all, err := s.st.ListAPIKeys(r.Context(), true)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		found := false
		for _, k := range all {
			found = found || (k.ID == id && keyVisible(r, k))
		}
		if !found {
			writeError(w, http.StatusNotFound, "api key "+id+" not found")
			return
		}
	}
	rec, err := apikey.Revoke(r.Context(), s.st, s.keys, id)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	by, _ := KeyOf(r.Context())
	s.log.Info("api key revoked", "key_id", rec.ID, "team_id", rec.TeamID, "by", by.ID, "effective_within", apikey.KeysFresh.String())
	w.WriteHeader(http.StatusNoContent)
}
