package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/build"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
)

// E2B's template build API (the stock SDK's Template.build and the E2B
// CLI), served by the build service: see docs/templates.md.

// BuildRequest is E2B's TemplateBuildRequestV3.
type BuildRequest struct {
	Name          string   `json:"name"`
	Alias         string   `json:"alias"` // deprecated name
	Tags          []string `json:"tags"`
	CPUCount      int      `json:"cpuCount"`
	MemoryMB      int      `json:"memoryMB"`
	MinFreeDiskMB int      `json:"minFreeDiskMb"`
	TeamID        string   `json:"teamID"`
}

// BuildRequestResponse is E2B's TemplateRequestResponseV3.
type BuildRequestResponse struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Names      []string `json:"names"`
	Aliases    []string `json:"aliases"`
	Tags       []string `json:"tags"`
	Public     bool     `json:"public"`
}

// FileUpload is E2B's TemplateBuildFileUpload.
type FileUpload struct {
	Present bool              `json:"present"`
	URL     string            `json:"url,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
}

// BuildLogEntry is E2B's BuildLogEntry.
type BuildLogEntry struct {
	Timestamp string `json:"timestamp"`
	Level     string `json:"level"`
	Message   string `json:"message"`
	Step      string `json:"step,omitempty"`
}

// BuildReason is E2B's BuildStatusReason.
type BuildReason struct {
	Message    string          `json:"message"`
	Step       string          `json:"step,omitempty"`
	LogEntries []BuildLogEntry `json:"logEntries"`
}

// BuildInfo is E2B's TemplateBuildInfo.
type BuildInfo struct {
	TemplateID string          `json:"templateID"`
	BuildID    string          `json:"buildID"`
	Status     string          `json:"status"`
	LogEntries []BuildLogEntry `json:"logEntries"`
	Logs       []string        `json:"logs"`
	Reason     *BuildReason    `json:"reason,omitempty"`
}

// TemplateTag is E2B's TemplateTag.
type TemplateTag struct {
	Tag       string `json:"tag"`
	BuildID   string `json:"buildID"`
	CreatedAt string `json:"createdAt"`
}

// TemplateBuild is E2B's TemplateBuild.
type TemplateBuild struct {
	BuildID    string `json:"buildID"`
	Status     string `json:"status"`
	CPUCount   int    `json:"cpuCount"`
	MemoryMB   int    `json:"memoryMB"`
	CreatedAt  string `json:"createdAt"`
	UpdatedAt  string `json:"updatedAt"`
	FinishedAt string `json:"finishedAt,omitempty"`
}

// TemplateWithBuilds is E2B's TemplateWithBuilds.
type TemplateWithBuilds struct {
	TemplateID    string          `json:"templateID"`
	Names         []string        `json:"names"`
	Aliases       []string        `json:"aliases"`
	Public        bool            `json:"public"`
	CreatedAt     string          `json:"createdAt"`
	UpdatedAt     string          `json:"updatedAt"`
	LastSpawnedAt *string         `json:"lastSpawnedAt"`
	SpawnCount    int64           `json:"spawnCount"`
	Builds        []TemplateBuild `json:"builds"`
}

func (s *Server) buildRoutes() []route {
	return []route{
		{"POST /v3/templates", s.requestBuild, user},
		{"GET /templates/{templateID}/files/{hash}", s.fileUploadLink, user},
		{"PUT /templates/{templateID}/files/{hash}", s.uploadFiles, user},
		{"POST /v2/templates/{templateID}/builds/{buildID}", s.startBuild, user},
		{"GET /templates/{templateID}/builds/{buildID}/status", s.buildStatus, user},
		{"GET /templates/{templateID}/builds/{buildID}/logs", s.buildLogs, user},
		{"POST /templates/tags", s.assignTags, user},
		{"DELETE /templates/tags", s.removeTags, user},
		{"GET /templates/{templateID}", s.getTemplate, user},
		{"PATCH /templates/{templateID}", s.templateUpdateV1, user}, // e2bcli.go
		{SignedUploadRoute, s.signedUpload, public},
		{"PATCH /v2/templates/{templateID}", s.templateUpdateV2, user},
	}
}

// buildsOrFail answers 409 when this server runs no builds.
func (s *Server) buildsOrFail(w http.ResponseWriter) bool {
	if s.builds == nil {
		writeError(w, http.StatusConflict, "this server does not build templates")
		return false
	}
	return true
}

func (s *Server) requestBuild(w http.ResponseWriter, r *http.Request) {
	var req BuildRequest
	if !decode(w, r, &req) {
		return
	}
	name := req.Name
	if name == "" {
		name = req.Alias
	}
	if name == "" {
		writeError(w, http.StatusBadRequest, "a template build needs a name")
		return
	}
	if req.CPUCount < 0 || req.CPUCount > 64 || req.MemoryMB < 0 || req.MemoryMB > 1<<20 {
		writeError(w, http.StatusBadRequest, "cpuCount or memoryMB out of range")
		return
	}
	base, tag, tagged := strings.Cut(name, ":")
	key, err := s.claimTemplateName(r.Context(), teamOf(r), base)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !s.buildsOrFail(w) {
		return
	}
	if tagged {
		key += ":" + tag
	}
	b, err := s.builds.Request(r.Context(), teamOf(r), key, req.Tags, req.CPUCount, req.MemoryMB)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	noteAudit(r, b.Template, "build "+b.ID)
	// The template ID is its key (the SDK names it so in the calls that
	// follow); its name, the team's.
	shown := store.TemplateName(b.Template, teamOf(r))
	writeJSON(w, http.StatusAccepted, BuildRequestResponse{TemplateID: b.Template, BuildID: b.ID,
		Names: []string{shown}, Aliases: []string{shown}, Tags: b.Tags})
}

func (s *Server) fileUploadLink(w http.ResponseWriter, r *http.Request) {
	t, ok := s.templateOf(w, r, true)
	if !ok || !s.buildsOrFail(w) {
		return
	}
	hash := r.PathValue("hash")
	present, err := s.builds.FilesPresent(r.Context(), hash)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := FileUpload{Present: present}
	if !present {
		// The SDK PUTs the archive to this URL with these headers: the
		// caller's own key, so the upload is authorized like any call.
		scheme := "http"
		if r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https" {
			scheme = "https"
		}
		out.URL = scheme + "://" + r.Host + "/templates/" + t + "/files/" + hash
		out.Headers = map[string]string{"X-API-Key": apiKeyOf(r)}
		// SDKs that send no headers with the PUT (the one the E2B CLI
		// bundles) need a URL that authorizes itself (e2bcli.go).
		path, err := s.signedUploadPath(r.Context(), t, hash)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if path != "" {
			out.URL = scheme + "://" + r.Host + path
		}
	}
	writeJSON(w, http.StatusCreated, out)
}

func apiKeyOf(r *http.Request) string {
	if k := r.Header.Get("X-API-KEY"); k != "" {
		return k
	}
	k, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return k
}

func (s *Server) uploadFiles(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.templateOf(w, r, true); !ok || !s.buildsOrFail(w) {
		return
	}
	s.putFiles(w, r)
}

// putFiles stores a build's uploaded files (the caller checked it may).
func (s *Server) putFiles(w http.ResponseWriter, r *http.Request) {
	if err := s.builds.PutFiles(r.Context(), r.PathValue("hash"), r.Body, r.ContentLength); err != nil {
		if errors.Is(err, errdefs.ErrResourceLimit) {
			writeError(w, http.StatusRequestEntityTooLarge, err.Error())
			return
		}
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) {
	t, ok := s.templateOf(w, r, true)
	if !ok || !s.buildsOrFail(w) {
		return
	}
	var spec build.Spec
	if !decode(w, r, &spec) {
		return
	}
	if err := s.builds.Start(r.Context(), t, r.PathValue("buildID"), spec); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

func logEntries(logs []store.BuildLog) []BuildLogEntry {
	out := make([]BuildLogEntry, 0, len(logs))
	for _, l := range logs {
		out = append(out, BuildLogEntry{Timestamp: rfc3339(l.Time), Level: l.Level, Message: l.Message, Step: l.Step})
	}
	return out
}

func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request) {
	t, ok := s.templateOf(w, r, false)
	if !ok || !s.buildsOrFail(w) {
		return
	}
	offset := 0
	if q := r.URL.Query().Get("logsOffset"); q != "" {
		n, err := strconv.Atoi(q)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("logsOffset %q is not a non-negative integer", q))
			return
		}
		offset = n
	}
	b, logs, err := s.builds.Status(r.Context(), t, r.PathValue("buildID"), offset)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := BuildInfo{TemplateID: b.Template, BuildID: b.ID, Status: b.Status, LogEntries: logEntries(logs), Logs: []string{}}
	if b.Status == store.BuildError {
		out.Reason = &BuildReason{Message: b.Reason, Step: b.FailedStep, LogEntries: []BuildLogEntry{}}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) assignTags(w http.ResponseWriter, r *http.Request) {
	if !s.buildsOrFail(w) {
		return
	}
	var req struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if !decode(w, r, &req) {
		return
	}
	if base, rest, tagged := strings.Cut(req.Target, ":"); ids.ValidateName("template name", base) == nil {
		key, err := s.templateKey(r.Context(), teamOf(r), base)
		if err == nil {
			err = s.templateAccess(r.Context(), teamOf(r), key, true)
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if req.Target = key; tagged {
			req.Target += ":" + rest
		}
	}
	id, err := s.builds.AssignTags(r.Context(), req.Target, req.Tags)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, struct {
		BuildID string   `json:"buildID"`
		Tags    []string `json:"tags"`
	}{id, req.Tags})
}

func (s *Server) removeTags(w http.ResponseWriter, r *http.Request) {
	if !s.buildsOrFail(w) {
		return
	}
	var req struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if !decode(w, r, &req) {
		return
	}
	if ids.ValidateName("template name", req.Name) == nil {
		key, err := s.templateKey(r.Context(), teamOf(r), req.Name)
		if err == nil {
			err = s.templateAccess(r.Context(), teamOf(r), key, true)
		}
		if err != nil {
			s.fail(w, r, err)
			return
		}
		req.Name = key
	}
	if err := s.builds.RemoveTags(r.Context(), req.Name, req.Tags); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// templateTags serves GET /templates/{templateID}/tags.
func (s *Server) templateTags(w http.ResponseWriter, r *http.Request, t string) {
	if err := ids.ValidateName("template ID", t); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	name, err := s.teamTemplateName(r.Context(), teamOf(r), t)
	if err == nil {
		err = s.templateAccess(r.Context(), teamOf(r), name, false)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if !s.buildsOrFail(w) {
		return
	}
	tags, err := s.st.ListTags(r.Context(), name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []TemplateTag{}
	for _, tg := range tags {
		out = append(out, TemplateTag{Tag: tg.Tag, BuildID: tg.BuildID, CreatedAt: rfc3339(tg.CreatedAt)})
	}
	writeJSON(w, http.StatusOK, out)
}

// teamTemplateName is templateName for a team: ref is first one of its
// own template names (templateKey).
func (s *Server) teamTemplateName(ctx context.Context, team, ref string) (string, error) {
	key, err := s.templateKey(ctx, team, ref)
	if err != nil {
		return "", err
	}
	return s.templateName(ctx, key)
}

// templateName finds the template ref names: a template key (built or
// with builds) or a template's snapshot ID. It returns the key.
func (s *Server) templateName(ctx context.Context, ref string) (string, error) {
	if _, err := s.st.GetTemplate(ctx, ref); err == nil {
		return ref, nil
	} else if !errdefs.IsNotFound(err) {
		return "", err
	}
	if builds, err := s.st.ListBuilds(ctx, ref); err != nil {
		return "", err
	} else if len(builds) > 0 {
		return ref, nil
	}
	list, err := s.c.Templates(ctx)
	if err != nil {
		return "", err
	}
	for _, m := range list {
		if m.ID == ref && len(m.Names) > 0 {
			return m.Names[0], nil
		}
		if slices.Contains(m.Names, ref) {
			return ref, nil // a template every node builds (base): no row
		}
	}
	return "", errdefs.NotFoundf("template %s", ref)
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t := r.PathValue("templateID")
	if err := ids.ValidateName("template ID", t); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	name, err := s.teamTemplateName(r.Context(), teamOf(r), t)
	if err == nil {
		err = s.templateAccess(r.Context(), teamOf(r), name, false)
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	builds, err := s.st.ListBuilds(r.Context(), name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	shown := s.shownName(r.Context(), name)
	out := TemplateWithBuilds{TemplateID: name, Names: []string{shown}, Aliases: []string{shown}, Builds: []TemplateBuild{}}
	created, updated := time.Time{}, time.Time{}
	if tp, err := s.st.GetTemplate(r.Context(), name); err == nil {
		created, updated = tp.CreatedAt, tp.UpdatedAt
		out.Public = specPublic(tp.Spec)
	}
	for _, b := range builds {
		tb := TemplateBuild{BuildID: b.ID, Status: b.Status, CPUCount: b.CPUCount, MemoryMB: b.MemoryMB,
			CreatedAt: rfc3339(b.CreatedAt), UpdatedAt: rfc3339(b.UpdatedAt)}
		if !b.FinishedAt.IsZero() {
			tb.FinishedAt = rfc3339(b.FinishedAt)
		}
		out.Builds = append(out.Builds, tb)
		if created.IsZero() || b.CreatedAt.Before(created) {
			created = b.CreatedAt
		}
		if b.UpdatedAt.After(updated) {
			updated = b.UpdatedAt
		}
	}
	out.CreatedAt, out.UpdatedAt = rfc3339(created), rfc3339(updated)
	writeJSON(w, http.StatusOK, out)
}

// resolveTagged turns a create's "name:tag" (the name the team's own
// template's first, templateKey) into the snapshot of that tag's build;
// other template IDs are left as they are.
func (s *Server) resolveTagged(ctx context.Context, team, templateID string) (string, error) {
	if !strings.Contains(templateID, ":") {
		return templateID, nil
	}
	name, tag, err := build.SplitName(templateID)
	if err != nil {
		return "", err
	}
	if s.builds == nil {
		return "", errdefs.NotFoundf("template %s", templateID)
	}
	key, err := s.templateKey(ctx, team, name)
	if err != nil {
		return "", err
	}
	snap, err := s.builds.ResolveTag(ctx, key, tag)
	if err != nil {
		return "", err
	}
	return snap, nil
}
