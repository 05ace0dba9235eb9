package api

import (
	"net/http"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
)

// The teams routes (docs/teams.md): E2B's GET /teams for the stock SDK
// and CLI, and Spore's team management for operators.
func (s *Server) teamRoutes() []route {
	return []route{
		{"GET /teams", s.listTeams, user},
		{"POST /teams", s.createTeam, admin},
		{"GET /teams/{teamID}", s.getTeam, user},
		{"GET /teams/{teamID}/metrics", s.teamMetrics, user},
		{"GET /teams/{teamID}/metrics/max", s.teamMetricsMax, user},
		{"PATCH /teams/{teamID}", s.updateTeam, admin},
		{"DELETE /teams/{teamID}", s.deleteTeam, admin},
	}
}

// TeamEntry is E2B's Team: GET /teams lists these. APIKey is the mask
// of the key that asked (Spore keeps no key it could show).
type TeamEntry struct {
	TeamID    string `json:"teamID"`
	Name      string `json:"name"`
	APIKey    string `json:"apiKey"`
	IsDefault bool   `json:"isDefault"`
}

// TeamInfo is a team as Spore's own routes show it: its quotas (0: no
// limit), and on GET /teams/{id} what it uses now (store.TeamUsage:
// sandboxes counts those holding a host's resources, running or paused
// in memory; vcpus and memoryMB are their sizes; volumeBytes the volumes'
// sizes; createsLastMinute what createsPerMinute is held to).
type TeamInfo struct {
	TeamID    string           `json:"teamID"`
	Name      string           `json:"name"`
	CreatedAt string           `json:"createdAt"`
	Quotas    store.Quotas     `json:"quotas"`
	Usage     *store.TeamUsage `json:"usage,omitempty"`
}

func teamInfo(t store.Team) TeamInfo {
	return TeamInfo{TeamID: t.ID, Name: t.Name, CreatedAt: rfc3339(t.CreatedAt), Quotas: t.Quotas}
}

// listTeams answers the caller's team; an operator's, every team (the
// one it acts in is the default).
func (s *Server) listTeams(w http.ResponseWriter, r *http.Request) {
	c, _ := CallerOf(r.Context())
	var list []store.Team
	if c.Key.Role == store.RoleOperator {
		all, err := s.st.ListTeams(r.Context())
		if err != nil {
			s.fail(w, r, err)
			return
		}
		list = all
	} else {
		t, err := s.st.GetTeam(r.Context(), c.Team)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		list = []store.Team{t}
	}
	out := make([]TeamEntry, 0, len(list))
	for _, t := range list {
		out = append(out, TeamEntry{TeamID: t.ID, Name: t.Name, APIKey: c.Key.Mask, IsDefault: t.ID == c.Team})
	}
	writeJSON(w, http.StatusOK, out)
}

// CreateTeamRequest is POST /teams's body. Quotas absent: the
// deployment's default quotas (Config.DefaultTeamQuotas); given (even
// {}), those.
type CreateTeamRequest struct {
	Name   string        `json:"name"`
	Quotas *store.Quotas `json:"quotas,omitempty"`
}

// UpdateTeamRequest is PATCH /teams/{id}'s body: the quotas replace the
// team's (a quota left out is no limit).
type UpdateTeamRequest struct {
	Quotas *store.Quotas `json:"quotas"`
}

func (s *Server) createTeam(w http.ResponseWriter, r *http.Request) {
	var req CreateTeamRequest
	if !decode(w, r, &req) {
		return
	}
	if err := ids.ValidateName("team name", req.Name); err != nil {
		s.fail(w, r, err)
		return
	}
	quotas := s.defaultQuotas
	if req.Quotas != nil {
		quotas = *req.Quotas
	}
	if err := quotas.Validate(); err != nil {
		s.fail(w, r, err)
		return
	}
	t := store.Team{ID: ids.New('t'), Name: req.Name, CreatedAt: time.Now().UTC().Truncate(time.Millisecond), Quotas: quotas}
	if err := s.st.CreateTeam(r.Context(), t); err != nil {
		if errdefs.IsAlreadyExists(err) {
			err = errdefs.Conflictf("a team named %q exists", req.Name)
		}
		s.fail(w, r, err)
		return
	}
	by, _ := KeyOf(r.Context())
	s.log.Info("team created", "team_id", t.ID, "name", t.Name, "by", by.ID)
	noteAudit(r, t.ID, "name "+t.Name)
	writeJSON(w, http.StatusCreated, teamInfo(t))
}

// team reads {teamID} (an ID or a name): a team key sees only its own
// team (another is 404, like none).
func (s *Server) team(w http.ResponseWriter, r *http.Request) (store.Team, bool) {
	ref := r.PathValue("teamID")
	if ids.Validate("team ID", ref) != nil && ids.ValidateName("team name", ref) != nil {
		writeError(w, http.StatusBadRequest, "team "+ref+" is malformed")
		return store.Team{}, false
	}
	t, err := s.st.GetTeam(r.Context(), ref)
	if err == nil && !isOperator(r) && t.ID != teamOf(r) {
		err = errdefs.NotFoundf("team %s not found", ref)
	}
	if err != nil {
		s.fail(w, r, err)
		return store.Team{}, false
	}
	return t, true
}

func (s *Server) getTeam(w http.ResponseWriter, r *http.Request) {
	t, ok := s.team(w, r)
	if !ok {
		return
	}
	u, err := s.st.TeamUsage(r.Context(), t.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ti := teamInfo(t)
	ti.Usage = &u
	writeJSON(w, http.StatusOK, ti)
}

// updateTeam sets a team's quotas (operators only). Lowering one under
// what the team holds keeps what it holds and admits no more until it is
// below.
func (s *Server) updateTeam(w http.ResponseWriter, r *http.Request) {
	t, ok := s.team(w, r)
	if !ok {
		return
	}
	var req UpdateTeamRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Quotas == nil {
		s.fail(w, r, errdefs.Invalidf("nothing to change: give quotas"))
		return
	}
	t, err := s.st.SetTeamQuotas(r.Context(), t.ID, *req.Quotas)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	by, _ := KeyOf(r.Context())
	s.log.Info("team quotas set", "team_id", t.ID, "quotas", t.Quotas, "by", by.ID)
	writeJSON(w, http.StatusOK, teamInfo(t))
}

// deleteTeam removes an empty team and revokes its keys. Its templates
// count too: a template of a team that no longer exists could be
// changed or removed by no one.
func (s *Server) deleteTeam(w http.ResponseWriter, r *http.Request) {
	t, ok := s.team(w, r)
	if !ok {
		return
	}
	tpls, err := s.st.ListTemplates(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	var owned []string
	for _, tp := range tpls {
		if tp.TeamID == t.ID {
			owned = append(owned, store.TemplateNameOf(tp))
		}
	}
	if len(owned) > 0 {
		s.fail(w, r, errdefs.Conflictf("team %s still owns templates %s: remove them first", t.ID, strings.Join(owned, ", ")))
		return
	}
	if err := s.st.DeleteTeam(r.Context(), t.ID, time.Now()); err != nil {
		s.fail(w, r, err)
		return
	}
	s.keys.Forget()
	by, _ := KeyOf(r.Context())
	s.log.Info("team removed (its keys revoked)", "team_id", t.ID, "name", t.Name, "by", by.ID)
	w.WriteHeader(http.StatusNoContent)
}
