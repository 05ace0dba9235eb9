package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/api"
	"github.com/spore-run/spore/internal/build"
	"github.com/spore-run/spore/internal/client"
	"github.com/spore-run/spore/internal/dockerfile"
)

// buildOpts are `spore template build`'s flags.
type buildOpts struct {
	dockerfile, contextDir string
	buildArgs              []string

	fromImage, registryUser, registryPasswordFile string
	fromTemplate                                  string

	run, env    []string
	workdir     string
	user        string
	start       string
	ready       string
	readyPort   int
	readyURL    string
	tags        []string
	skipCache   bool
	cpu, memory int
	noWait      bool
}

// readyCmd is the ready command --ready, --ready-port or --ready-url asks
// for ("" none); the latter two are the stock SDK's own waitForPort and
// waitForURL commands.
func (o *buildOpts) readyCmd() (string, error) {
	set := 0
	for _, b := range []bool{o.ready != "", o.readyPort != 0, o.readyURL != ""} {
		if b {
			set++
		}
	}
	if set > 1 {
		return "", errors.New("--ready, --ready-port and --ready-url: give at most one")
	}
	switch {
	case o.readyPort != 0:
		if o.readyPort < 1 || o.readyPort > 65535 {
			return "", fmt.Errorf("--ready-port %d: want a port 1-65535", o.readyPort)
		}
		return fmt.Sprintf(`[ -n "$(ss -Htuln sport = :%d)" ]`, o.readyPort), nil
	case o.readyURL != "":
		if !strings.HasPrefix(o.readyURL, "http://") && !strings.HasPrefix(o.readyURL, "https://") {
			return "", fmt.Errorf("--ready-url %q: want an http:// or https:// URL", o.readyURL)
		}
		return `curl -s -o /dev/null -w "%{http_code}" ` + e2bShellQuote(o.readyURL) + ` | grep -q "200"`, nil
	}
	return o.ready, nil
}

var unsafeShellChar = regexp.MustCompile(`[^\w@%+=:,./-]`)

// e2bShellQuote is the stock SDK's shellQuote, so --ready-url makes the
// very command waitForURL makes.
func e2bShellQuote(s string) string {
	if s == "" {
		return "''"
	}
	if !unsafeShellChar.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
}

// upload is one COPY step's files: uploaded under hash as a gzipped tar
// of src in the context dir.
type upload struct {
	ctxDir, src, hash string
}

// spec turns the flags into a build spec and the files its COPY steps
// need. Warnings (Dockerfile instructions ignored) go to warn.
func (o *buildOpts) spec(ctx context.Context, warn io.Writer) (build.Spec, []upload, error) {
	ready, err := o.readyCmd()
	if err != nil {
		return build.Spec{}, nil, err
	}
	if o.registryUser != "" || o.registryPasswordFile != "" {
		if o.fromImage == "" {
			return build.Spec{}, nil, errors.New("--registry-user and --registry-password-file go with --from-image")
		}
	}
	if o.dockerfile != "" {
		return o.dockerfileSpec(ctx, ready, warn)
	}
	if o.contextDir != "" || len(o.buildArgs) > 0 {
		return build.Spec{}, nil, errors.New("--context and --build-arg go with --dockerfile")
	}
	var spec build.Spec
	switch {
	case o.fromImage != "" && o.fromTemplate != "":
		return build.Spec{}, nil, errors.New("--from-image and --from-template (--from): give one")
	case o.fromImage != "":
		spec.FromImage = o.fromImage
		reg, err := o.registry()
		if err != nil {
			return build.Spec{}, nil, err
		}
		spec.FromImageRegistry = reg
	case o.fromTemplate != "":
		spec.FromTemplate = o.fromTemplate
	default:
		spec.FromTemplate = "base"
	}
	// Flags lose their relative order, so the steps come in a fixed one:
	// env, workdir, the commands (as root, to install things, as the
	// previous `template build` ran them), then the sandboxes' user.
	if len(o.env) > 0 {
		var args []string
		for _, kv := range o.env {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return build.Spec{}, nil, fmt.Errorf("--env %q: want KEY=VALUE", kv)
			}
			args = append(args, k, v)
		}
		spec.Steps = append(spec.Steps, build.Step{Type: build.StepEnv, Args: args})
	}
	if o.workdir != "" {
		spec.Steps = append(spec.Steps, build.Step{Type: build.StepWorkdir, Args: []string{o.workdir}})
	}
	for _, r := range o.run {
		if strings.TrimSpace(r) == "" {
			return build.Spec{}, nil, errors.New("--run: an empty command")
		}
		spec.Steps = append(spec.Steps, build.Step{Type: build.StepRun, Args: []string{r, "root"}})
	}
	if o.user != "" {
		spec.Steps = append(spec.Steps, build.Step{Type: build.StepUser, Args: []string{o.user}})
	}
	spec.StartCmd, spec.ReadyCmd, spec.Force = o.start, ready, o.skipCache
	if spec.Steps == nil {
		spec.Steps = []build.Step{}
	}
	return spec, nil, spec.Validate()
}

func (o *buildOpts) registry() (*build.Registry, error) {
	if o.registryUser == "" && o.registryPasswordFile == "" {
		return nil, nil
	}
	if o.registryUser == "" || o.registryPasswordFile == "" {
		return nil, errors.New("--registry-user and --registry-password-file: give both")
	}
	b, err := os.ReadFile(o.registryPasswordFile)
	if err != nil {
		return nil, fmt.Errorf("--registry-password-file: %w", err)
	}
	return &build.Registry{Type: "registry", Username: o.registryUser, Password: strings.TrimRight(string(b), "\r\n")}, nil
}

func (o *buildOpts) dockerfileSpec(ctx context.Context, ready string, warn io.Writer) (build.Spec, []upload, error) {
	for _, c := range []struct {
		set  bool
		name string
	}{
		{o.fromImage != "", "--from-image"}, {o.fromTemplate != "", "--from-template (--from)"},
		{len(o.run) > 0, "--run"}, {len(o.env) > 0, "--env"}, {o.workdir != "", "--workdir"}, {o.user != "", "--user"},
	} {
		if c.set {
			return build.Spec{}, nil, fmt.Errorf("--dockerfile and %s: the Dockerfile says what to build (FROM, RUN, ENV, WORKDIR, USER)", c.name)
		}
	}
	src, err := os.ReadFile(o.dockerfile)
	if err != nil {
		return build.Spec{}, nil, fmt.Errorf("--dockerfile: %w", err)
	}
	ctxDir := o.contextDir
	if ctxDir == "" {
		ctxDir = filepath.Dir(o.dockerfile)
	}
	if fi, err := os.Stat(ctxDir); err != nil || !fi.IsDir() {
		return build.Spec{}, nil, fmt.Errorf("--context %s: not a directory", ctxDir)
	}
	args, err := parseKV("--build-arg", o.buildArgs)
	if err != nil {
		return build.Spec{}, nil, err
	}
	spec, dc, err := dockerfile.Convert(ctx, src, dockerfile.Options{ContextDir: ctxDir, BuildArgs: args, ReadyCmd: ready})
	if err != nil {
		return build.Spec{}, nil, fmt.Errorf("%s: %w", o.dockerfile, err)
	}
	for _, w := range dc.Warnings {
		fmt.Fprintf(warn, "%s: %s\n", o.dockerfile, w)
	}
	if o.start != "" {
		spec.StartCmd = o.start
	}
	if ready != "" {
		spec.ReadyCmd = ready
	}
	spec.Force = o.skipCache
	var ups []upload
	for _, cp := range dc.Copies {
		ups = append(ups, upload{ctxDir: ctxDir, src: cp.Src, hash: cp.FilesHash})
	}
	return spec, ups, spec.Validate()
}

// uploadFiles uploads the COPY steps' files the server does not have
// yet, each once.
func uploadFiles(ctx context.Context, c *client.Client, template string, ups []upload, log io.Writer) error {
	seen := map[string]bool{}
	for _, u := range ups {
		if seen[u.hash] {
			continue
		}
		seen[u.hash] = true
		link, err := c.FileUploadLink(ctx, template, u.hash)
		if err != nil {
			return fmt.Errorf("files of COPY %s: %w", u.src, err)
		}
		if link.Present {
			fmt.Fprintf(log, "files of COPY %s: uploaded already\n", u.src)
			continue
		}
		n, err := uploadOne(ctx, c, link, u)
		if err != nil {
			return fmt.Errorf("upload the files of COPY %s: %w", u.src, err)
		}
		fmt.Fprintf(log, "files of COPY %s: uploaded (%d bytes)\n", u.src, n)
	}
	return nil
}

// uploadOne archives u into a temporary file (the upload needs its
// length up front) and PUTs it.
func uploadOne(ctx context.Context, c *client.Client, link api.FileUpload, u upload) (int64, error) {
	f, err := os.CreateTemp("", "spore-copy-*.tar.gz")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := dockerfile.TarFiles(f, u.ctxDir, u.src, true); err != nil {
		return 0, err
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return 0, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	return size, c.UploadFiles(ctx, link, f, size)
}

// pollEvery is how often a build's status is polled while it runs.
var pollEvery = 300 * time.Millisecond

// followBuild prints the build's log entries from offset on as they come
// and returns its final status (ready or error) once every entry is
// printed.
func followBuild(ctx context.Context, c *client.Client, template, buildID string, offset int, out io.Writer) (api.BuildInfo, error) {
	for {
		info, err := c.BuildStatus(ctx, template, buildID, offset)
		if err != nil {
			return api.BuildInfo{}, err
		}
		for _, e := range info.LogEntries {
			printLogEntry(out, e)
		}
		offset += len(info.LogEntries)
		done := info.Status == "ready" || info.Status == "error"
		if done && len(info.LogEntries) == 0 {
			return info, nil
		}
		if len(info.LogEntries) > 0 {
			continue // a page: there may be more right away
		}
		select {
		case <-ctx.Done():
			return api.BuildInfo{}, ctx.Err()
		case <-time.After(pollEvery):
		}
	}
}

func printLogEntry(w io.Writer, e api.BuildLogEntry) {
	if e.Level == "error" {
		fmt.Fprintf(w, "error: %s\n", e.Message)
		return
	}
	fmt.Fprintln(w, e.Message)
}

// buildFailed is a build that ended in error: its step and reason.
func buildFailed(template string, info api.BuildInfo) error {
	msg, step := "no reason given", ""
	if info.Reason != nil {
		msg, step = info.Reason.Message, info.Reason.Step
	}
	where := ""
	switch {
	case step == "" || strings.HasPrefix(msg, "step "+step+" "):
		// The reason names the step already.
	case step == build.StepBase || step == build.StepFinalize:
		where = " at " + step
	default:
		where = " at step " + step
	}
	return fmt.Errorf("template %s build %s failed%s: %s", template, info.BuildID, where, msg)
}

// buildResult is what `template build --json` prints.
type buildResult struct {
	TemplateID string   `json:"templateID"`
	BuildID    string   `json:"buildID"`
	Status     string   `json:"status"`
	Tags       []string `json:"tags,omitempty"`
	// SnapshotID is the template's snapshot (as `template ls` shows it).
	SnapshotID string `json:"snapshotID,omitempty"`
}

// runBuild builds template nameTag from o: logs and progress to log,
// the result to out.
func runBuild(ctx context.Context, c *client.Client, nameTag string, o *buildOpts, jsonOut bool, out, log io.Writer) error {
	if o.cpu < 0 || o.memory < 0 {
		return errors.New("--cpu and --memory-mb: want positive numbers")
	}
	if _, _, err := build.SplitName(nameTag); err != nil {
		return err
	}
	spec, ups, err := o.spec(ctx, log)
	if err != nil {
		return err
	}
	req, err := c.RequestBuild(ctx, api.BuildRequest{Name: nameTag, Tags: o.tags, CPUCount: o.cpu, MemoryMB: o.memory})
	if err != nil {
		return err
	}
	tpl := req.TemplateID
	if err := uploadFiles(ctx, c, tpl, ups, log); err != nil {
		return err
	}
	if err := c.StartBuild(ctx, tpl, req.BuildID, spec); err != nil {
		return err
	}
	res := buildResult{TemplateID: tpl, BuildID: req.BuildID, Status: "building", Tags: req.Tags}
	if o.noWait {
		if jsonOut {
			return printJSON(out, res)
		}
		fmt.Fprintln(out, req.BuildID)
		return nil
	}
	info, err := followBuild(ctx, c, tpl, req.BuildID, 0, log)
	if err != nil {
		if ctx.Err() != nil {
			// The build runs on the server: only the following stopped.
			return fmt.Errorf("stopped following build %s, which goes on (spore template logs %s %s --follow): %w", req.BuildID, tpl, req.BuildID, err)
		}
		return err
	}
	if info.Status != "ready" {
		return buildFailed(tpl, info)
	}
	res.Status = info.Status
	// The template's snapshot, as the previous `template build` printed
	// it (and `template ls` lists it).
	if list, err := c.Templates(ctx); err != nil {
		fmt.Fprintf(log, "warning: list templates for %s's snapshot: %v\n", tpl, err)
	} else {
		for _, t := range list {
			if t.Key == tpl || (t.Key == "" && slices.Contains(t.Aliases, tpl)) {
				res.SnapshotID = t.TemplateID
			}
		}
	}
	fmt.Fprintf(log, "template %s built (build %s)\n", tpl, req.BuildID)
	if jsonOut {
		return printJSON(out, res)
	}
	if res.SnapshotID != "" {
		fmt.Fprintln(out, res.SnapshotID)
	} else {
		fmt.Fprintln(out, tpl)
	}
	return nil
}
