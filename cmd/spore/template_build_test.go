package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/build"
)

const fakeKey = "spore_fake_key"

// fakeBuilds serves E2B's template build routes the way Spore's API does,
// from a script: the status answers come from phases (one per poll, the
// last repeated), each giving the build's status and how many log
// entries exist by then; at most page entries are returned per poll.
type fakeBuilds struct {
	t       *testing.T
	srv     *httptest.Server
	present map[string]bool // files hashes the server has

	mu       sync.Mutex
	requests []string // "METHOD path" of every call
	req      api.BuildRequest
	spec     *build.Spec
	uploads  map[string][]byte // hash -> body
	polls    int
	logs     []api.BuildLogEntry
	phases   []fakePhase
	page     int
	reason   *api.BuildReason
}

type fakePhase struct {
	status string
	logs   int // entries visible in this phase
}

func newFakeBuilds(t *testing.T) *fakeBuilds {
	f := &fakeBuilds{t: t, present: map[string]bool{}, uploads: map[string][]byte{}, page: 1000}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v3/templates", func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&f.req)
		name, _, _ := strings.Cut(f.req.Name, ":")
		reply(w, 202, api.BuildRequestResponse{TemplateID: name, BuildID: "b-1", Names: []string{name}, Tags: []string{"default"}})
	})
	mux.HandleFunc("GET /templates/{t}/files/{hash}", func(w http.ResponseWriter, r *http.Request) {
		h := r.PathValue("hash")
		if f.present[h] {
			reply(w, 201, api.FileUpload{Present: true})
			return
		}
		reply(w, 201, api.FileUpload{URL: f.srv.URL + "/upload/" + r.PathValue("t") + "/" + h, Headers: map[string]string{"X-API-Key": r.Header.Get("X-API-KEY")}})
	})
	mux.HandleFunc("PUT /upload/{t}/{hash}", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") != fakeKey {
			reply(w, 401, api.ErrorBody{Code: 401, Message: "no key"})
			return
		}
		if r.ContentLength <= 0 {
			reply(w, 411, api.ErrorBody{Code: 411, Message: "Content-Length required"})
			return
		}
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.uploads[r.PathValue("hash")] = b
		f.mu.Unlock()
		w.WriteHeader(201)
	})
	mux.HandleFunc("POST /v2/templates/{t}/builds/{b}", func(w http.ResponseWriter, r *http.Request) {
		var s build.Spec
		if err := json.NewDecoder(r.Body).Decode(&s); err != nil {
			reply(w, 400, api.ErrorBody{Code: 400, Message: err.Error()})
			return
		}
		f.mu.Lock()
		f.spec = &s
		f.mu.Unlock()
		w.WriteHeader(202)
	})
	mux.HandleFunc("GET /templates/{t}/builds/{b}/status", func(w http.ResponseWriter, r *http.Request) {
		off, err := strconv.Atoi(r.URL.Query().Get("logsOffset"))
		if err != nil {
			reply(w, 400, api.ErrorBody{Code: 400, Message: "logsOffset"})
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		ph := f.phases[min(f.polls, len(f.phases)-1)]
		f.polls++
		visible := f.logs[:ph.logs]
		out := api.BuildInfo{TemplateID: r.PathValue("t"), BuildID: r.PathValue("b"), Status: ph.status, LogEntries: []api.BuildLogEntry{}, Logs: []string{}}
		if off < len(visible) {
			out.LogEntries = visible[off:min(len(visible), off+f.page)]
		}
		if ph.status == "error" {
			out.Reason = f.reason
		}
		reply(w, 200, out)
	})
	mux.HandleFunc("GET /templates", func(w http.ResponseWriter, r *http.Request) {
		reply(w, 200, []api.TemplateInfo{{TemplateID: "s-other", Aliases: []string{"other"}}, {TemplateID: "s-built", Aliases: []string{"app"}}})
	})
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.requests = append(f.requests, r.Method+" "+r.URL.Path)
		f.mu.Unlock()
		if r.Header.Get("X-API-KEY") != fakeKey {
			reply(w, 401, api.ErrorBody{Code: 401, Message: "bad key"})
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	t.Setenv("SPORE_API_URL", f.srv.URL)
	t.Setenv("SPORE_API_KEY", fakeKey)
	return f
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func (f *fakeBuilds) script(logs []string, phases ...fakePhase) {
	for i, m := range logs {
		f.logs = append(f.logs, api.BuildLogEntry{Timestamp: time.Unix(int64(i), 0).UTC().Format(time.RFC3339), Level: "info", Message: m})
	}
	f.phases = phases
}

// spore runs the CLI in-process.
func spore(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	old := pollEvery
	pollEvery = 5 * time.Millisecond
	defer func() { pollEvery = old }()
	root := newRoot()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetArgs(args)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = root.ExecuteContext(ctx)
	return out.String(), errb.String(), err
}

// dockerContext is a build context: a Dockerfile that copies app/.
func dockerContext(t *testing.T, dockerfile string) string {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "app", "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "app", "hello.txt"), []byte("hello from copy\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "app", "sub", "deep.txt"), []byte("deep\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644)
	return dir
}

const testDockerfile = `FROM registry.example/busybox:1
COPY app /srv/app/
RUN echo built > /srv/marker
ENV STAGE=test
WORKDIR /srv/app
USER app
CMD ["sleep", "1000"]
`

func untar(t *testing.T, gz []byte) map[string]string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatalf("the upload is not gzip: %v", err)
	}
	tr := tar.NewReader(zr)
	out := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out[h.Name] = string(b)
	}
}

// A Dockerfile build uploads its COPY files (a gzipped tar, with its
// length and the key the link gave), starts the build with the converted
// spec, prints every log entry in order as the polls bring them, and
// ends with the template's snapshot on stdout.
func TestTemplateBuildDockerfile(t *testing.T) {
	f := newFakeBuilds(t)
	f.page = 2 // a terminal status still has entries to page through
	logs := []string{"FROM registry.example/busybox:1", "[1/8] USER root", "[2/8] WORKDIR /", "[3/8] COPY app /srv/app/",
		"[4/8] RUN echo built > /srv/marker", "ready", "template app is snapshot s-built"}
	f.script(logs, fakePhase{"waiting", 0}, fakePhase{"building", 2}, fakePhase{"building", 2}, fakePhase{"building", 5}, fakePhase{"ready", 7})
	dir := dockerContext(t, testDockerfile)
	out, errs, err := spore(t, "template", "build", "app:v1", "--dockerfile", filepath.Join(dir, "Dockerfile"), "--tag", "stable", "--cpu", "2", "--memory-mb", "512")
	if err != nil {
		t.Fatalf("build: %v\n%s", err, errs)
	}
	if strings.TrimSpace(out) != "s-built" {
		t.Fatalf("stdout %q, want the template's snapshot", out)
	}
	if f.req.Name != "app:v1" || len(f.req.Tags) != 1 || f.req.Tags[0] != "stable" || f.req.CPUCount != 2 || f.req.MemoryMB != 512 {
		t.Fatalf("build request %+v", f.req)
	}
	if f.spec == nil || f.spec.FromImage != "registry.example/busybox:1" || f.spec.StartCmd != "sleep 1000" {
		t.Fatalf("spec %+v", f.spec)
	}
	var copyStep *build.Step
	for i, st := range f.spec.Steps {
		if st.Type == build.StepCopy {
			copyStep = &f.spec.Steps[i]
		}
	}
	if copyStep == nil || !build.ValidHash(copyStep.FilesHash) {
		t.Fatalf("no COPY step with a hash: %+v", f.spec.Steps)
	}
	body, ok := f.uploads[copyStep.FilesHash]
	if !ok || len(f.uploads) != 1 {
		t.Fatalf("uploads %d, none under the COPY step's hash %s", len(f.uploads), copyStep.FilesHash)
	}
	files := untar(t, body)
	if files["app/hello.txt"] != "hello from copy\n" || files["app/sub/deep.txt"] != "deep\n" {
		t.Fatalf("uploaded archive: %v", files)
	}
	// Every entry once, in order, then the built line.
	var printed []string
	for _, l := range strings.Split(errs, "\n") {
		for _, m := range logs {
			if l == m {
				printed = append(printed, l)
			}
		}
	}
	if strings.Join(printed, "|") != strings.Join(logs, "|") {
		t.Fatalf("log lines printed %q, want %q; stderr:\n%s", printed, logs, errs)
	}
	if !strings.Contains(errs, "template app built (build b-1)") {
		t.Fatalf("no built line: %s", errs)
	}
}

// Files the server has already are not uploaded again.
func TestTemplateBuildSkipsPresentFiles(t *testing.T) {
	f := newFakeBuilds(t)
	f.script([]string{"ready"}, fakePhase{"ready", 1})
	dir := dockerContext(t, testDockerfile)
	// The hash the CLI will send, learnt from a first run.
	if _, errs, err := spore(t, "template", "build", "app", "--dockerfile", filepath.Join(dir, "Dockerfile")); err != nil {
		t.Fatal(err, errs)
	}
	for h := range f.uploads {
		f.present[h] = true
	}
	f.uploads = map[string][]byte{}
	f.polls = 0
	_, errs, err := spore(t, "template", "build", "app", "--dockerfile", filepath.Join(dir, "Dockerfile"))
	if err != nil {
		t.Fatal(err, errs)
	}
	if len(f.uploads) != 0 || !strings.Contains(errs, "uploaded already") {
		t.Fatalf("present files uploaded again (%d); stderr %s", len(f.uploads), errs)
	}
}

// A failed build prints its logs, then fails naming the step and reason.
func TestTemplateBuildFailure(t *testing.T) {
	f := newFakeBuilds(t)
	f.script([]string{"[1/1] RUN false", "step 1 (RUN false): the command exited 1"}, fakePhase{"building", 1}, fakePhase{"error", 2})
	f.reason = &api.BuildReason{Message: "step 1 (RUN false): the command exited 1", Step: "1"}
	out, errs, err := spore(t, "template", "build", "bad", "--from-template", "base", "--run", "false")
	if err == nil {
		t.Fatalf("a failed build succeeded: %s %s", out, errs)
	}
	if !strings.Contains(err.Error(), "failed: step 1 (RUN false)") || !strings.Contains(err.Error(), "the command exited 1") {
		t.Fatalf("error %q does not name the step and reason", err)
	}
	if !strings.Contains(errs, "[1/1] RUN false") || out != "" {
		t.Fatalf("stdout %q stderr %q", out, errs)
	}
}

// The flags without a Dockerfile make the steps in their documented
// order, the ready flags make the SDK's own commands, and --no-wait
// returns with the build ID without polling.
func TestTemplateBuildFlags(t *testing.T) {
	f := newFakeBuilds(t)
	f.script(nil, fakePhase{"building", 0})
	pw := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pw, []byte("s3cret\n"), 0o600)
	out, errs, err := spore(t, "template", "build", "web", "--from-image", "reg.example/app:1", "--registry-user", "u", "--registry-password-file", pw,
		"--run", "echo one", "--env", "A=1", "--run", "echo two", "--env", "B=x=y", "--workdir", "/srv", "--user", "app",
		"--start", "serve", "--ready-port", "8000", "--skip-cache", "--no-wait")
	if err != nil {
		t.Fatal(err, errs)
	}
	if strings.TrimSpace(out) != "b-1" || f.polls != 0 {
		t.Fatalf("--no-wait: stdout %q, %d polls", out, f.polls)
	}
	s := f.spec
	if s.FromImage != "reg.example/app:1" || s.FromImageRegistry == nil || s.FromImageRegistry.Username != "u" || s.FromImageRegistry.Password != "s3cret" || !s.Force {
		t.Fatalf("spec %+v", s)
	}
	got, _ := json.Marshal(s.Steps)
	want := `[{"type":"ENV","args":["A","1","B","x=y"]},{"type":"WORKDIR","args":["/srv"]},{"type":"RUN","args":["echo one","root"]},{"type":"RUN","args":["echo two","root"]},{"type":"USER","args":["app"]}]`
	if string(got) != want {
		t.Fatalf("steps\n%s\nwant\n%s", got, want)
	}
	if s.StartCmd != "serve" || s.ReadyCmd != `[ -n "$(ss -Htuln sport = :8000)" ]` {
		t.Fatalf("start %q ready %q", s.StartCmd, s.ReadyCmd)
	}
	// --ready-url: waitForURL's command, quoted as the SDK quotes.
	f.spec = nil
	if _, errs, err := spore(t, "template", "build", "web", "--ready-url", "http://localhost:3000/health?x=1&y", "--no-wait"); err != nil {
		t.Fatal(err, errs)
	}
	if f.spec.FromTemplate != "base" || f.spec.ReadyCmd != `curl -s -o /dev/null -w "%{http_code}" 'http://localhost:3000/health?x=1&y' | grep -q "200"` {
		t.Fatalf("spec %+v", f.spec)
	}
}

// Bad input fails with a clear message before anything reaches the
// server.
func TestTemplateBuildBadInput(t *testing.T) {
	f := newFakeBuilds(t)
	dir := dockerContext(t, "FROM busybox\nCOPY app /srv/\nRUN --network=none true\n")
	df := filepath.Join(dir, "Dockerfile")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--dockerfile", df, "--from-image", "x"}, "--dockerfile and --from-image"},
		{[]string{"--from-image", "x", "--from-template", "y"}, "--from-image and --from-template"},
		{[]string{"--dockerfile", df}, "line 3"},
		{[]string{"--dockerfile", filepath.Join(dir, "nope")}, "no such file"},
		{[]string{"--dockerfile", df, "--context", filepath.Join(dir, "nope")}, "not a directory"},
		{[]string{"--env", "novalue"}, "want KEY=VALUE"},
		{[]string{"--ready", "true", "--ready-port", "80"}, "at most one"},
		{[]string{"--ready-port", "70000"}, "1-65535"},
		{[]string{"--ready-url", "localhost"}, "http://"},
		{[]string{"--registry-user", "u"}, "go with --from-image"},
		{[]string{"--from-image", "x", "--registry-user", "u"}, "give both"},
		{[]string{"--build-arg", "A=1"}, "go with --dockerfile"},
		{[]string{"--run", " "}, "empty command"},
	} {
		_, _, err := spore(t, append([]string{"template", "build", "app"}, c.args...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one containing %q", c.args, err, c.want)
		}
	}
	if _, _, err := spore(t, "template", "build", "../x"); err == nil {
		t.Errorf("a malformed name was accepted")
	}
	if len(f.requests) != 0 {
		t.Fatalf("bad input reached the server: %v", f.requests)
	}
}

// A failure names its step once: the reason's own words when they name
// it, else "at step N" / "at base" / "at finalize".
func TestBuildFailedNamesTheStep(t *testing.T) {
	for _, c := range []struct {
		reason *api.BuildReason
		want   string
	}{
		{&api.BuildReason{Step: "3", Message: "step 3 (RUN x): exited 1"}, "template t build b failed: step 3 (RUN x): exited 1"},
		{&api.BuildReason{Step: "3", Message: "timed out"}, "template t build b failed at step 3: timed out"},
		{&api.BuildReason{Step: "finalize", Message: "not ready"}, "template t build b failed at finalize: not ready"},
		{nil, "template t build b failed: no reason given"},
	} {
		if got := buildFailed("t", api.BuildInfo{BuildID: "b", Status: "error", Reason: c.reason}).Error(); got != c.want {
			t.Errorf("%+v: %q, want %q", c.reason, got, c.want)
		}
	}
}
