package api

import (
	"context"
	"net/http"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// Templates and teams (docs/teams.md): a template belongs to the team
// that made it (its first build, or the snapshot saved as it); template
// names are the deployment's (one team's name is taken for the others).
// Another team sees a template only when it is public (E2B's publish),
// and changes it never: a private template of another team answers 404,
// like one that does not exist; a public one 403 to a change. Templates
// every node builds (base) are every team's to use.

// templateOwner is the team a template name belongs to: its row's (a
// row from before teams: the default team's), else its builds' (none of
// which finished yet). exists false: no team uses the name (or it is a
// template every node builds).
func (s *Server) templateOwner(ctx context.Context, name string) (owner string, public, exists bool, err error) {
	tp, err := s.st.GetTemplate(ctx, name)
	switch {
	case err == nil:
		return teamOrDefault(tp.TeamID), specPublic(tp.Spec), true, nil
	case !errdefs.IsNotFound(err):
		return "", false, false, err
	}
	builds, err := s.st.ListBuilds(ctx, name)
	if err != nil || len(builds) == 0 {
		return "", false, false, err
	}
	return teamOrDefault(builds[len(builds)-1].TeamID), false, true, nil // the oldest build claimed it
}

func teamOrDefault(t string) string {
	if t == "" {
		return store.DefaultTeam
	}
	return t
}

// templateAccess checks the caller's team may read (write false) or
// change (write true) template name: nil, or the error to answer (404
// for another team's private template, 403 for a change to another
// team's public one). A name no team uses passes: the route says what
// that means (a build claims it; a read finds nothing).
func (s *Server) templateAccess(ctx context.Context, team, name string, write bool) error {
	if nodeapi.BuiltinTemplate(name) {
		if write {
			return errdefs.Conflictf("template %s is built into the nodes: it cannot be changed", name)
		}
		return nil
	}
	owner, public, exists, err := s.templateOwner(ctx, name)
	switch {
	case err != nil:
		return err
	case !exists || owner == team:
		return nil
	case !public:
		return errdefs.NotFoundf("template %s not found", name)
	case write:
		return errdefs.Forbiddenf("template %s is another team's (public: it may be used, not changed)", name)
	}
	return nil
}

// templateOf checks the {templateID} of a build route (a template name:
// E2B's template ID is the name here) and that the caller's team may
// read or change it.
func (s *Server) templateOf(w http.ResponseWriter, r *http.Request, write bool) (string, bool) {
	t := r.PathValue("templateID")
	if err := ids.ValidateName("template ID", t); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return "", false
	}
	if err := s.templateAccess(r.Context(), teamOf(r), t, write); err != nil {
		s.fail(w, r, err)
		return "", false
	}
	return t, true
}

// claimTemplateName checks a build may make template name for the
// caller's team: a name another team uses is taken (409, whether that
// template is public or not: names are the deployment's).
func (s *Server) claimTemplateName(ctx context.Context, team, name string) error {
	if nodeapi.BuiltinTemplate(name) {
		return errdefs.Conflictf("template name %s is built into the nodes: choose another", name)
	}
	owner, _, exists, err := s.templateOwner(ctx, name)
	if err == nil && exists && owner != team {
		err = errdefs.Conflictf("template name %s is taken: template names are unique across the deployment; choose another", name)
	}
	return err
}
