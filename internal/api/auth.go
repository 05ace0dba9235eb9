package api

import (
	"context"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// TeamHeader names the team an operator key acts in on a team's routes
// (absent: the default team). A team key acts in its own team, always:
// the header is refused from it unless it names that team.
const TeamHeader = "X-Spore-Team"

// Operations a key's scope may list (store.KeyScope.Operations): each
// route of a team's is one of them (opOf).
const (
	OpSandboxesCreate  = "sandboxes.create"
	OpSandboxesRead    = "sandboxes.read"
	OpSandboxesControl = "sandboxes.control" // kill, pause, resume, connect, timeout, network
	OpSnapshotsRead    = "snapshots.read"
	OpSnapshotsWrite   = "snapshots.write" // snapshot, fork, rollback, delete
	OpTemplatesRead    = "templates.read"
	OpTemplatesWrite   = "templates.write" // build, update, delete
	OpSecretsRead      = "secrets.read"
	OpSecretsWrite     = "secrets.write"
	OpVolumesRead      = "volumes.read"
	OpVolumesWrite     = "volumes.write"
	OpTeamRead         = "team.read" // GET /teams and the team's own info
)

// Operations lists every operation a scope may name.
func Operations() []string {
	return []string{OpSandboxesCreate, OpSandboxesRead, OpSandboxesControl, OpSnapshotsRead, OpSnapshotsWrite,
		OpTemplatesRead, OpTemplatesWrite, OpSecretsRead, OpSecretsWrite, OpVolumesRead, OpVolumesWrite, OpTeamRead}
}

// opOf is the operation a route ("METHOD /path") is, by its resource and
// method; "" for the routes no scoped key may call (keys, teams' admin,
// operator routes).
func opOf(pattern string) string {
	method, p, _ := strings.Cut(pattern, " ")
	read := method == http.MethodGet
	rest := strings.TrimPrefix(strings.TrimPrefix(strings.TrimPrefix(p, "/v2"), "/v3"), "/")
	resource, sub, _ := strings.Cut(rest, "/")
	switch resource {
	case "sandboxes":
		switch {
		case read:
			return OpSandboxesRead
		case sub == "" && method == http.MethodPost:
			return OpSandboxesCreate
		case strings.HasSuffix(p, "/snapshots") || strings.HasSuffix(p, "/fork") || strings.HasSuffix(p, "/rollback"):
			return OpSnapshotsWrite
		case strings.HasSuffix(p, "/export"):
			return OpSandboxesRead
		}
		return OpSandboxesControl
	case "snapshots":
		if read {
			return OpSnapshotsRead
		}
		return OpSnapshotsWrite
	case "templates":
		if read {
			return OpTemplatesRead
		}
		return OpTemplatesWrite
	case "secrets":
		if read {
			return OpSecretsRead
		}
		return OpSecretsWrite
	case "volumes":
		if read {
			return OpVolumesRead
		}
		return OpVolumesWrite
	case "teams":
		if read {
			return OpTeamRead
		}
	}
	return ""
}

// Caller is who made a request: its key, and the team it acts in ("" for
// an operator key on an operator route).
type Caller struct {
	Key  store.APIKey
	Team string
}

type callerCtx struct{}

// CallerOf returns the caller of an authenticated request.
func CallerOf(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerCtx{}).(Caller)
	return c, ok
}

// KeyOf returns the API key a request was authenticated with.
func KeyOf(ctx context.Context) (store.APIKey, bool) {
	c, ok := CallerOf(ctx)
	return c.Key, ok
}

// teamOf is the team an authenticated request acts in.
func teamOf(r *http.Request) string {
	c, _ := CallerOf(r.Context())
	return c.Team
}

// auth requires a valid X-API-KEY (or Authorization: Bearer) allowed on a
// route of the given access and operation. Keys are accepted nowhere else
// (no query parameter, no cookie), which is why the proxy strips only
// these two headers. A key the store cannot check answers 503, not 401:
// it may well be valid, and the client should retry rather than give up.
func (s *Server) auth(next http.HandlerFunc, a access, op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-KEY")
		if key == "" {
			key, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		}
		if key == "" {
			writeError(w, http.StatusUnauthorized, "missing API key: send X-API-KEY")
			return
		}
		rec, err := s.keys.Lookup(r.Context(), key)
		switch {
		case errdefs.IsNotFound(err):
			writeError(w, http.StatusUnauthorized, "invalid API key")
			return
		case err != nil:
			s.fail(w, r, err)
			return
		}
		c := Caller{Key: rec, Team: rec.TeamID}
		operator := rec.Role == store.RoleOperator
		// A known key's calls that change state are recorded, refused
		// ones too (the team is the one the call would act in).
		team := rec.TeamID
		if named := r.Header.Get(TeamHeader); operator && a != admin && named != "" {
			team = named
		} else if operator && a != admin {
			team = store.DefaultTeam
		}
		s.audited(w, r, rec, team, func(w http.ResponseWriter, r *http.Request) {
			switch {
			case a == admin && !operator:
				writeError(w, http.StatusForbidden, "this route needs an operator key (this key's role is "+rec.Role+")")
				return
			case a == teamAdmin && !operator && rec.Role != store.RoleAdmin:
				writeError(w, http.StatusForbidden, "this route needs a team admin key (this key's role is "+rec.Role+")")
				return
			case rec.Scope != nil && (op == "" || !slices.Contains(rec.Scope.Operations, op)):
				writeError(w, http.StatusForbidden, fmt.Sprintf("this key's scope does not allow %s (%s)", pattern(r), orNone(op)))
				return
			}
			if a != admin {
				team, ok := s.actingTeam(w, r, rec)
				if !ok {
					return
				}
				c.Team = team
			}
			next(w, r.WithContext(context.WithValue(r.Context(), callerCtx{}, c)))
		})
	}
}

func pattern(r *http.Request) string { return r.Method + " " + r.URL.Path }

func orNone(op string) string {
	if op == "" {
		return "an operation no scope grants"
	}
	return "operation " + op
}

// actingTeam is the team a request acts in: a team key's own; for an
// operator key, the team TeamHeader names (it must exist) or the
// default team.
func (s *Server) actingTeam(w http.ResponseWriter, r *http.Request, k store.APIKey) (string, bool) {
	named := r.Header.Get(TeamHeader)
	if k.Role != store.RoleOperator {
		if named != "" && named != k.TeamID {
			writeError(w, http.StatusForbidden, "this key acts in its own team only: drop the "+TeamHeader+" header")
			return "", false
		}
		return k.TeamID, true
	}
	if named == "" || named == store.DefaultTeam {
		return store.DefaultTeam, true
	}
	t, err := s.st.GetTeam(r.Context(), named)
	if err != nil {
		s.fail(w, r, err)
		return "", false
	}
	return t.ID, true
}

// sandboxID reads and validates the {sandboxID} path parameter and makes
// sure the sandbox is the caller's team's: another team's, like one that
// does not exist, is 404 (nothing is said of it). A sandbox's team never
// changes once it has one, so the answer is kept (owners).
func (s *Server) sandboxID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id := r.PathValue("sandboxID")
	if err := ids.Validate("sandbox ID", id); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return "", false
	}
	team := teamOf(r)
	owner, ok := s.owners.get(id)
	if !ok {
		sb, err := s.st.GetSandbox(r.Context(), id)
		switch {
		case errdefs.IsNotFound(err):
		case err != nil:
			s.fail(w, r, err)
			return "", false
		case sb.State != store.StatePooled && sb.TeamID != "":
			owner = sb.TeamID
			s.owners.put(id, owner)
		}
	}
	if owner != team {
		writeError(w, http.StatusNotFound, fmt.Sprintf("sandbox %s not found", id))
		return "", false
	}
	return id, true
}

// ownerCache keeps sandboxes' teams (a sandbox's team never changes and
// IDs are never reused): a call on a sandbox costs no store read for its
// team but the first. Bounded: emptied when full.
type ownerCache struct {
	mu sync.Mutex
	m  map[string]string
}

const maxOwners = 1 << 16

func (c *ownerCache) get(id string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.m[id]
	return t, ok
}

func (c *ownerCache) put(id, team string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxOwners {
		c.m = make(map[string]string)
	}
	c.m[id] = team
}

// allowedTemplate reports whether the caller's key may create from (or
// roll back to) ref: a key with a scope only from the templates and
// snapshots its patterns match.
func allowedTemplate(r *http.Request, ref string) error {
	c, _ := CallerOf(r.Context())
	if c.Key.Scope == nil {
		return nil
	}
	// Patterns match the name the team gave, or its template's name
	// when ref is the key (E2B's template ID).
	shown := store.TemplateName(ref, c.Team)
	for _, p := range c.Key.Scope.Templates {
		if ok, _ := path.Match(p, ref); ok {
			return nil
		}
		if ok, _ := path.Match(p, shown); ok {
			return nil
		}
	}
	return errdefs.Forbiddenf("this key's scope does not allow template %q (allowed: %s)", ref, strings.Join(c.Key.Scope.Templates, ", "))
}

// orBase is a create's template as it is named: base when none is.
func orBase(t string) string {
	if t == "" {
		return "base"
	}
	return t
}

// teamRef resolves a snapshot or template reference for a team: the
// team's snapshot by ID or name (its ID is returned, template ""), or a
// template the team may use (templateAccess) by name (its key is
// returned, twice) or by snapshot ID (returned as given, with the
// template's key). Another team's snapshot
// or private template is ErrNotFound, as is a name the store does not
// know, except for the default team, whose snapshots from before teams
// the nodes know by name.
func (s *Server) teamRef(ctx context.Context, team, ref string) (id, template string, err error) {
	sn, err := s.c.GetSnapshot(ctx, team, ref)
	switch {
	case err == nil:
		return sn.ID, "", nil
	case !errdefs.IsNotFound(err):
		return "", "", err
	case nodeapi.BuiltinTemplate(ref):
		return ref, ref, nil
	}
	key, err := s.templateKey(ctx, team, ref)
	if err != nil {
		return "", "", err
	}
	name := ""
	if _, err := s.st.GetTemplate(ctx, key); err == nil {
		name, ref = key, key // the team's own template of that name, or a key
	} else if !errdefs.IsNotFound(err) {
		return "", "", err
	} else {
		tpls, err := s.st.ListTemplates(ctx)
		if err != nil {
			return "", "", err
		}
		for _, tp := range tpls {
			if tp.SnapshotID == ref {
				name = tp.Name
			}
		}
	}
	if name != "" {
		if err := s.templateAccess(ctx, team, name, false); err != nil {
			return "", "", err
		}
		return ref, name, nil
	}
	if team == store.DefaultTeam {
		if _, err := s.st.GetSnapshot(ctx, ref); errdefs.IsNotFound(err) {
			return ref, "", nil // a name only the nodes know (before teams)
		}
	}
	return "", "", errdefs.NotFoundf("snapshot or template %s not found", ref)
}
