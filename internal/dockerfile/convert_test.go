package dockerfile

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spore-run/spore/internal/build"
	"github.com/spore-run/spore/internal/errdefs"
)

// writeTree creates files (path → content; a "->target" content makes a
// symlink, a trailing / in the path a directory) under a new temp dir.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(c, "->"); ok {
			if err := os.Symlink(target, full); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const realistic = `# syntax=docker/dockerfile:1
ARG BASE=python:3.12-slim
FROM ${BASE} AS app
ARG VERSION=1.2 DEBUG
ENV APP_HOME=/srv/app \
    GREETING="hello world"
ENV PATH=$APP_HOME/bin:$PATH
ENV LEGACY some value
WORKDIR $APP_HOME
RUN apt-get update && \
    apt-get install -y curl
RUN ["pip", "install", "--no-cache-dir", "it's"]
RUN <<EOF
set -e
echo built > /built
EOF
COPY --chown=app:app --chmod=755 requirements.txt src/ ./
ADD config.yaml /etc/app/config.yaml
COPY --link scripts/*.sh /usr/local/bin/
USER app
EXPOSE 8080
LABEL org.example=1
ENTRYPOINT ["python", "-m", "app"]
CMD ["--port", "8080"]
`

func TestConvertRealistic(t *testing.T) {
	dir := writeTree(t, map[string]string{
		"requirements.txt": "flask\n",
		"src/app/main.py":  "print(1)\n",
		"src/app/util.py":  "x = 1\n",
		"config.yaml":      "a: 1\n",
		"scripts/a.sh":     "#!/bin/sh\n",
		"scripts/b.sh":     "#!/bin/sh\n",
		"scripts/c.txt":    "no\n",
		"src/secret.env":   "KEY=1\n",
		".dockerignore":    "# comment\n**/*.env\n",
	})
	spec, out, err := Convert(context.Background(), []byte(realistic), Options{ContextDir: dir, BuildArgs: map[string]string{"DEBUG": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	hash := func(src, dest string) string {
		h, err := HashFiles(dir, src, dest)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	want := build.Spec{
		FromImage: "python:3.12-slim",
		Steps: []build.Step{
			{Type: "USER", Args: []string{"root"}},
			{Type: "WORKDIR", Args: []string{"/"}},
			{Type: "ENV", Args: []string{"BASE", "python:3.12-slim"}},
			{Type: "ENV", Args: []string{"VERSION", "1.2", "DEBUG", "1"}},
			{Type: "ENV", Args: []string{"APP_HOME", "/srv/app", "GREETING", "hello world"}},
			{Type: "ENV", Args: []string{"PATH", "/srv/app/bin:${PATH}"}},
			{Type: "ENV", Args: []string{"LEGACY", "some value"}},
			{Type: "WORKDIR", Args: []string{"/srv/app"}},
			{Type: "RUN", Args: []string{"apt-get update &&     apt-get install -y curl"}},
			{Type: "RUN", Args: []string{`pip install --no-cache-dir 'it'\''s'`}},
			{Type: "RUN", Args: []string{"set -e\necho built > /built\n"}},
			{Type: "COPY", Args: []string{"requirements.txt", "./", "app:app", "0755"}, FilesHash: hash("requirements.txt", "./")},
			{Type: "COPY", Args: []string{"src/", "./", "app:app", "0755"}, FilesHash: hash("src/", "./")},
			{Type: "COPY", Args: []string{"config.yaml", "/etc/app/config.yaml", "", ""}, FilesHash: hash("config.yaml", "/etc/app/config.yaml")},
			{Type: "COPY", Args: []string{"scripts/*.sh", "/usr/local/bin/", "", ""}, FilesHash: hash("scripts/*.sh", "/usr/local/bin/")},
			{Type: "USER", Args: []string{"app"}},
		},
		StartCmd: "python -m app --port 8080",
		ReadyCmd: "sleep 20",
	}
	if !reflect.DeepEqual(spec, want) {
		t.Fatalf("spec:\n got %#v\nwant %#v", spec, want)
	}
	wantFiles := [][]string{
		{"requirements.txt"},
		{"src", "src/app", "src/app/main.py", "src/app/util.py"}, // src/secret.env: .dockerignore'd
		{"config.yaml"},
		{"scripts/a.sh", "scripts/b.sh"},
	}
	if len(out.Copies) != len(wantFiles) {
		t.Fatalf("copies: %+v", out.Copies)
	}
	for i, c := range out.Copies {
		if !reflect.DeepEqual(c.Files, wantFiles[i]) || spec.Steps[c.Step].Type != "COPY" || spec.Steps[c.Step].Args[0] != c.Src || c.FilesHash != spec.Steps[c.Step].FilesHash {
			t.Errorf("copy %d: %+v, want files %q", i, c, wantFiles[i])
		}
	}
	wantWarn := []string{"line 21: EXPOSE: ignored", "line 22: LABEL: ignored"}
	if !reflect.DeepEqual(out.Warnings, wantWarn) {
		t.Errorf("warnings %q, want %q", out.Warnings, wantWarn)
	}
}

// Without USER/WORKDIR the SDK ends as "user" in /home/user; a shell-form
// CMD is the start command as written.
func TestConvertDefaults(t *testing.T) {
	spec, out, err := Convert(context.Background(), []byte("FROM ubuntu:22.04\nRUN echo hi\nCMD python3 -m http.server 8000\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := build.Spec{
		FromImage: "ubuntu:22.04",
		Steps: []build.Step{
			{Type: "USER", Args: []string{"root"}},
			{Type: "WORKDIR", Args: []string{"/"}},
			{Type: "RUN", Args: []string{"echo hi"}},
			{Type: "USER", Args: []string{"user"}},
			{Type: "WORKDIR", Args: []string{"/home/user"}},
		},
		StartCmd: "python3 -m http.server 8000",
		ReadyCmd: "sleep 20",
	}
	if !reflect.DeepEqual(spec, want) || len(out.Warnings) != 0 {
		t.Fatalf("got %#v %q", spec, out.Warnings)
	}
}

func TestConvertStartCmdForms(t *testing.T) {
	for _, tc := range []struct{ df, want string }{
		{"CMD [\"node\", \"server.js\"]", "node server.js"},
		{"ENTRYPOINT /entry.sh --flag\nCMD [\"ignored\"]", "/entry.sh --flag"},
		{"ENTRYPOINT [\"/entry.sh\"]\nCMD run it", "/entry.sh /bin/sh -c 'run it'"},
		{"CMD [\"a\"]\nCMD [\"b c\"]", "'b c'"},
		{"RUN true", ""},
	} {
		spec, _, err := Convert(context.Background(), []byte("FROM alpine\n"+tc.df+"\n"), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if spec.StartCmd != tc.want || (tc.want == "") != (spec.ReadyCmd == "") {
			t.Errorf("%q: start %q ready %q, want %q", tc.df, spec.StartCmd, spec.ReadyCmd, tc.want)
		}
	}
}

func TestConvertErrors(t *testing.T) {
	dir := writeTree(t, map[string]string{"a.txt": "a", "x.tar.gz": "\x1f\x8b\x08\x00rest"})
	for _, tc := range []struct{ df, want string }{
		{"FROM alpine\nRUN true\nFROM debian\n", "line 3: FROM: multi-stage"},
		{"FROM scratch\n", "line 1: FROM: FROM scratch is not supported"},
		{"RUN true\n", "line 1: RUN: comes before FROM"},
		{"# nothing\n", "no instructions"},
		{"ARG X=1\n", "no FROM"},
		{"FROM alpine\n\nCOPY --from=build /a /b\n", "line 3: COPY: --from"},
		{"FROM alpine\nADD https://example.com/x /x\n", "line 2: ADD: remote sources"},
		{"FROM alpine\nADD x.tar.gz /opt/\n", "line 2: ADD: x.tar.gz is an archive"},
		{"FROM alpine\nCOPY ../etc/passwd /x\n", "line 2: COPY: source path \"../etc/passwd\" escapes"},
		{"FROM alpine\nCOPY /etc/passwd /x\n", "line 2: COPY: source path \"/etc/passwd\" is absolute"},
		{"FROM alpine\nCOPY missing /x\n", "line 2: COPY: source \"missing\": no files found"},
		{"FROM alpine\nCOPY --chmod=999 a.txt /x\n", "line 2: COPY: --chmod=999 is not an octal mode"},
		{"FROM alpine\nCOPY a.txt b.txt /x\n", "line 2: COPY: with several sources"},
		{"FROM alpine\nCOPY <<EOF /x\nhi\nEOF\n", "line 2: COPY: heredocs are not supported"},
		{"FROM alpine\nRUN --mount=type=secret,id=x cat /run/secrets/x\n", "line 2: RUN: flag --mount=type=secret,id=x not supported"},
		{"FROM alpine\nSHELL [\"/bin/bash\", \"-c\"]\n", "line 2: SHELL: not supported"},
		{"FROM alpine\nRUN <<EOF\n#!/usr/bin/env python3\nprint(1)\nEOF\n", "line 2: RUN: a heredoc with a #! interpreter line"},
	} {
		_, _, err := Convert(context.Background(), []byte(tc.df), Options{ContextDir: dir})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an invalid argument containing %q", tc.df, err, tc.want)
		}
	}
}

func TestConvertHeredocWithCommand(t *testing.T) {
	spec, _, err := Convert(context.Background(), []byte("FROM alpine\nRUN python3 <<PY\nprint(1)\nPY\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := spec.Steps[2].Args[0]; got != "python3 <<PY\nprint(1)\nPY" {
		t.Fatalf("got %q", got)
	}
}

func TestConvertCopyNeedsContext(t *testing.T) {
	_, _, err := Convert(context.Background(), []byte("FROM alpine\nCOPY a /a\n"), Options{})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("got %v", err)
	}
}
