package api

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/envd"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// SnapshotInfo is a snapshot as the API lists it.
type SnapshotInfo struct {
	SnapshotID      string   `json:"snapshotID"`
	Names           []string `json:"names"`
	OriginSandboxID string   `json:"originSandboxID,omitempty"`
	CreatedAt       string   `json:"createdAt"`
	SizeBytes       int64    `json:"sizeBytes"`
	Status          string   `json:"status"`
	// Storage: local, uploading or durable (store.Storage*).
	Storage     string `json:"storage"`
	StoredBytes int64  `json:"storedBytes"`
	NodeID      string `json:"nodeID,omitempty"`
}

func snapshotInfo(sn store.Snapshot) SnapshotInfo {
	names := sn.Names
	if names == nil {
		names = []string{}
	}
	storage := sn.Storage
	if storage == "" {
		storage = store.StorageLocal
	}
	return SnapshotInfo{SnapshotID: sn.ID, Names: names, OriginSandboxID: sn.SandboxID, CreatedAt: rfc3339(sn.CreatedAt), SizeBytes: sn.SizeBytes,
		Status: "ready", Storage: storage, StoredBytes: sn.StoredBytes, NodeID: sn.NodeID}
}

// validRef is the path value param when it is a snapshot's ID or name;
// otherwise it answers 400.
func (s *Server) validRef(w http.ResponseWriter, r *http.Request, param string) (string, bool) {
	ref := r.PathValue(param)
	if ids.Validate("snapshot ID", ref) != nil && ids.ValidateName("snapshot name", ref) != nil {
		s.fail(w, r, errdefs.Invalidf("snapshot reference %q is neither an ID nor a name", ref))
		return "", false
	}
	return ref, true
}

// snapshotRef is the snapshot or template the path value param names,
// among the caller's team's, resolved to its ID (teamRef); otherwise it
// answers 400 or 404.
func (s *Server) snapshotRef(w http.ResponseWriter, r *http.Request, param string) (string, bool) {
	ref, ok := s.validRef(w, r, param)
	if !ok {
		return "", false
	}
	id, _, err := s.teamRef(r.Context(), teamOf(r), ref)
	if err != nil {
		s.fail(w, r, err)
		return "", false
	}
	return id, true
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	ref, ok := s.validRef(w, r, "snapshotID")
	if !ok {
		return
	}
	sn, err := s.c.GetSnapshot(r.Context(), teamOf(r), ref)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snapshotInfo(sn))
}

func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	var body struct {
		Name     string `json:"name"`
		Template bool   `json:"template"` // Spore: save as a template (replaces one of the same name)
	}
	if !decode(w, r, &body) {
		return
	}
	name := body.Name
	if body.Template && body.Name != "" {
		// The name is the team's: the template is saved under its key,
		// replacing the team's own template of that name.
		key, err := s.claimTemplateName(r.Context(), teamOf(r), body.Name)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		name = key
	}
	sn, err := s.c.Snapshot(r.Context(), id, name, body.Template)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if body.Template && body.Name != "" {
		sn.Names = []string{body.Name}
	}
	noteAudit(r, id, "snapshot "+sn.ID)
	writeJSON(w, http.StatusCreated, snapshotInfo(sn))
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := parseLimit(q, 1000)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	f := store.SnapshotFilter{SandboxID: q.Get("sandboxID"), Name: q.Get("name"), Limit: limit, Cursor: q.Get("nextToken")}
	if f.SandboxID != "" {
		if err := ids.Validate("sandbox ID", f.SandboxID); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	f.TeamID = teamOf(r)
	page, next, err := s.c.ListSnapshots(r.Context(), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]SnapshotInfo, 0, len(page))
	for _, sn := range page {
		out = append(out, snapshotInfo(sn))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("templateID")
	if ids.Validate("template ID", ref) != nil && ids.ValidateName("template name", ref) != nil {
		writeError(w, http.StatusBadRequest, "template ID "+ref+" is malformed")
		return
	}
	// A template's builds and tags go with it (a template whose builds
	// all failed has only those).
	key, err := s.templateKey(r.Context(), teamOf(r), ref)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	name, nerr := s.templateName(r.Context(), key)
	if nerr == nil {
		// A template's: only its team removes it (one with only builds,
		// none finished, too).
		if err := s.templateAccess(r.Context(), teamOf(r), name, true); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	id, _, err := s.teamRef(r.Context(), teamOf(r), ref)
	if err == nil {
		err = s.c.DeleteSnapshot(r.Context(), id)
	}
	switch {
	case err == nil, errdefs.IsNotFound(err) && nerr == nil:
	default:
		s.fail(w, r, err)
		return
	}
	if nerr == nil {
		if err := s.st.DeleteBuilds(r.Context(), name); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// TemplateInfo is a template as the API lists it: E2B's Template (the
// stock CLI's `e2b template list` reads it) plus sizeBytes.
type TemplateInfo struct {
	TemplateID string `json:"templateID"` // the template's snapshot ID
	// Key is the template's key (docs/teams.md): its name in the default
	// team, "<name>.<teamID>" in another; what the build routes call its
	// template ID.
	Key     string   `json:"key,omitempty"`
	Names   []string `json:"names"`
	Aliases []string `json:"aliases"`
	Public  bool     `json:"public"`
	// BuildID: the template's newest successful build, as E2B's ("" for
	// a template no build made: base, or one saved from a sandbox).
	BuildID    string `json:"buildID"`
	BuildCount int    `json:"buildCount"`
	Status     string `json:"buildStatus"`
	CPUCount   int    `json:"cpuCount"`
	MemoryMB   int    `json:"memoryMB"`
	DiskSizeMB int    `json:"diskSizeMB"`
	// EnvdVersion: the envd every sandbox runs (Spore injects its own).
	EnvdVersion string `json:"envdVersion"`
	CreatedAt   string `json:"createdAt"`
	UpdatedAt   string `json:"updatedAt"`
	// CreatedBy is always null: Spore has no users or teams.
	CreatedBy *struct{} `json:"createdBy"`
	// LastSpawnedAt and SpawnCount: Spore does not count spawns (always
	// null and 0).
	LastSpawnedAt *string `json:"lastSpawnedAt"`
	SpawnCount    int64   `json:"spawnCount"`
	SizeBytes     int64   `json:"sizeBytes"`
}

func (s *Server) templates(w http.ResponseWriter, r *http.Request) {
	out, err := s.templateList(r)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// templateList is the caller's team's templates, the public ones and
// those every node builds (?teamID=, the E2B CLI's --project, is accepted
// and ignored: a key lists for its own team).
func (s *Server) templateList(r *http.Request) ([]TemplateInfo, error) {
	out := []TemplateInfo{}
	list, err := s.c.Templates(r.Context())
	if err != nil {
		return nil, err
	}
	rows, err := s.st.ListTemplates(r.Context())
	if err != nil {
		return nil, err
	}
	byName := map[string]store.Template{}
	for _, tp := range rows {
		byName[tp.Name] = tp
	}
	for _, m := range list {
		names := m.Names
		if names == nil {
			names = []string{}
		}
		ti := TemplateInfo{TemplateID: m.ID, Names: names, Aliases: names, CPUCount: int(m.Limits.VCPUs),
			MemoryMB: int(m.Limits.MemoryMB), DiskSizeMB: int(m.Limits.DiskMB), EnvdVersion: envd.Version,
			CreatedAt: rfc3339(m.CreatedAt), UpdatedAt: rfc3339(m.CreatedAt), SizeBytes: m.SizeBytes, Status: store.BuildReady}
		if len(names) > 0 {
			ti.Key = names[0]
		}
		hidden := false
		for i, name := range names {
			tp, ok := byName[name]
			if !ok {
				continue
			}
			if hidden = !store.TemplateVisible(teamOf(r), tp); hidden {
				break
			}
			ti.Key = name
			shown := slices.Clone(names)
			shown[i] = store.TemplateNameOf(tp) // the key is the node's; the name the team's
			ti.Names, ti.Aliases = shown, shown
			ti.Public = specPublic(tp.Spec)
			ti.CreatedAt, ti.UpdatedAt = rfc3339(tp.CreatedAt), rfc3339(tp.UpdatedAt)
			builds, err := s.st.ListBuilds(r.Context(), name)
			if err != nil {
				return nil, err
			}
			ti.BuildCount = len(builds)
			for _, b := range builds { // newest first
				if b.Status == store.BuildReady {
					ti.BuildID = b.ID
					break
				}
			}
			break
		}
		if !hidden {
			out = append(out, ti)
		}
	}
	return out, nil
}

// ForkChild is one element of a fork's response: a sandbox or an error.
type ForkChild struct {
	Sandbox *SandboxResponse `json:"sandbox,omitempty"`
	Error   *ErrorBody       `json:"error,omitempty"`
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	var body struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if !decode(w, r, &body) {
		return
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	if count < 1 || count > nodeapi.MaxFork {
		s.fail(w, r, errdefs.Invalidf("count %d out of range 1..%d", count, nodeapi.MaxFork))
		return
	}
	timeout, err := timeoutOf(body.Timeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	res, err := s.c.Fork(r.Context(), id, count, timeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]ForkChild, len(res))
	var made []string
	defer func() {
		noteAudit(r, id, fmt.Sprintf("%d of %d children: %s", len(made), count, strings.Join(made, " ")))
	}()
	for i, ch := range res {
		if ch.Err == nil {
			made = append(made, ch.Sandbox.ID)
		}
		if ch.Err != nil {
			code := StatusOf(ch.Err)
			out[i].Error = &ErrorBody{Code: code, Message: s.publicMessage(r, code, ch.Err, "sandbox_id", id, "child", i)}
			continue
		}
		sr := s.sandboxResponse(ch.Sandbox)
		out[i].Sandbox = &sr
	}
	writeJSON(w, http.StatusCreated, out)
}

// RollbackResponse reports a rollback.
type RollbackResponse struct {
	SandboxID       string `json:"sandboxID"`
	SnapshotID      string `json:"snapshotID"`
	Status          string `json:"status"`
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
}

func (s *Server) rollback(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	var body struct {
		SnapshotID string `json:"snapshotID"`
	}
	if !decode(w, r, &body) {
		return
	}
	if body.SnapshotID == "" {
		writeError(w, http.StatusBadRequest, "snapshotID is required")
		return
	}
	if err := allowedTemplate(r, body.SnapshotID); err != nil {
		s.fail(w, r, err)
		return
	}
	sb, err := s.c.Rollback(r.Context(), id, body.SnapshotID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, RollbackResponse{SandboxID: sb.ID, SnapshotID: body.SnapshotID, Status: "rolled_back", EnvdAccessToken: sb.EnvdAccessToken})
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	id, ok := s.sandboxID(w, r)
	if !ok {
		return
	}
	var bounds [2]time.Time
	for i, k := range []string{"start", "end"} {
		v := r.URL.Query().Get(k)
		if v == "" {
			continue
		}
		sec, err := strconv.ParseInt(v, 10, 64)
		if err != nil || sec < 0 {
			s.fail(w, r, errdefs.Invalidf("metrics: %s %q must be a time in Unix seconds", k, v))
			return
		}
		bounds[i] = time.Unix(sec, 0)
	}
	if !bounds[1].IsZero() {
		bounds[1] = bounds[1].Add(time.Second - 1) // the whole second named
	}
	m, err := s.c.Metrics(r.Context(), id, bounds[0], bounds[1])
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}
