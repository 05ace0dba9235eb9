package api

import (
	"context"
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

// TeamInfo is a team as Spore's own routes show it; GET /teams/{id}
// adds what it uses now.
type TeamInfo struct {
	TeamID    string     `json:"teamID"`
	Name      string     `json:"name"`
	CreatedAt string     `json:"createdAt"`
	Usage     *TeamUsage `json:"usage,omitempty"`
}

// TeamUsage is what a team holds now. Running counts sandboxes that hold
// a host's resources (running or paused in memory); VCPUs and MemoryMB
// are their limits; Hibernated ones hold only storage.
type TeamUsage struct {
	Running       int   `json:"running"`
	Hibernated    int   `json:"hibernated"`
	VCPUs         int   `json:"vcpus"`
	MemoryMB      int   `json:"memoryMB"`
	Snapshots     int   `json:"snapshots"`
	SnapshotBytes int64 `json:"snapshotBytes"`
	Volumes       int   `json:"volumes"`
	VolumeBytes   int64 `json:"volumeBytes"` // their quotas' sum
}

func teamInfo(t store.Team) TeamInfo {
	return TeamInfo{TeamID: t.ID, Name: t.Name, CreatedAt: rfc3339(t.CreatedAt)}
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

// CreateTeamRequest is POST /teams's body.
type CreateTeamRequest struct {
	Name string `json:"name"`
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
	t := store.Team{ID: ids.New('t'), Name: req.Name, CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	if err := s.st.CreateTeam(r.Context(), t); err != nil {
		if errdefs.IsAlreadyExists(err) {
			err = errdefs.Conflictf("a team named %q exists", req.Name)
		}
		s.fail(w, r, err)
		return
	}
	by, _ := KeyOf(r.Context())
	s.log.Info("team created", "team_id", t.ID, "name", t.Name, "by", by.ID)
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
	u, err := s.usage(r.Context(), t.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	ti := teamInfo(t)
	ti.Usage = &u
	writeJSON(w, http.StatusOK, ti)
}

// usage sums what a team holds, a page of rows at a time.
func (s *Server) usage(ctx context.Context, team string) (TeamUsage, error) {
	var u TeamUsage
	for cursor := ""; ; {
		page, next, err := s.st.ListSandboxes(ctx, store.SandboxFilter{TeamID: team, Limit: 1000, Cursor: cursor,
			States: []string{store.StateCreating, store.StateRunning, store.StatePaused, store.StateHibernated}})
		if err != nil {
			return u, err
		}
		for _, sb := range page {
			if sb.State == store.StateHibernated {
				u.Hibernated++
				continue
			}
			u.Running++
			u.VCPUs += sb.CPUCount
			u.MemoryMB += sb.MemoryMB
		}
		if cursor = next; next == "" {
			break
		}
	}
	for cursor := ""; ; {
		page, next, err := s.st.ListSnapshots(ctx, store.SnapshotFilter{TeamID: team, Limit: 1000, Cursor: cursor})
		if err != nil {
			return u, err
		}
		for _, sn := range page {
			u.Snapshots++
			u.SnapshotBytes += sn.SizeBytes
		}
		if cursor = next; next == "" {
			break
		}
	}
	for cursor := ""; ; {
		page, next, err := s.st.ListVolumes(ctx, team, 1000, cursor)
		if err != nil {
			return u, err
		}
		for _, v := range page {
			u.Volumes++
			u.VolumeBytes += v.SizeBytes
		}
		if cursor = next; next == "" {
			break
		}
	}
	return u, nil
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
			owned = append(owned, tp.Name)
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
