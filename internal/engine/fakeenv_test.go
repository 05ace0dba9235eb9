package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/fake"
	"github.com/spore-run/spore/internal/snapshot"
)

// fenv is an engine over the in-memory fake runtime: the fast tier's
// world. It needs no runsc, no root filesystem and no root, so it never
// calls testenv's real-runtime helpers.
type fenv struct {
	t      testing.TB
	dir    string // data directory: engine/, snapshots/, rootfs/
	rt     *fake.Runtime
	eng    *engine.Engine
	logs   *bytes.Buffer // the engine's log, for assertions on what operators see
	logMu  chan struct{}
	retry  time.Duration
	closed bool
	// targets is the engine's RestoreTargets (0: none); burst and
	// burstIdle its RestoreTargetsBurst and TargetBurstIdle.
	targets   int
	burst     int
	burstIdle time.Duration
	// avail, when set, is the host's available memory the engine reads,
	// with the default memory reserve (else no reserve).
	avail *atomic.Int64
	// net and nets are the engine's Network (nil: none) and
	// ReservedNetworks.
	net  engine.Network
	nets int
	// vols is the engine's VolumeImages (nil: none).
	vols engine.VolumeImages
}

// newFake opens an engine on a fresh directory over a fresh fake runtime
// and builds the template "tpl" (whose memory holds boot=<token>).
func newFake(t testing.TB) *fenv { return newFakeTargets(t, 0) }

// newFakeTargets is newFake with the engine keeping restore targets.
func newFakeTargets(t testing.TB, targets int) *fenv {
	t.Helper()
	return newFakeWith(t, &fenv{targets: targets})
}

// newFakeWith is newFake with f's settings (targets, net, nets).
func newFakeWith(t testing.TB, f *fenv) *fenv {
	t.Helper()
	f.t, f.dir, f.rt, f.logs, f.logMu, f.retry = t, t.TempDir(), fake.New(), &bytes.Buffer{}, make(chan struct{}, 1), 5*time.Millisecond
	rootfs := filepath.Join(f.dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "base"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "base.json"), []byte(`{"id":"fake-base-1","suite":"fake"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	f.open()
	t.Cleanup(f.close)
	if _, err := f.eng.BuildTemplate(fctx(t), engine.TemplateSpec{
		Name: "tpl", Run: snapshot.RunConfig{Args: []string{"init"}, Env: []string{"A=1"}}, Ready: []string{"true"},
	}); err != nil {
		t.Fatalf("build template: %v", err)
	}
	return f
}

func fctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// lockedWriter serializes the engine's concurrent log writes.
type lockedWriter struct {
	mu chan struct{}
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu <- struct{}{}
	defer func() { <-l.mu }()
	return l.w.Write(p)
}

func (f *fenv) open() {
	f.t.Helper()
	repo, err := snapshot.Open(filepath.Join(f.dir, "snapshots"))
	if err != nil {
		f.t.Fatal(err)
	}
	w := lockedWriter{mu: f.logMu, w: f.logs}
	reserve, memAvail := int64(-1), func() (int64, error) { return 0, nil }
	if f.avail != nil {
		reserve, memAvail = 0, func() (int64, error) { return f.avail.Load(), nil }
	}
	eng, err := engine.Open(fctx(f.t), engine.Config{
		Dir: filepath.Join(f.dir, "engine"), RootFSDir: filepath.Join(f.dir, "rootfs"),
		Runtime: f.rt, Snapshots: repo, MemoryReserve: reserve, MemAvailable: memAvail, CleanupRetry: f.retry, RestoreTargets: f.targets,
		RestoreTargetsBurst: f.burst, TargetBurstIdle: f.burstIdle,
		Network: f.net, ReservedNetworks: f.nets, Volumes: f.vols,
		Logger: slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		f.t.Fatalf("open engine: %v", err)
	}
	f.eng, f.closed = eng, false
}

// reopen is an engine restart: the fake's instances live on.
func (f *fenv) reopen() {
	f.t.Helper()
	f.close()
	f.open()
}

func (f *fenv) close() {
	if !f.closed && f.eng != nil {
		f.eng.Close()
		f.closed = true
	}
}

func (f *fenv) create() engine.Sandbox {
	f.t.Helper()
	sb, err := f.eng.Create(fctx(f.t), engine.CreateOptions{Template: "tpl"})
	if err != nil {
		f.t.Fatalf("create: %v", err)
	}
	return sb
}

// fork forks src and fails the test on the fork's error or any child's;
// it returns the children.
func (f *fenv) fork(src string, opts engine.ForkOptions) []engine.ForkChild {
	f.t.Helper()
	fr, err := f.eng.Fork(fctx(f.t), src, opts)
	if err != nil {
		f.t.Fatalf("fork: %v", err)
	}
	for _, c := range fr.Children {
		if c.Err != nil {
			f.t.Fatalf("fork child: %v", c.Err)
		}
	}
	return fr.Children
}

// run execs a command in a sandbox through the engine.
func (f *fenv) run(id string, args ...string) (string, error) {
	var out bytes.Buffer
	code, err := f.eng.Exec(fctx(f.t), id, runtime.ExecSpec{Args: args, Stdout: &out})
	if err == nil && code != 0 {
		return out.String(), errExit(code)
	}
	return out.String(), err
}

type errExit int

func (e errExit) Error() string { return fmt.Sprintf("exit %d", int(e)) }

// get reads key from a sandbox's memory.
func (f *fenv) get(id, key string) string {
	f.t.Helper()
	out, err := f.run(id, "get", key)
	if err != nil {
		f.t.Fatalf("get %s in %s: %v", key, id, err)
	}
	return strings.TrimSuffix(out, "\n")
}

func (f *fenv) set(id, key, value string) {
	f.t.Helper()
	if _, err := f.run(id, "set", key, value); err != nil {
		f.t.Fatalf("set %s in %s: %v", key, id, err)
	}
}

// logged returns what the engine logged so far.
func (f *fenv) logged() string {
	f.logMu <- struct{}{}
	defer func() { <-f.logMu }()
	return f.logs.String()
}

func (f *fenv) recordPath(id string) string {
	return filepath.Join(f.dir, "engine", "sandboxes", id+".json")
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
