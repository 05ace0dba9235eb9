package sdk

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/testenv"
)

// e2bTemplate is what `e2b template list --format json` prints for one
// template (E2B's Template).
type e2bTemplate struct {
	TemplateID    string   `json:"templateID"`
	Names         []string `json:"names"`
	Aliases       []string `json:"aliases"`
	Public        bool     `json:"public"`
	BuildID       string   `json:"buildID"`
	BuildCount    int      `json:"buildCount"`
	BuildStatus   string   `json:"buildStatus"`
	CPUCount      int      `json:"cpuCount"`
	MemoryMB      int      `json:"memoryMB"`
	DiskSizeMB    int      `json:"diskSizeMB"`
	EnvdVersion   string   `json:"envdVersion"`
	CreatedAt     string   `json:"createdAt"`
	UpdatedAt     string   `json:"updatedAt"`
	LastSpawnedAt *string  `json:"lastSpawnedAt"`
	SpawnCount    *int64   `json:"spawnCount"`
}

// e2b runs the stock E2B CLI (@e2b/cli, test/sdk/package.json) against
// the test's server with only the environment a user would set: the API
// key and URL. HOME is empty (no ~/.e2b/config.json, no `e2b auth
// login`); the update check (npm) and colours are off.
func (s *server) e2b(args ...string) (string, int) {
	s.t.Helper()
	cmd := exec.Command("node", append([]string{"node_modules/@e2b/cli/dist/index.js"}, args...)...)
	cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+s.addr, "E2B_API_KEY="+apiKey, "HOME="+s.t.TempDir(),
		"NO_UPDATE_NOTIFIER=1", "NO_COLOR=1", "FORCE_COLOR=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatalf("e2b %v: %v", args, err)
	}
	return out.String(), code
}

func (s *server) e2bOK(args ...string) string {
	s.t.Helper()
	out, code := s.e2b(args...)
	if code != 0 {
		s.t.Fatalf("e2b %v: exit %d:\n%s", args, code, out)
	}
	return out
}

// e2bList is `e2b template list --format json`, by name.
func (s *server) e2bList() map[string]e2bTemplate {
	s.t.Helper()
	out := s.e2bOK("template", "list", "--format", "json")
	var list []e2bTemplate
	if err := json.Unmarshal([]byte(out[strings.IndexByte(out, '['):]), &list); err != nil {
		s.t.Fatalf("template list: %v\n%s", err, out)
	}
	byName := map[string]e2bTemplate{}
	for _, tp := range list {
		for _, n := range tp.Names {
			byName[n] = tp
		}
	}
	return byName
}

// nodeEval runs an ES module snippet with the stock SDK (e2b).
func (s *server) nodeEval(src string) string {
	s.t.Helper()
	cmd := exec.Command("node", "--input-type=module", "-e", src)
	cmd.Env = append(os.Environ(), "E2B_API_URL=http://"+s.addr, "E2B_SANDBOX_URL=http://"+s.addr, "E2B_API_KEY="+apiKey)
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("node -e: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestE2BCLITemplates: the stock E2B CLI (@e2b/cli 2.19.0), unchanged,
// manages templates on Spore: `template create` builds a Dockerfile (FROM
// an image in a local registry, ENV, COPY, RUN) through the SDK's build
// routes; `template list` shows it with E2B's fields; `publish` and
// `unpublish` flip its public flag; `delete` removes it; a failing RUN
// fails the command. Asserts on the CLI's output and exit codes.
func TestE2BCLITemplates(t *testing.T) {
	reg := testenv.NewRegistry(t, "", "")
	ref := reg.Push(t, "apps/busybox:1", testenv.BusyboxImage(t))
	s := newServer(t, "--insecure-registry", registryHost(t, ref))

	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("app.txt", "copied by the cli\n")
	write("Dockerfile", "FROM "+ref+"\n"+
		"ENV GREETING=hello\n"+
		"COPY app.txt /srv/app/app.txt\n"+
		"RUN echo \"$GREETING from RUN as $(id -un)\" > /srv/app/built.txt && cat /srv/app/app.txt >> /srv/app/built.txt\n")

	out := s.e2bOK("template", "create", "cli-app", "--path", dir)
	for _, want := range []string{"Found ./Dockerfile", "[5/7] RUN echo", "Building sandbox template cli-app finished"} {
		if !strings.Contains(out, want) {
			t.Fatalf("template create: no %q in:\n%s", want, out)
		}
	}

	// What the build made: the RUN saw the ENV and the COPY's file.
	got := s.nodeEval(`import { Sandbox } from 'e2b'
const sb = await Sandbox.create('cli-app')
try { console.log(JSON.stringify(await sb.files.read('/srv/app/built.txt'))) } finally { await sb.kill() }`)
	if got != `"hello from RUN as root\ncopied by the cli\n"` {
		t.Fatalf("built.txt in a sandbox of the template: %s", got)
	}

	// The list, as JSON: E2B's Template fields.
	tp, ok := s.e2bList()["cli-app"]
	if !ok {
		t.Fatal("template list: cli-app is not there")
	}
	code, body := s.rest("GET", "/templates/cli-app", "")
	var withBuilds struct {
		Builds []struct{ BuildID, Status string }
	}
	json.Unmarshal(body, &withBuilds)
	if code != 200 || len(withBuilds.Builds) != 1 || withBuilds.Builds[0].Status != "ready" {
		t.Fatalf("GET /templates/cli-app: %d %s", code, body)
	}
	if tp.TemplateID == "" || !slices.Equal(tp.Aliases, []string{"cli-app"}) || tp.Public || tp.BuildID != withBuilds.Builds[0].BuildID ||
		tp.BuildCount != 1 || tp.BuildStatus != "ready" || tp.CPUCount != 2 || tp.MemoryMB != 1024 || tp.DiskSizeMB <= 0 ||
		tp.EnvdVersion == "" || tp.CreatedAt == "" || tp.UpdatedAt == "" || tp.SpawnCount == nil {
		t.Fatalf("template list: cli-app is %+v", tp)
	}
	// The table: access, ID, name, vCPUs, RAM.
	out = s.e2bOK("template", "list")
	row := lineWith(out, tp.TemplateID)
	for _, want := range []string{"Private", "cli-app", tp.EnvdVersion} {
		if !strings.Contains(row, want) {
			t.Fatalf("template list: no %q in the row %q of:\n%s", want, row, out)
		}
	}

	// Publish by name, unpublish by the list's template ID.
	out = s.e2bOK("template", "publish", "cli-app", "--yes")
	if !strings.Contains(out, "Published as: cli-app") {
		t.Fatalf("publish:\n%s", out)
	}
	if !s.e2bList()["cli-app"].Public || !strings.Contains(lineWith(s.e2bOK("template", "list"), tp.TemplateID), "Public") {
		t.Fatal("published, but the list says private")
	}
	if got := s.nodeEval(`const r = await fetch(process.env.E2B_API_URL + '/templates/aliases/cli-app', { headers: { 'X-API-Key': process.env.E2B_API_KEY } })
console.log(r.status, (await r.json()).public)`); got != "200 true" {
		t.Fatalf("alias after publish: %s", got)
	}
	s.e2bOK("template", "unpublish", tp.TemplateID, "--yes")
	if s.e2bList()["cli-app"].Public {
		t.Fatal("unpublished, but the list says public")
	}
	// --project (E2B's team) is accepted and ignored.
	if _, ok := s.e2bList()["cli-app"]; !ok {
		t.Fatal("lost cli-app")
	}
	if out := s.e2bOK("template", "list", "--project", "some-team"); !strings.Contains(out, "cli-app") {
		t.Fatalf("list --project:\n%s", out)
	}

	// A failing RUN fails the command and leaves no template.
	write("Dockerfile.bad", "FROM "+ref+"\nRUN echo about to fail && false\n")
	out, code = s.e2b("template", "create", "cli-bad", "--path", dir, "--dockerfile", "Dockerfile.bad")
	if code != 1 || !strings.Contains(out, "Template build failed") {
		t.Fatalf("failing build: exit %d:\n%s", code, out)
	}
	if _, ok := s.e2bList()["cli-bad"]; ok {
		t.Fatal("a failed build is listed")
	}

	// Delete: gone from the list, Template.exists false; again: an error.
	out = s.e2bOK("template", "delete", "cli-app", "--yes")
	if !strings.Contains(out, "Deleting sandbox template cli-app") {
		t.Fatalf("delete:\n%s", out)
	}
	if _, ok := s.e2bList()["cli-app"]; ok {
		t.Fatal("deleted, still listed")
	}
	if got := s.nodeEval(`import { Template } from 'e2b'
console.log(await Template.exists('cli-app'))`); got != "false" {
		t.Fatalf("Template.exists after delete: %s", got)
	}
	for _, args := range [][]string{{"template", "delete", "cli-app", "--yes"}, {"template", "publish", "cli-app", "--yes"}} {
		if out, code := s.e2b(args...); code != 1 || !strings.Contains(out, "404") {
			t.Fatalf("e2b %v on a deleted template: exit %d:\n%s", args, code, out)
		}
	}
}

// lineWith is the first line of out containing s ("" if none).
func lineWith(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
