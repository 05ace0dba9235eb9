package api

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
)

// E2B's API routes Spore does not serve yet (the stock SDK e2b@2.51.0's
// paths; test/sdk TestEveryE2BRouteIsAnswered keeps this list complete).
// They answer 501 with a JSON error instead of the 404 of an unknown
// route: the SDK reads a 404 as "no such thing", so `Secret.exists` or
// `Template.getTags` would answer false or empty for a feature that is
// not there. With 501 the SDK raises an error naming the route.
var e2bUnimplemented = []string{}

// E2BUnimplemented lists the E2B routes that answer 501 (for tests).
func E2BUnimplemented() []string { return append([]string(nil), e2bUnimplemented...) }

// scopedNotImplemented answers 501 for a route of the caller's own
// sandbox or team, and 404 for another's: the 501 says nothing of what
// another team has.
func (s *Server) scopedNotImplemented(pattern string) http.HandlerFunc {
	h := notImplemented(pattern)
	return func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.Contains(pattern, "{sandboxID}"):
			if _, ok := s.sandboxID(w, r); !ok {
				return
			}
		case strings.Contains(pattern, "{teamID}"):
			if _, ok := s.team(w, r); !ok {
				return
			}
		case strings.Contains(pattern, "{templateID}"):
			if _, ok := s.templateOf(w, r, false); !ok {
				return
			}
		}
		h(w, r)
	}
}

func notImplemented(pattern string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("Spore does not implement E2B's %s yet", pattern))
	}
}

// AliasResponse is GET /templates/aliases/{alias}: E2B's
// TemplateAliasResponse.
type AliasResponse struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

// templateTagsRoute is served by templateSub.
const templateTagsRoute = "GET /templates/{templateID}/tags"

// templateSub serves GET /templates/aliases/{alias} and E2B's GET
// /templates/{templateID}/tags.
func (s *Server) templateSub(w http.ResponseWriter, r *http.Request) {
	switch first, sub := r.PathValue("templateID"), r.PathValue("sub"); {
	case first == "aliases":
		s.templateAlias(w, r, sub)
	case sub == "tags":
		s.templateTags(w, r, first)
	default:
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route %s %s", r.Method, r.URL.Path))
	}
}

// templateAlias answers whether a template has this name or ID (the stock
// SDK's Template.exists and aliasExists: 200 yes, 404 no).
func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request, alias string) {
	if ids.ValidateName("template alias", alias) != nil {
		s.fail(w, r, errdefs.Invalidf("template alias %q is malformed", alias))
		return
	}
	key, err := s.templateKey(r.Context(), teamOf(r), alias)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	list, err := s.c.Templates(r.Context())
	if err != nil {
		s.fail(w, r, err)
		return
	}
	for _, m := range list {
		if m.ID == alias || slices.Contains(m.Names, key) {
			if len(m.Names) > 0 {
				if err := s.templateAccess(r.Context(), teamOf(r), m.Names[0], false); err != nil {
					s.fail(w, r, err)
					return
				}
			}
			public := false
			if len(m.Names) > 0 {
				if public, err = s.templatePublic(r.Context(), m.Names[0]); err != nil {
					s.fail(w, r, err)
					return
				}
			}
			writeJSON(w, http.StatusOK, AliasResponse{TemplateID: m.ID, Public: public})
			return
		}
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("template %s not found", alias))
}

var domainRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*(:[0-9]{1,5})?$`)

// ValidateDomain checks a sandbox domain (`--domain`): a lower-case DNS
// name, optionally with a port; empty is none.
func ValidateDomain(d string) error {
	if d != "" && (len(d) > 253 || !domainRE.MatchString(d)) {
		return errdefs.Invalidf("--domain %q: want a lower-case DNS name such as sandboxes.example.com (optionally :port)", d)
	}
	return nil
}
