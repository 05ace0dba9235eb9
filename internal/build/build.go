package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
)

// Platform is what a build needs from Spore: sandboxes and snapshots (the
// control plane), and the uploaded files (the blob store).
type Platform interface {
	// ImageBase returns a template of image ref (pulled by a node), made
	// once per reference and credentials and kept; force makes it again
	// (a tag may have moved).
	ImageBase(ctx context.Context, ref string, reg *Registry, force bool) (string, error)
	// Resolve returns the ID of the snapshot ref (a template, snapshot
	// ID or name, of team's or one it may use) is at now:
	// errdefs.ErrNotFound when none.
	Resolve(ctx context.Context, team, ref string) (string, error)
	// Cached is Resolve for the names the build service makes itself
	// (cache entries, CachePrefix): they are always store rows, so a miss
	// asks no node. Cache entries are snapshots of the build's team: a
	// team's builds share them, another team's do not see them.
	Cached(ctx context.Context, team, name string) (string, error)
	// Start starts a sandbox from ref, of size (zeros: the defaults).
	// Start makes a build sandbox for team (its snapshots and templates
	// are the ones ref may name).
	Start(ctx context.Context, team, ref string, size Size) (Sandbox, error)
	// Snapshot takes a live snapshot of sandbox id under name and
	// returns its ID; template makes it the template name.
	Snapshot(ctx context.Context, id, name string, template bool) (string, error)
	// DeleteSnapshot deletes team's snapshot ref (its ID or name).
	DeleteSnapshot(ctx context.Context, team, ref string) error
	Kill(ctx context.Context, id string) error
	// Files opens the archive uploaded under hash for template.
	Files(ctx context.Context, template, hash string) (io.ReadCloser, error)
}

// Sandbox is a running build sandbox, reached through its daemon.
type Sandbox interface {
	ID() string
	// Run runs argv as user ("" = the daemon's default user) in the
	// default working directory, sending output lines to out, and
	// returns its exit code.
	Run(ctx context.Context, argv []string, user string, out func(line string)) (int, error)
	// Background starts argv as user and leaves it running. The channel
	// receives the process's Exit if it ends before ctx does; ending ctx
	// stops the watch, never the process.
	Background(ctx context.Context, argv []string, user string) (<-chan Exit, error)
	// WriteFile writes r to path, as root; Remove removes path.
	WriteFile(ctx context.Context, path string, r io.Reader) error
	Remove(ctx context.Context, path string) error
	// Env is the daemon's default environment; MakeDir creates a
	// directory and its parents, as root.
	Env(ctx context.Context) (map[string]string, error)
	MakeDir(ctx context.Context, path string) error
	// Init merges env into the daemon's default environment and sets its
	// default user and working directory ("" keeps them): they are in the
	// daemon's memory, so in every snapshot taken after.
	Init(ctx context.Context, env map[string]string, user, workdir string) error
}

// Exit is how a background process ended.
type Exit struct {
	Code int      // its exit code; -1 when a signal ended it
	Tail []string // its last lines of output, stdout and stderr
}

// Log is one build log entry.
type Log struct {
	Time    time.Time
	Level   string // "info", "error"
	Message string
	Step    string // StepBase, StepName(i), StepFinalize
}

// StepError is a build that failed at a step.
type StepError struct {
	Step string
	Err  error
}

func (e *StepError) Error() string { return e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// Size is a build sandbox's (so the template's) CPUs and memory.
type Size struct{ CPUCount, MemoryMB int }

// Job is one build: template Name from Spec, in sandboxes of Size.
type Job struct {
	Team string // the team it builds for ("": the default team)
	Name string
	Spec Spec
	Size Size
}

// Builder runs builds.
type Builder struct {
	P   Platform
	Log *slog.Logger
	// ReadyTimeout bounds the ready command's wait (default 5 min).
	ReadyTimeout time.Duration
	// EnvdPath is the daemon's binary inside sandboxes (its copy mode
	// unpacks COPY archives without the image's tools).
	EnvdPath string
}

// CachePrefix names the snapshots that hold the build cache: one per
// step result, named by the hash of the step and everything before it.
const CachePrefix = "build-cache-"

// shell runs script with bash when the image has it, else sh (minimal
// images have no bash).
func shell(script string) []string {
	return []string{"/bin/sh", "-c", `if [ -x /bin/bash ]; then exec /bin/bash -c "$0"; fi; exec /bin/sh -c "$0"`, script}
}

// Result is what a build made.
type Result struct {
	// Template is the template's snapshot (replaced by its next build).
	Template string
	// Build is the build's own result, the cache entry of its final
	// state: it stays when the template is built again, so a tag can
	// keep naming it.
	Build string
}

// Build runs spec for template name. logf receives the log as it
// happens. A failure is a *StepError naming the step (its Err keeps the
// error's kind).
func (b *Builder) Build(ctx context.Context, job Job, logf func(Log)) (Result, error) {
	name, spec := job.Name, job.Spec
	if err := spec.Validate(); err != nil {
		return Result{}, &StepError{Step: StepBase, Err: err}
	}
	info := func(step, format string, a ...any) {
		logf(Log{Time: time.Now(), Level: "info", Step: step, Message: fmt.Sprintf(format, a...)})
	}
	base := spec.FromTemplate
	if spec.FromImage != "" {
		info(StepBase, "FROM %s", spec.FromImage)
		ref, err := b.P.ImageBase(ctx, spec.FromImage, spec.FromImageRegistry, spec.Force)
		if err != nil {
			return Result{}, &StepError{Step: StepBase, Err: fmt.Errorf("image %s: %w", spec.FromImage, err)}
		}
		base = ref
	} else {
		info(StepBase, "FROM template %s", spec.FromTemplate)
	}
	baseSnap, err := b.P.Resolve(ctx, job.Team, base)
	if err != nil {
		return Result{}, &StepError{Step: StepBase, Err: fmt.Errorf("base %s: %w", base, err)}
	}
	// keys[i] is the cache key of the state after i steps; the last is the
	// finalized state (start command running, ready).
	keys := make([]string, len(spec.Steps)+2)
	keys[0] = key("base", baseSnap)
	firstForced := len(keys) // none
	for i, st := range spec.Steps {
		args, _ := json.Marshal(st.Args)
		keys[i+1] = key(keys[i], st.Type, string(args), st.FilesHash)
		if (st.Force || spec.Force) && firstForced > i+1 {
			firstForced = i + 1
		}
	}
	keys[len(keys)-1] = key(keys[len(keys)-2], "start", spec.StartCmd, "ready", spec.ReadyCmd)
	if spec.Force {
		firstForced = 1
	}
	// The longest cached prefix before any forced step.
	from, done := base, 0
	for i := min(firstForced-1, len(keys)-1); i >= 1; i-- {
		if _, err := b.P.Cached(ctx, job.Team, CachePrefix+keys[i]); err == nil {
			from, done = CachePrefix+keys[i], i
			break
		} else if !errdefs.IsNotFound(err) {
			return Result{}, &StepError{Step: StepBase, Err: err}
		}
	}
	for i := 1; i <= min(done, len(spec.Steps)); i++ {
		info(StepName(i-1), "CACHED [%d/%d] %s", i, len(spec.Steps), describe(spec.Steps[i-1]))
	}
	sb, err := b.P.Start(ctx, job.Team, from, job.Size)
	if err != nil {
		return Result{}, &StepError{Step: StepBase, Err: fmt.Errorf("start a build sandbox from %s: %w", from, err)}
	}
	defer func() {
		kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := b.P.Kill(kctx, sb.ID()); err != nil && !errdefs.IsNotFound(err) {
			b.log().Warn("kill build sandbox", "sandbox_id", sb.ID(), "err", err)
		}
	}()
	for i := done + 1; i <= len(spec.Steps); i++ {
		st, step := spec.Steps[i-1], StepName(i-1)
		info(step, "[%d/%d] %s", i, len(spec.Steps), describe(st))
		out := func(line string) { info(step, "%s", line) }
		if err := b.step(ctx, name, sb, st, out); err != nil {
			return Result{}, &StepError{Step: step, Err: fmt.Errorf("step %d (%s): %w", i, describe(st), err)}
		}
		if err := b.cache(ctx, job.Team, sb, keys[i], i >= firstForced); err != nil {
			return Result{}, &StepError{Step: step, Err: err}
		}
	}
	if done < len(keys)-1 {
		if err := b.finalize(ctx, sb, spec, info); err != nil {
			return Result{}, &StepError{Step: StepFinalize, Err: err}
		}
		if err := b.cache(ctx, job.Team, sb, keys[len(keys)-1], firstForced < len(keys)); err != nil {
			return Result{}, &StepError{Step: StepFinalize, Err: err}
		}
	} else {
		info(StepFinalize, "CACHED start and ready")
	}
	id, err := b.P.Snapshot(ctx, sb.ID(), name, true)
	if err != nil {
		return Result{}, &StepError{Step: StepFinalize, Err: fmt.Errorf("snapshot the template: %w", err)}
	}
	final, err := b.P.Cached(ctx, job.Team, CachePrefix+keys[len(keys)-1])
	if err != nil {
		return Result{}, &StepError{Step: StepFinalize, Err: fmt.Errorf("the build's cache entry: %w", err)}
	}
	info(StepFinalize, "template %s is snapshot %s", name, id)
	return Result{Template: id, Build: final}, nil
}

// step runs one step in sb.
func (b *Builder) step(ctx context.Context, template string, sb Sandbox, st Step, out func(string)) error {
	arg := func(i int) string {
		if i < len(st.Args) {
			return st.Args[i]
		}
		return ""
	}
	switch st.Type {
	case StepRun:
		code, err := sb.Run(ctx, shell(st.Args[0]), arg(1), out)
		if err != nil {
			return err
		}
		if code != 0 {
			return failed("the command exited %d", code)
		}
	case StepCopy:
		f, err := b.P.Files(ctx, template, st.FilesHash)
		if err != nil {
			return fmt.Errorf("files %s: %w", st.FilesHash, err)
		}
		archive := "/tmp/.spore-copy-" + st.FilesHash
		err = sb.WriteFile(ctx, archive, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("upload files into the sandbox: %w", err)
		}
		argv := []string{b.envd(), "-copy", "-archive", archive, "-src", st.Args[0], "-dest", st.Args[1]}
		if u := arg(2); u != "" {
			argv = append(argv, "-user", u)
		}
		if m := arg(3); m != "" {
			argv = append(argv, "-mode", m)
		}
		code, err := sb.Run(ctx, argv, "root", out)
		if rerr := sb.Remove(ctx, archive); rerr != nil {
			b.log().Warn("remove a copy archive from a build sandbox", "sandbox_id", sb.ID(), "err", rerr)
		}
		if err != nil {
			return err
		}
		if code != 0 {
			return failed("copy %s to %s failed (exit %d)", st.Args[0], st.Args[1], code)
		}
	case StepEnv:
		// Values may name variables set before ($PATH, ${HOME}), as in a
		// Dockerfile: expanded against the environment so far.
		cur, err := sb.Env(ctx)
		if err != nil {
			return err
		}
		env := map[string]string{}
		for i := 0; i+1 < len(st.Args); i += 2 {
			env[st.Args[i]] = os.Expand(st.Args[i+1], func(k string) string { return cur[k] })
		}
		return sb.Init(ctx, env, "", "")
	case StepWorkdir:
		// Created if missing (by the daemon: the image needs no mkdir); a
		// relative one is resolved against the current working directory,
		// as in a Dockerfile.
		dir := st.Args[0]
		if !path.IsAbs(dir) {
			var wd string
			code, err := sb.Run(ctx, []string{"/bin/sh", "-c", "pwd"}, "root", func(l string) { wd = l })
			if err != nil {
				return err
			}
			if code != 0 || !path.IsAbs(wd) {
				return errdefs.Invalidf("cannot resolve the relative working directory %s", dir)
			}
			dir = path.Join(wd, dir)
		}
		if err := sb.MakeDir(ctx, dir); err != nil {
			return fmt.Errorf("create working directory %s: %w", dir, err)
		}
		return sb.Init(ctx, nil, "", dir)
	case StepUser:
		return sb.Init(ctx, nil, st.Args[0], "")
	}
	return nil
}

// finalize starts the start command and waits for the ready command. A
// ready or start command that cannot run at all (cannotRun: a program the
// image lacks) fails the build at once instead of at the ready timeout.
func (b *Builder) finalize(ctx context.Context, sb Sandbox, spec Spec, info func(step, format string, a ...any)) error {
	wctx, stop := context.WithCancel(ctx)
	defer stop() // stops watching the start command, which runs on
	var started <-chan Exit
	if spec.StartCmd != "" {
		info(StepFinalize, "start: %s", spec.StartCmd)
		ch, err := sb.Background(wctx, shell(spec.StartCmd), "")
		if err != nil {
			return fmt.Errorf("start command: %w", err)
		}
		started = ch
	}
	if spec.ReadyCmd == "" {
		return nil
	}
	info(StepFinalize, "waiting for: %s", spec.ReadyCmd)
	timeout := b.ReadyTimeout
	if timeout <= 0 {
		timeout = 5 * time.Minute
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		var out output
		code, err := sb.Run(rctx, shell(spec.ReadyCmd), "", out.add)
		if err == nil && code == 0 {
			info(StepFinalize, "ready")
			return nil
		}
		if err == nil {
			if why := cannotRun(code, out); why != "" {
				return failed("the ready command cannot run: %s", why)
			}
		}
		select {
		case ex := <-started:
			started = nil // ends once
			if err := startEnded(ex, info); err != nil {
				return err
			}
		case <-rctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("%w: the ready command did not pass within %v (last exit %d, %v): %s", errdefs.ErrUnavailable, timeout, code, err, out.last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// cache snapshots sb as the cache entry of key; replace drops an entry of
// that key first (a forced step).
func (b *Builder) cache(ctx context.Context, team string, sb Sandbox, k string, replace bool) error {
	name := CachePrefix + k
	if replace {
		if err := b.P.DeleteSnapshot(ctx, team, name); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("drop cache entry %s: %w", name, err)
		}
	}
	if _, err := b.P.Snapshot(ctx, sb.ID(), name, false); err != nil {
		if errors.Is(err, errdefs.ErrAlreadyExists) {
			return nil // a concurrent build of the same steps cached it
		}
		return fmt.Errorf("cache the step: %w", err)
	}
	return nil
}

func (b *Builder) envd() string {
	if b.EnvdPath != "" {
		return b.EnvdPath
	}
	return "/opt/spore/bin/spore-envd"
}

func (b *Builder) log() *slog.Logger {
	if b.Log != nil {
		return b.Log
	}
	return slog.Default()
}

// failed is a step's own failure (a command's exit): the user's to fix,
// so of kind ErrInvalidArgument, but its message is only what happened.
func failed(format string, a ...any) error {
	return kindError{msg: fmt.Sprintf(format, a...), kind: errdefs.ErrInvalidArgument}
}

type kindError struct {
	msg  string
	kind error
}

func (e kindError) Error() string { return e.msg }
func (e kindError) Unwrap() error { return e.kind }

// key hashes parts, each length-prefixed so that no two lists collide.
func key(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))[:40]
}

// describe is a step as a Dockerfile line, for the log.
func describe(st Step) string {
	switch st.Type {
	case StepEnv:
		var kv []string
		for i := 0; i+1 < len(st.Args); i += 2 {
			kv = append(kv, st.Args[i]+"="+st.Args[i+1])
		}
		return "ENV " + strings.Join(kv, " ")
	case StepCopy:
		return "COPY " + st.Args[0] + " " + st.Args[1]
	case StepRun:
		s := "RUN " + st.Args[0]
		if len(st.Args) > 1 && st.Args[1] != "" {
			s += " (as " + st.Args[1] + ")"
		}
		return s
	}
	return st.Type + " " + strings.Join(st.Args, " ")
}
