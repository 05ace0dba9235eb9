package api

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
)

// The audit trail (docs/teams.md): every state-changing call a key makes
// (its team, key, route, resource, outcome, time and address) goes to
// Config.Audit after the answer is decided; GET /audit reads the team's
// records.

func (s *Server) auditRoutes() []route {
	return []route{{"GET /audit", s.listAudit, teamAdmin}}
}

// auditNote is where a handler names what a call made (a create's new
// ID), for the call's record.
type auditNote struct {
	resource, detail string
}

type auditCtx struct{}

// noteAudit names the resource a call made, and a detail.
func noteAudit(r *http.Request, resource, detail string) {
	if n, ok := r.Context().Value(auditCtx{}).(*auditNote); ok {
		n.resource, n.detail = resource, detail
	}
}

// changes reports whether a call with method changes state (and is
// recorded).
func changes(method string) bool {
	return method != http.MethodGet && method != http.MethodHead && method != http.MethodOptions
}

// statusWriter keeps the status a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// pathResources are the path values that name what a route acts on, in
// the order a record takes the first present.
var pathResources = []string{"sandboxID", "snapshotID", "templateID", "secretID", "volumeID", "apiKeyID", "teamID", "nodeID", "buildID"}

// audited runs next for a key's call and records it when it changes
// state; team is the team the call acts in.
func (s *Server) audited(w http.ResponseWriter, r *http.Request, k store.APIKey, team string, next func(http.ResponseWriter, *http.Request)) {
	if s.audit == nil || !changes(r.Method) {
		next(w, r)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	note := &auditNote{}
	r = r.WithContext(context.WithValue(r.Context(), auditCtx{}, note))
	next(sw, r)
	rec := store.AuditRecord{TeamID: team, KeyID: k.ID, KeyName: k.Name, Kind: store.AuditAPI,
		Action: r.Method + " " + routeOf(r), Status: sw.status, Remote: remoteOf(r), Resource: note.resource, Detail: note.detail}
	if rec.Status == 0 {
		rec.Status = http.StatusOK
	}
	if rec.Resource == "" {
		for _, p := range pathResources {
			if v := r.PathValue(p); v != "" {
				rec.Resource = v
				break
			}
		}
	}
	s.audit.Record(rec)
}

// routeOf is the route pattern a request matched (its path, when none).
func routeOf(r *http.Request) string {
	if _, p, ok := strings.Cut(r.Pattern, " "); ok {
		return p
	}
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.URL.Path
}

// remoteOf is the caller's address (the connection's; a proxy in front
// is the address seen).
func remoteOf(r *http.Request) string {
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return h
	}
	return r.RemoteAddr
}

// listAudit answers the caller's team's records, newest first: ?resource=,
// ?since= and ?until= (RFC 3339), ?limit= and ?next= (pages), or all of
// them as JSON lines with ?format=jsonl (an export). An operator reads
// the team it acts in, or every team's with ?all=true.
func (s *Server) listAudit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.AuditFilter{TeamID: teamOf(r), Resource: q.Get("resource"), Cursor: q.Get("next")}
	if q.Get("all") == "true" {
		if !isOperator(r) {
			s.fail(w, r, errdefs.Forbiddenf("all=true is an operator's: a team key reads its team's records"))
			return
		}
		f.TeamID = ""
	}
	for _, b := range []struct {
		name string
		to   *time.Time
	}{{"since", &f.Since}, {"until", &f.Until}} {
		if v := q.Get(b.name); v != "" {
			t, err := time.Parse(time.RFC3339Nano, v)
			if err != nil {
				s.fail(w, r, errdefs.Invalidf("%s %q is not an RFC 3339 time", b.name, v))
				return
			}
			*b.to = t
		}
	}
	if f.Resource != "" && ids.Validate("resource", f.Resource) != nil && ids.ValidateName("resource", f.Resource) != nil {
		s.fail(w, r, errdefs.Invalidf("resource %q is malformed", f.Resource))
		return
	}
	limit, err := parseLimit(q, store.MaxAuditPage)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f.Limit = limit
	switch q.Get("format") {
	case "", "json":
	case "jsonl":
		s.exportAudit(w, r, f)
		return
	default:
		s.fail(w, r, errdefs.Invalidf("format %q: json or jsonl", q.Get("format")))
		return
	}
	page, next, err := s.st.ListAudit(r.Context(), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, page)
}

// exportAudit streams every record f selects as JSON lines, page by page.
func (s *Server) exportAudit(w http.ResponseWriter, r *http.Request, f store.AuditFilter) {
	f.Limit = store.MaxAuditPage
	page, next, err := s.st.ListAudit(r.Context(), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	for {
		for _, rec := range page {
			if enc.Encode(rec) != nil {
				return
			}
		}
		if next == "" {
			return
		}
		_ = rc.Flush()
		f.Cursor = next
		if page, next, err = s.st.ListAudit(r.Context(), f); err != nil {
			// The answer has begun: say so in the stream's last line.
			enc.Encode(map[string]string{"error": "the export stopped: " + err.Error()})
			return
		}
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
