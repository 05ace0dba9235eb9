package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/spore-run/spore/internal/teammetrics"
)

// E2B's team metrics (docs/teams.md, "Team metrics"): a team's live
// sandboxes and start rate over time, from the samples every replica
// takes (internal/teammetrics); another team's ID is a 404 (s.team).

// metricsRange reads start and end (unix seconds, both optional).
func metricsRange(w http.ResponseWriter, r *http.Request) (from, to time.Time, ok bool) {
	var start, end int64
	for name, v := range map[string]*int64{"start": &start, "end": &end} {
		q := r.URL.Query().Get(name)
		if q == "" {
			continue
		}
		n, err := strconv.ParseInt(q, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, name+" must be a unix time in seconds, got "+strconv.Quote(q))
			return from, to, false
		}
		*v = n
	}
	from, to, err := teammetrics.Range(start, end, time.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return from, to, false
	}
	return from, to, true
}

// GET /teams/{teamID}/metrics?start&end: E2B's TeamMetric[].
func (s *Server) teamMetrics(w http.ResponseWriter, r *http.Request) {
	t, ok := s.team(w, r)
	if !ok {
		return
	}
	from, to, ok := metricsRange(w, r)
	if !ok {
		return
	}
	pts, err := teammetrics.Series(r.Context(), s.st, t.ID, from, to)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, pts)
}

// GET /teams/{teamID}/metrics/max?metric&start&end: E2B's MaxTeamMetric.
func (s *Server) teamMetricsMax(w http.ResponseWriter, r *http.Request) {
	t, ok := s.team(w, r)
	if !ok {
		return
	}
	metric := r.URL.Query().Get("metric")
	if metric != teammetrics.MetricConcurrent && metric != teammetrics.MetricStartRate {
		writeError(w, http.StatusBadRequest, "metric must be "+teammetrics.MetricConcurrent+" or "+teammetrics.MetricStartRate+", got "+strconv.Quote(metric))
		return
	}
	from, to, ok := metricsRange(w, r)
	if !ok {
		return
	}
	m, err := teammetrics.MaxOf(r.Context(), s.st, t.ID, metric, from, to)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}
