package api

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
)

// A sandbox's logs (E2B's GET /sandboxes/{sandboxID}/logs, which the E2B
// CLI's `sandbox logs` reads, and GET /v2/.../logs): what Spore records of
// its life, read from the audit trail, so they outlive the sandbox for the
// audit retention: its lifecycle events (created, paused, resumed,
// hibernated, moved, rolled back, timed out, died, killed; logger
// "lifecycle"), the API calls that changed it (who and with what outcome;
// logger "api") and its egress summary (logger "egress"). The output of
// the processes inside it is not kept here (docs/metrics.md).

// SandboxLog is E2B's SandboxLog: line is a JSON object (level, logger,
// message and the fields), as the E2B CLI prints it.
type SandboxLog struct {
	Timestamp string `json:"timestamp"`
	Line      string `json:"line"`
}

// SandboxLogEntry is E2B's SandboxLogEntry.
type SandboxLogEntry struct {
	Timestamp string            `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// SandboxLogs is E2B's SandboxLogs (v1).
type SandboxLogs struct {
	Logs       []SandboxLog      `json:"logs"`
	LogEntries []SandboxLogEntry `json:"logEntries"`
}

// SandboxLogsV2 is E2B's SandboxLogsV2Response.
type SandboxLogsV2 struct {
	Logs []SandboxLogEntry `json:"logs"`
}

const (
	// maxLogPage is the most entries one logs call answers (E2B's
	// default limit).
	maxLogPage = 1000
	// maxLogScan bounds the audit records one logs call reads.
	maxLogScan = 10 * store.MaxAuditPage
)

// logLevels orders E2B's LogLevel.
var logLevels = []string{"debug", "info", "warn", "error"}

// logEntry is one audit record as a log entry.
func logEntry(rec store.AuditRecord) SandboxLogEntry {
	e := SandboxLogEntry{Timestamp: rfc3339(rec.At), Level: "info", Fields: map[string]string{}}
	switch rec.Kind {
	case store.AuditAPI:
		e.Fields["logger"] = "api"
		e.Message = rec.Action
		if rec.Status != 0 {
			e.Message += " " + strconv.Itoa(rec.Status)
			e.Fields["status"] = strconv.Itoa(rec.Status)
		}
		if rec.KeyName != "" {
			e.Fields["key"] = rec.KeyName
		}
		if rec.Status >= 400 {
			e.Level = "warn"
		}
	case store.AuditEgress:
		e.Fields["logger"] = "egress"
		e.Message = "egress: " + rec.Detail
	default:
		e.Fields["logger"] = "lifecycle"
		e.Fields["event"] = rec.Action
		e.Message = strings.ReplaceAll(strings.TrimPrefix(rec.Action, "sandbox."), "_", " ")
		switch rec.Action {
		case "sandbox.died":
			e.Level = "error"
		case "sandbox.timeout":
			e.Level = "warn"
		}
	}
	if rec.Detail != "" && rec.Kind != store.AuditEgress {
		e.Message += ": " + rec.Detail
	}
	return e
}

// line is an entry as E2B's v1 line: a JSON object the CLI parses.
func (e SandboxLogEntry) line() string {
	m := map[string]string{"level": e.Level, "message": e.Message}
	for k, v := range e.Fields {
		if k != "level" && k != "message" {
			m[k] = v
		}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// logsQuery is what a logs call asks for.
type logsQuery struct {
	from     time.Time // at or after (forward), before (backward); zero: no bound
	limit    int
	backward bool   // newest first
	level    string // at least this level
	search   string // in the message
}

// sandboxLogEntries reads the caller's team's records of sandbox id and
// turns them into entries as q asks. A sandbox of another team, or one
// with no record of the team's (gone, or never its), is ErrNotFound.
func (s *Server) sandboxLogEntries(r *http.Request, q logsQuery) ([]SandboxLogEntry, error) {
	id := r.PathValue("sandboxID")
	if err := ids.Validate("sandbox ID", id); err != nil {
		return nil, err
	}
	team := teamOf(r)
	owned := false // a row says it is the team's now
	sb, err := s.st.GetSandbox(r.Context(), id)
	switch {
	case err == nil && (sb.State == store.StatePooled || sb.TeamID != team):
		return nil, errdefs.NotFoundf("sandbox %s not found", id)
	case err == nil:
		owned = true
	case !errdefs.IsNotFound(err):
		return nil, err
	}
	recs, err := s.sandboxRecords(r.Context(), team, id, q)
	if err != nil {
		return nil, err
	}
	if len(recs) == 0 && !owned {
		return nil, errdefs.NotFoundf("sandbox %s not found", id) // gone with no record of the team's, or never its
	}
	min := slices.Index(logLevels, q.level)
	out := []SandboxLogEntry{}
	for _, rec := range recs {
		e := logEntry(rec)
		if slices.Index(logLevels, e.Level) < min || (q.search != "" && !strings.Contains(e.Message, q.search)) {
			continue
		}
		if out = append(out, e); len(out) == q.limit {
			break
		}
	}
	return out, nil
}

// sandboxRecords reads the team's audit records of sandbox id from q.from
// on, oldest first (newest first when q.backward), up to maxLogScan.
func (s *Server) sandboxRecords(ctx context.Context, team, id string, q logsQuery) ([]store.AuditRecord, error) {
	f := store.AuditFilter{TeamID: team, Resource: id, Limit: store.MaxAuditPage}
	if q.backward {
		f.Until = q.from
	} else {
		f.Since = q.from
	}
	var recs []store.AuditRecord
	for len(recs) < maxLogScan {
		page, next, err := s.st.ListAudit(ctx, f)
		if err != nil {
			return nil, err
		}
		recs = append(recs, page...)
		if next == "" || (q.backward && len(recs) >= q.limit) {
			break
		}
		f.Cursor = next
	}
	if !q.backward {
		slices.Reverse(recs) // the store lists newest first
	}
	return recs, nil
}

// parseLogsQuery reads start (v1) or cursor (v2: ms since the epoch),
// limit, direction, level and search.
func parseLogsQuery(r *http.Request, v2 bool) (logsQuery, error) {
	qv := r.URL.Query()
	q := logsQuery{limit: maxLogPage, level: "debug", search: qv.Get("search")}
	from := qv.Get("start")
	if v2 {
		from = qv.Get("cursor")
	}
	if from != "" {
		ms, err := strconv.ParseInt(from, 10, 64)
		if err != nil || ms < 0 {
			return q, errdefs.Invalidf("start/cursor %q: want milliseconds since the epoch", from)
		}
		q.from = time.UnixMilli(ms)
	}
	if l := qv.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 || n > maxLogPage {
			return q, errdefs.Invalidf("limit %q: want 0 to %d", l, maxLogPage)
		}
		if n > 0 {
			q.limit = n
		}
	}
	switch d := qv.Get("direction"); d {
	case "", "forward":
	case "backward":
		q.backward = true
	default:
		return q, errdefs.Invalidf("direction %q: want forward or backward", d)
	}
	if l := strings.ToLower(qv.Get("level")); l != "" {
		if !slices.Contains(logLevels, l) {
			return q, errdefs.Invalidf("level %q: want one of %s", l, strings.Join(logLevels, ", "))
		}
		q.level = l
	}
	if len(q.search) > 256 {
		return q, errdefs.Invalidf("search: at most 256 characters")
	}
	return q, nil
}

// sandboxLogsV1 serves GET /sandboxes/{sandboxID}/logs.
func (s *Server) sandboxLogsV1(w http.ResponseWriter, r *http.Request) {
	es, ok := s.readSandboxLogs(w, r, false)
	if !ok {
		return
	}
	out := SandboxLogs{Logs: make([]SandboxLog, len(es)), LogEntries: es}
	for i, e := range es {
		out.Logs[i] = SandboxLog{Timestamp: e.Timestamp, Line: e.line()}
	}
	writeJSON(w, http.StatusOK, out)
}

// sandboxLogsV2 serves GET /v2/sandboxes/{sandboxID}/logs.
func (s *Server) sandboxLogsV2(w http.ResponseWriter, r *http.Request) {
	if es, ok := s.readSandboxLogs(w, r, true); ok {
		writeJSON(w, http.StatusOK, SandboxLogsV2{Logs: es})
	}
}

// readSandboxLogs parses a logs call (v2: its cursor) and reads the
// entries it asks for; false: it answered the error.
func (s *Server) readSandboxLogs(w http.ResponseWriter, r *http.Request, v2 bool) ([]SandboxLogEntry, bool) {
	q, err := parseLogsQuery(r, v2)
	if err == nil {
		var es []SandboxLogEntry
		if es, err = s.sandboxLogEntries(r, q); err == nil {
			return es, true
		}
	}
	s.fail(w, r, err)
	return nil, false
}
