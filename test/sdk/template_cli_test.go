package sdk

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/build"
	"github.com/spore-run/spore/internal/testenv"
)

// cliDockerfile builds on the test registry's busybox image. The image
// has no bash, which `spore exec` runs commands with: a shim is copied in
// (a COPY with a mode, like any other).
const cliDockerfile = `FROM {{IMAGE}}
COPY --chmod=755 bin/bash /bin/bash
COPY app /srv/app/
RUN echo "built as $(id -un) in $(pwd)" > /srv/work/built.txt
ENV STAGE=test
WORKDIR /srv/app
USER app
CMD echo "$STAGE" > /tmp/started; exec sleep 100000
`

var stepLine = regexp.MustCompile(`(?m)^(CACHED )?\[\d+/\d+\] `)

// TestTemplateCLI: `spore template build --dockerfile` against a real
// server and registry: COPY, RUN, ENV, WORKDIR, USER and CMD reach the
// sandboxes started from the template; a rebuild (started with --no-wait,
// followed with `template logs --follow`) runs nothing but cached steps;
// tags; a failing RUN exits non-zero naming its step; bad input.
func TestTemplateCLI(t *testing.T) {
	reg := testenv.NewRegistry(t, "", "")
	image := reg.Push(t, "busybox:1", testenv.BusyboxImage(t))
	s := newServer(t, "--insecure-registry", reg.Host)

	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "bin"), 0o755)
	os.MkdirAll(filepath.Join(dir, "app", "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "bin", "bash"), []byte("#!/bin/sh\nexec /bin/sh \"$@\"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "app", "hello.txt"), []byte("hello from copy\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "app", "sub", "deep.txt"), []byte("deep\n"), 0o644)
	df := filepath.Join(dir, "Dockerfile")
	os.WriteFile(df, []byte(strings.ReplaceAll(cliDockerfile, "{{IMAGE}}", image)), 0o644)
	buildArgs := []string{"template", "build", "cli-app", "--dockerfile", df, "--ready", "test -f /tmp/started"}

	out, errs, code := s.cli("", buildArgs...)
	if code != 0 {
		t.Fatalf("build: exit %d\n%s%s", code, out, errs)
	}
	if !strings.Contains(errs, "template cli-app built (build ") || !strings.Contains(errs, "files of COPY app: uploaded") {
		t.Fatalf("build output:\n%s", errs)
	}
	for _, l := range stepLine.FindAllString(errs, -1) {
		if strings.HasPrefix(l, "CACHED") {
			t.Fatalf("a first build used the cache:\n%s", errs)
		}
	}
	snap := strings.TrimSpace(out)
	if ls := s.ok("template", "ls"); !strings.Contains(ls, snap) || !strings.Contains(ls, "cli-app") {
		t.Fatalf("template ls lacks %s / cli-app:\n%s", snap, ls)
	}

	id := s.ok("start", "cli-app")
	for _, c := range []struct{ cmd, want string }{
		{"cat /srv/app/hello.txt /srv/app/sub/deep.txt", "hello from copy\ndeep"},
		{"cat /srv/work/built.txt", "built as root in /"},
		{`echo "$STAGE|$GREETING"`, "test|hello from the image"},
		{"pwd; id -un", "/srv/app\napp"},
		{"cat /tmp/started", "test"},
	} {
		if got := s.ok("exec", id, "--", c.cmd); got != c.want {
			t.Errorf("in a sandbox of the template, %s: %q, want %q", c.cmd, got, c.want)
		}
	}
	s.ok("kill", id)

	// A rebuild: started with --no-wait, followed through its logs.
	buildID := s.ok(append(buildArgs, "--no-wait", "--tag", "v2")...)
	out, errs, code = s.cli("", "template", "logs", "cli-app", buildID, "--follow")
	if code != 0 {
		t.Fatalf("logs --follow of the rebuild: exit %d\n%s%s", code, out, errs)
	}
	steps := stepLine.FindAllString(out, -1)
	if len(steps) == 0 || !strings.Contains(out, "CACHED start and ready") {
		t.Fatalf("the rebuild's log has no cached steps:\n%s", out)
	}
	for _, l := range steps {
		if !strings.HasPrefix(l, "CACHED") {
			t.Fatalf("the rebuild ran a step (%q):\n%s", l, out)
		}
	}
	if got := s.ok("template", "logs", "cli-app", buildID); got != strings.TrimSpace(out) {
		t.Fatalf("template logs (no --follow) differs from what --follow printed:\n%s\n---\n%s", got, out)
	}

	// show and tags.
	var tpl struct {
		Builds []struct{ BuildID, Status string }
	}
	if err := json.Unmarshal([]byte(s.ok("template", "show", "cli-app", "--json")), &tpl); err != nil || len(tpl.Builds) != 2 {
		t.Fatalf("template show --json: %+v %v", tpl, err)
	}
	for _, b := range tpl.Builds {
		if b.Status != "ready" {
			t.Fatalf("builds: %+v", tpl.Builds)
		}
	}
	if show := s.ok("template", "show", "cli-app"); !strings.Contains(show, buildID) || !strings.Contains(show, "BUILD") {
		t.Fatalf("template show:\n%s", show)
	}
	tagsOf := func() map[string]string {
		var tags []struct{ Tag, BuildID string }
		json.Unmarshal([]byte(s.ok("template", "tags", "cli-app", "--json")), &tags)
		m := map[string]string{}
		for _, tg := range tags {
			m[tg.Tag] = tg.BuildID
		}
		return m
	}
	if tags := tagsOf(); tags["v2"] != buildID || tags[build.DefaultTag] == "" {
		t.Fatalf("tags after the rebuild: %v (rebuild %s)", tags, buildID)
	}
	s.ok("template", "tag", "cli-app:v2", "stable")
	if tags := tagsOf(); tags["stable"] != buildID {
		t.Fatalf("tag cli-app:v2 stable: %v", tags)
	}
	s.ok("template", "untag", "cli-app", "stable", "v2")
	if tags := tagsOf(); tags["stable"] != "" || tags["v2"] != "" || tags[build.DefaultTag] == "" {
		t.Fatalf("after untag: %v", tags)
	}

	// Without a Dockerfile: flags on the base template, a start command
	// and E2B's waitForURL ready check.
	s.ok("template", "build", "cli-web", "--run", "mkdir -p /srv/www && echo hi > /srv/www/index.html", "--env", "MODE=web",
		"--workdir", "/srv/www", "--user", "user", "--start", "python3 -m http.server 8000 -d /srv/www", "--ready-url", "http://localhost:8000/index.html")
	web := s.ok("start", "cli-web")
	if got := s.ok("exec", web, "--", `curl -s localhost:8000/index.html; echo "$MODE"; pwd; id -un`); got != "hi\nweb\n/srv/www\nuser" {
		t.Errorf("a sandbox of the flag-built template: %q", got)
	}
	s.ok("kill", web)
	s.ok("template", "rm", "cli-web")

	// A failing RUN: non-zero, naming the step and the command.
	bad := filepath.Join(dir, "Dockerfile.bad")
	os.WriteFile(bad, []byte("FROM "+image+"\nUSER app\nRUN echo before\nRUN echo failing >&2; false\n"), 0o644)
	out, errs, code = s.cli("", "template", "build", "cli-bad", "--dockerfile", bad)
	if code == 0 || !strings.Contains(errs, "spore: template cli-bad build ") ||
		!regexp.MustCompile(`failed(: | at step \d+: )step \d+ \(RUN echo failing >&2; false\): .*the command exited 1`).MatchString(errs) ||
		!strings.Contains(errs, "failing") {
		t.Fatalf("failing RUN: exit %d, stdout %q, stderr:\n%s", code, out, errs)
	}

	// Bad input: a message and a non-zero exit.
	badDf := filepath.Join(dir, "Dockerfile.syntax")
	os.WriteFile(badDf, []byte("FROM "+image+"\nRUN true\nCOPY missing.txt /x\n"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"template", "build", "x", "--dockerfile", badDf}, "line 3"},
		{[]string{"template", "build", "x", "--dockerfile", df, "--from-image", image}, "--dockerfile and --from-image"},
		{[]string{"template", "build", "x", "--from-template", "no-such-template"}, "no-such-template"},
		{[]string{"template", "show", "no-such-template"}, "not found"},
		{[]string{"template", "tags", "no-such-template"}, "not found"},
		{[]string{"template", "tag", "cli-app:no-such-tag", "x"}, "not found"},
		{[]string{"template", "untag", "cli-app", "no-such-tag"}, "not found"},
		{[]string{"template", "logs", "cli-app", "no-such-build"}, "not found"},
	} {
		_, errs, code := s.cli("", c.args...)
		if code == 0 || !strings.Contains(errs, "spore: ") || !strings.Contains(errs, c.want) {
			t.Errorf("spore %v: exit %d, stderr %q; want a message with %q and a non-zero exit", c.args, code, errs, c.want)
		}
	}
	s.ok("template", "rm", "cli-app")
}
