package engine_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/gvisor"
	"github.com/spore-run/spore/internal/runtime/runtimetest"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/testenv"
)

// env is one engine's world: its data directory, runtime and engine.
type env struct {
	t       testing.TB
	dir     string
	cgroup  string
	drv     *gvisor.Driver
	eng     *engine.Engine
	rootfs  string
	logger  *slog.Logger
	counter string // the counter template's name
	// avail, when set, is the host memory the engine sees (bytes).
	avail *atomic.Int64
	// configure, when set, adjusts the engine's configuration.
	configure func(*engine.Config)
}

func logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// newEnv opens an engine in a fresh data directory and builds the counter
// template. Everything it creates is removed when the test ends.
func newEnv(t testing.TB) *env {
	t.Helper()
	return newEnvWith(t, nil)
}

// newEnvWith is newEnv with the engine's configuration adjusted by configure.
func newEnvWith(t testing.TB, configure func(*engine.Config)) *env {
	t.Helper()
	testenv.RequireRoot(t)
	e := &env{t: t, dir: t.TempDir(), cgroup: "/spore-test-" + ids.New('g'), rootfs: testenv.RootFSDir(t), logger: logger(), configure: configure}
	testenv.Runsc(t)
	e.open()
	t.Cleanup(e.destroy)
	ctx := ctxFor(t)
	if _, err := e.eng.BuildTemplate(ctx, engine.TemplateSpec{
		Name: "counter",
		Run:  snapshot.RunConfig{Args: runtimetest.CounterArgs, Limits: runtime.Limits{DiskMB: 512}},
		// Ready once the counter wrote its first state.
		Ready: []string{"test", "-s", runtimetest.CounterFile},
	}); err != nil {
		t.Fatalf("build template: %v", err)
	}
	e.counter = "counter"
	return e
}

// open (re)opens the driver and the engine on e.dir, as a restarted
// process would.
func (e *env) open() {
	e.t.Helper()
	ctx := ctxFor(e.t)
	drv, err := gvisor.New(ctx, gvisor.Config{
		Runsc: testenv.Runsc(e.t), StateDir: filepath.Join(e.dir, "runtime"), CgroupParent: e.cgroup, Logger: e.logger,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	repo, err := snapshot.Open(filepath.Join(e.dir, "snapshots"))
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := engine.Config{
		Dir: filepath.Join(e.dir, "engine"), RootFSDir: e.rootfs, Runtime: drv, Snapshots: repo, Logger: e.logger,
	}
	if e.avail != nil {
		cfg.MemAvailable = func() (int64, error) { return e.avail.Load(), nil }
	}
	if e.configure != nil {
		e.configure(&cfg)
	}
	eng, err := engine.Open(ctx, cfg)
	if err != nil {
		e.t.Fatalf("open engine: %v", err)
	}
	e.drv, e.eng = drv, eng
}

// reopen simulates an engine restart.
func (e *env) reopen() {
	e.t.Helper()
	if e.eng != nil {
		e.eng.Close()
	}
	e.open()
}

func (e *env) destroy() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if e.eng != nil {
		for _, sb := range e.eng.List(ctx) {
			if err := e.eng.Kill(ctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
				e.t.Errorf("cleanup: kill %s: %v", sb.ID, err)
			}
		}
		e.eng.Close()
	}
	if e.drv != nil {
		if err := e.drv.Purge(ctx); err != nil {
			e.t.Errorf("cleanup: purge: %v", err)
		}
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/*" + e.cgroup); len(m) > 0 {
		e.t.Errorf("cleanup: cgroups left: %v", m)
	}
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (e *env) create(ctx context.Context, template string) engine.Sandbox {
	e.t.Helper()
	sb, err := e.eng.Create(ctx, engine.CreateOptions{Template: template})
	if err != nil {
		e.t.Fatalf("create from %s: %v", template, err)
	}
	if sb.State != engine.StateRunning {
		e.t.Fatalf("created sandbox is %s", sb.State)
	}
	return sb
}

func (e *env) execer(id string) runtimetest.Execer {
	return func(ctx context.Context, args ...string) (string, int, error) {
		var out bytes.Buffer
		code, err := e.eng.Exec(ctx, id, runtime.ExecSpec{Args: args, Stdout: &out})
		return out.String(), code, err
	}
}

// sh runs a shell script in a sandbox and returns its combined output.
func (e *env) sh(ctx context.Context, id, script string) string {
	e.t.Helper()
	var out bytes.Buffer
	code, err := e.eng.Exec(ctx, id, runtime.ExecSpec{Args: []string{"/bin/sh", "-c", script}, Stdout: &out, Stderr: &out})
	if err != nil {
		e.t.Fatalf("exec %q in %s: %v", script, id, err)
	}
	if code != 0 {
		e.t.Fatalf("exec %q in %s exited %d: %s", script, id, code, out.String())
	}
	return out.String()
}

func (e *env) bump(ctx context.Context, id string) runtimetest.Counter {
	e.t.Helper()
	c, err := runtimetest.Bump(ctx, e.execer(id))
	if err != nil {
		e.t.Fatalf("bump %s: %v", id, err)
	}
	return c
}

// wantContinues checks that sandbox id's counter process is the one that
// had counted to prev: same token, next value.
func (e *env) wantContinues(ctx context.Context, id string, prev runtimetest.Counter) runtimetest.Counter {
	e.t.Helper()
	c := e.bump(ctx, id)
	if c.Token != prev.Token || c.N != prev.N+1 {
		e.t.Fatalf("%s: counter %s %d, want %s %d (the same process, memory intact)", id, c.Token, c.N, prev.Token, prev.N+1)
	}
	return c
}

// tree lists every path under dir with its size, to compare the disk
// before and after an operation that must change nothing.
func tree(t testing.TB, dir string) string {
	var lines []string
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		if strings.HasSuffix(rel, "engine.lock") {
			return nil
		}
		size := info.Size()
		if info.IsDir() {
			size = 0
		}
		lines = append(lines, rel+" "+info.Mode().String()+" "+strconv.FormatInt(size, 10))
		return nil
	})
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
