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
// that made it (its first build, or the snapshot saved as it), and its
// name is that team's: two teams may each have a template "py". A team's
// template is stored, built and known to the nodes by its key
// (store.TemplateKey: the default team's by its name, another team's as
// "<name>.<teamID>"), which is E2B's template ID; a name a team gives is
// looked up first among its own templates (templateKey), then as a key,
// so the default team's public templates (the built-ins' companions, what
// an operator shares) serve every team that has none of that name.
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

// templateKey is the key ref names for team: the team's own template of
// that name when it has one (a row, or builds of one), else ref as given
// (a key: a name of the default team's, a template every node builds, or
// any team's key). One or two reads for a team other than the default.
func (s *Server) templateKey(ctx context.Context, team, ref string) (string, error) {
	k := store.TemplateKey(team, ref)
	if k == ref || ids.ValidateName("template name", k) != nil {
		return ref, nil
	}
	_, _, exists, err := s.templateOwner(ctx, k)
	switch {
	case err != nil:
		return "", err
	case exists:
		return k, nil
	}
	return ref, nil
}

// templateOf checks the {templateID} of a build route (a template name of
// the caller's team, or a key: E2B's template ID) and that the caller's
// team may read or change it, and returns its key.
func (s *Server) templateOf(w http.ResponseWriter, r *http.Request, write bool) (string, bool) {
	t := r.PathValue("templateID")
	if err := ids.ValidateName("template ID", t); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return "", false
	}
	key, err := s.templateKey(r.Context(), teamOf(r), t)
	if err == nil {
		err = s.templateAccess(r.Context(), teamOf(r), key, write)
	}
	if err != nil {
		s.fail(w, r, err)
		return "", false
	}
	return key, true
}

// claimTemplateName checks a build (or a snapshot saved as a template)
// may make template name for the caller's team and returns its key: a
// name of the team's own is replaced; the key held by another team (a
// default team's name that a template from before per-team names holds)
// is taken (409).
func (s *Server) claimTemplateName(ctx context.Context, team, name string) (string, error) {
	if nodeapi.BuiltinTemplate(name) {
		return "", errdefs.Conflictf("template name %s is built into the nodes: choose another", name)
	}
	if err := store.ValidateTemplateName(team, name); err != nil {
		return "", err
	}
	key := store.TemplateKey(team, name)
	owner, _, exists, err := s.templateOwner(ctx, key)
	if err == nil && exists && owner != team {
		err = errdefs.Conflictf("template name %s is taken (by a template made before names were per team); choose another", name)
	}
	return key, err
}

// shownName is the name template key shows: its name in its owner's
// team (the row's, else its builds').
func (s *Server) shownName(ctx context.Context, key string) string {
	owner, _, exists, err := s.templateOwner(ctx, key)
	if err != nil || !exists {
		return key
	}
	return store.TemplateName(key, owner)
}
