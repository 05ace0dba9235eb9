package api

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
)

// E2B routes beside the SDK's main flow: the old keep-alive (refreshes),
// metrics of many sandboxes at once, the v2 template list, and a build's
// logs on their own.

// RefreshRequest is E2B's SandboxRefreshRequest.
type RefreshRequest struct {
	Duration *int `json:"duration"` // seconds
}

// Refresh bounds: E2B's keep-alive is at most an hour; none given keeps
// it alive for defaultRefresh.
const (
	maxRefresh     = 3600
	defaultRefresh = 15 * time.Second
)

// refresh serves POST /sandboxes/{sandboxID}/refreshes: the sandbox is
// kept alive at least duration seconds from now (its end never moves
// earlier).
func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	var body RefreshRequest
	if r.ContentLength != 0 && !decode(w, r, &body) {
		return
	}
	d := defaultRefresh
	if body.Duration != nil {
		if *body.Duration < 0 || *body.Duration > maxRefresh {
			writeError(w, http.StatusBadRequest, "duration: want 0 to "+strconv.Itoa(maxRefresh)+" seconds")
			return
		}
		if *body.Duration > 0 {
			d = time.Duration(*body.Duration) * time.Second
		}
	}
	if err := s.c.KeepAlive(r.Context(), id, d); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// SandboxesWithMetrics is E2B's SandboxesWithMetrics.
type SandboxesWithMetrics struct {
	Sandboxes map[string]control.Metric `json:"sandboxes"`
}

// maxMetricsIDs bounds one GET /sandboxes/metrics.
const maxMetricsIDs = 100

// sandboxesMetrics serves GET /sandboxes/metrics?sandbox_ids=a,b: each
// named running sandbox of the caller's team with its metrics now (read
// at once, not one after another); the others (another team's, gone,
// paused) are left out, as E2B leaves out what is not running.
func (s *Server) sandboxesMetrics(w http.ResponseWriter, r *http.Request) {
	var want []string
	for _, v := range r.URL.Query()["sandbox_ids"] {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" && !slices.Contains(want, id) {
				want = append(want, id)
			}
		}
	}
	if len(want) == 0 || len(want) > maxMetricsIDs {
		writeError(w, http.StatusBadRequest, "sandbox_ids: want 1 to "+strconv.Itoa(maxMetricsIDs)+" sandbox IDs, comma-separated")
		return
	}
	for _, id := range want {
		if err := ids.Validate("sandbox ID", id); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	team := teamOf(r)
	out := SandboxesWithMetrics{Sandboxes: map[string]control.Metric{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, id := range want {
		sb, err := s.st.GetSandbox(r.Context(), id)
		if err != nil || sb.TeamID != team || sb.State != store.StateRunning {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			m, err := s.c.Metrics(r.Context(), id, time.Now().Add(-time.Minute), time.Time{})
			if err != nil || len(m) == 0 {
				return // gone or out of reach meanwhile: left out
			}
			mu.Lock()
			out.Sandboxes[id] = m[len(m)-1]
			mu.Unlock()
		}()
	}
	wg.Wait()
	writeJSON(w, http.StatusOK, out)
}

// maxTemplatePage is E2B's pagination limit for the v2 template list.
const maxTemplatePage = 100

// templatesV2 serves GET /v2/templates: the template list (GET
// /templates) in pages by template ID (limit, nextToken; the next page's
// token in X-Next-Token).
func (s *Server) templatesV2(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := parseLimit(q, maxTemplatePage)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	list, err := s.templateList(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	slices.SortFunc(list, func(a, b TemplateInfo) int { return strings.Compare(a.TemplateID, b.TemplateID) })
	if tok := q.Get("nextToken"); tok != "" {
		i, _ := slices.BinarySearchFunc(list, tok, func(t TemplateInfo, k string) int { return strings.Compare(t.TemplateID, k) })
		list = list[i:]
		for len(list) > 0 && list[0].TemplateID <= tok {
			list = list[1:]
		}
	}
	if len(list) > limit {
		list = list[:limit]
		w.Header().Set("X-Next-Token", list[limit-1].TemplateID)
	}
	writeJSON(w, http.StatusOK, list)
}

// TemplateBuildLogs is E2B's TemplateBuildLogsResponse.
type TemplateBuildLogs struct {
	Logs []BuildLogEntry `json:"logs"`
}

// buildLogs serves GET /templates/{templateID}/builds/{buildID}/logs: the
// build's log entries from cursor (ms) on (forward; before it, newest
// first, backward), at least level, at most limit (default 100, at most
// 1000). source (E2B's temporary or persistent) is accepted: a build's
// logs are kept with it.
func (s *Server) buildLogs(w http.ResponseWriter, r *http.Request) {
	t, ok := s.templateOf(w, r, false)
	if !ok || !s.buildsOrFail(w) {
		return
	}
	q, err := parseLogsQuery(r, true)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if r.URL.Query().Get("limit") == "" {
		q.limit = 100
	}
	switch src := r.URL.Query().Get("source"); src {
	case "", "temporary", "persistent":
	default:
		s.fail(w, r, errdefs.Invalidf("source %q: want temporary or persistent", src))
		return
	}
	_, logs, err := s.builds.Status(r.Context(), t, r.PathValue("buildID"), 0)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if q.backward {
		slices.Reverse(logs)
	}
	min := slices.Index(logLevels, q.level)
	out := TemplateBuildLogs{Logs: []BuildLogEntry{}}
	for _, l := range logs {
		switch {
		case !q.from.IsZero() && !q.backward && l.Time.Before(q.from),
			!q.from.IsZero() && q.backward && !l.Time.Before(q.from),
			slices.Index(logLevels, strings.ToLower(l.Level)) < min,
			q.search != "" && !strings.Contains(l.Message, q.search):
			continue
		}
		out.Logs = append(out.Logs, BuildLogEntry{Timestamp: rfc3339(l.Time), Level: l.Level, Message: l.Message, Step: l.Step})
		if len(out.Logs) == q.limit {
			break
		}
	}
	writeJSON(w, http.StatusOK, out)
}
