// Package engine runs Spore's sandbox operations on one host: template
// build, create, snapshot, fork, rollback, pause, hibernate, resume and
// kill, over a runtime.Runtime and a snapshot repository.
//
// Every operation on a sandbox is serialized by a per-sandbox lock and
// journaled in the sandbox's record before it changes anything, so that an
// engine killed at any moment (even by SIGKILL) finishes or undoes the
// operation when it is opened again (see recover.go).
package engine

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapshot"
)

// Config wires an engine.
type Config struct {
	// Dir holds the engine's records; one engine owns it at a time.
	Dir string
	// RootFSDir holds the named root filesystems (see package rootfs).
	RootFSDir string
	Runtime   runtime.Runtime
	Snapshots *snapshot.Repo
	Logger    *slog.Logger
	// Network, when set, gives every instance its own network namespace.
	Network Network
	// Volumes, when set, keeps volume images: exclusive volumes are
	// captured with snapshots (exclusive.go); without it a sandbox with
	// one cannot be snapshotted or forked.
	Volumes VolumeImages
	// Init, when set, re-initialises the in-sandbox daemon after every
	// restore (new identity and access token per sandbox).
	Init Initializer
	// MemoryReserve is the memory floor: host memory (bytes of
	// MemAvailable) that new instances may not eat into. A create, fork
	// child, rollback or resume from hibernation whose image's memory does
	// not fit above it (admission.go) is refused with ErrResourceLimit
	// instead of pushing the host into thrashing or the OOM killer, and
	// the pressure relief (pressure.go) hibernates the coldest sandboxes
	// when MemAvailable falls under it. 0 means the default
	// (DefaultMemoryReserve); negative disables both.
	MemoryReserve int64
	// MemAvailable reads the host's available memory in bytes (default:
	// /proc/meminfo); tests replace it.
	MemAvailable func() (int64, error)
	// InstanceOverhead is the memory an instance holds beyond its image's
	// (0: DefaultInstanceOverhead; negative: none).
	InstanceOverhead int64
	// MemoryMargin is how far above the floor the pressure relief brings
	// MemAvailable back (0: defaultMargin of the floor).
	MemoryMargin int64
	// RestoreTargets is how many restore targets (instances pre-created
	// with their networks, see targets.go) are kept for each shape that
	// restores ask for; 0: none. Needs a runtime.Precreator.
	RestoreTargets int
	// RestoreTargetsBurst is the most restore targets a shape keeps after a
	// burst of restores of it (a fork's children, overlapping creates): its
	// pool grows to the burst's size, up to this, and goes back to
	// RestoreTargets after TargetBurstIdle without a restore of the shape.
	// Below RestoreTargets (0 included): no growth.
	RestoreTargetsBurst int
	// TargetBurstIdle: see RestoreTargetsBurst (0: DefaultTargetBurstIdle).
	TargetBurstIdle time.Duration
	// ReservedNetworks is how many networks (see netpool.go) are kept set
	// up ahead of time for the restores that find no restore target; 0:
	// none. Needs a Network.
	ReservedNetworks int
	// CleanupRetry is the first wait before a failed cleanup (freeing an
	// instance or snapshot an operation replaced) is retried; it doubles
	// up to a minute. Default 1s.
	CleanupRetry time.Duration
	// Launches is how many instances may be launched (booted or restored)
	// at once, shared fairly between the teams that wait (launchgate.go);
	// 0: DefaultLaunches(); negative: no bound.
	Launches int
}

// Engine runs sandboxes on one host.
type Engine struct {
	// ops counts the operations in flight and lastOp is when the last
	// ended (UnixNano): see opBegin.
	ops    atomic.Int64
	lastOp atomic.Int64
	// refusals counts the launches admission refused (Refusals).
	refusals refusalCounts

	dir       string
	rootfsDir string
	rt        runtime.Runtime
	snaps     *snapshot.Repo
	log       *slog.Logger
	lockFile  *os.File
	net       Network
	vols      VolumeImages // nil: no exclusive volumes (exclusive.go)
	init      Initializer
	mem       *memory // the floor, admission's ledger, activity (admission.go, pressure.go)
	targets   *targetPool
	gate      *launchGate // fair launch slots (launchgate.go)
	nets      *netPool

	bg bgTasks // background work of finished operations (and of timers)
	// The cleanup retrier (cleanup.go): retrier counts it, cleaning says
	// it runs, cleanGen bumps with each new failure it must see.
	retrier    sync.WaitGroup
	cleanRetry time.Duration
	cleaning   bool
	cleanGen   int
	// life ends at Close: it stops the watchers of instances (death.go).
	life     context.Context
	endLife  context.CancelFunc
	mu       sync.Mutex
	deathFns []func(Sandbox)
	records  map[string]*record
	locks    map[string]opLock
	inUse    map[string]int // snapshot ID -> restores reading its image
}

// Open takes ownership of cfg.Dir, loads the sandbox records and recovers:
// it re-attaches to instances still running, finishes or undoes operations
// a crash interrupted, and removes orphans (see recover.go).
func Open(ctx context.Context, cfg Config) (*Engine, error) {
	if cfg.Runtime == nil || cfg.Snapshots == nil {
		return nil, errdefs.Invalidf("engine: runtime and snapshot repository are required")
	}
	if !filepath.IsAbs(cfg.Dir) || !filepath.IsAbs(cfg.RootFSDir) {
		return nil, errdefs.Invalidf("engine: directories must be absolute paths (%q, %q)", cfg.Dir, cfg.RootFSDir)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.CleanupRetry <= 0 {
		cfg.CleanupRetry = time.Second
	}
	for _, d := range []string{cfg.Dir, filepath.Join(cfg.Dir, "sandboxes"), filepath.Join(cfg.Dir, "tmp"), filepath.Join(cfg.Dir, "cleanup")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
	}
	lf, err := os.OpenFile(filepath.Join(cfg.Dir, "engine.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lf.Close()
		return nil, fmt.Errorf("engine: %s is owned by another running engine: %w", cfg.Dir, errdefs.ErrUnavailable)
	}
	e := &Engine{
		dir: cfg.Dir, rootfsDir: cfg.RootFSDir, rt: cfg.Runtime, snaps: cfg.Snapshots,
		log: cfg.Logger, lockFile: lf, net: cfg.Network, vols: cfg.Volumes, init: cfg.Init,
		mem: newMemory(cfg), cleanRetry: cfg.CleanupRetry,
		records: map[string]*record{}, locks: map[string]opLock{}, inUse: map[string]int{},
		gate:    newLaunchGate(launchSlots(cfg.Launches)),
		targets: newTargetPool(cfg.RestoreTargets, cfg.RestoreTargetsBurst, cfg.TargetBurstIdle), nets: newNetPool(cfg.ReservedNetworks, cfg.Network),
	}
	e.life, e.endLife = context.WithCancel(context.Background())
	for _, id := range cfg.Snapshots.Lost() {
		e.log.Warn("snapshot lost: the host restarted before its image reached the disk", "snapshot_id", id)
	}
	if err := e.recover(ctx); err != nil {
		e.endLife()
		e.retrier.Wait()
		lf.Close()
		return nil, fmt.Errorf("engine: recover: %w", err)
	}
	for _, r := range e.records {
		if r.State == StateRunning || r.State == StatePaused {
			e.watch(r.ID, r.Instance)
		}
	}
	return e, nil
}

// Close releases the engine's directory. Sandboxes keep running; the next
// Open re-attaches to them.
func (e *Engine) Close() error {
	e.closeTargets()
	e.closeNets()
	e.endLife()
	e.bg.wait()
	e.retrier.Wait() // stops at the end of life
	return e.lockFile.Close()
}

// background runs fn after an operation has answered (freeing what it
// replaced); Close and Settle wait for it.
func (e *Engine) background(fn func()) {
	e.bg.add()
	go func() {
		defer e.bg.done()
		fn()
	}()
}

// bgTasks counts work running in the background. Unlike a sync.WaitGroup's,
// its count may rise from zero while someone waits: a timer (a shape's
// targets going back to their resting number) starts work at any time.
type bgTasks struct {
	mu   sync.Mutex
	n    int
	zero sync.Cond // signalled when n drops to 0; L is mu
}

func (t *bgTasks) add() {
	t.mu.Lock()
	t.n++
	t.mu.Unlock()
}

func (t *bgTasks) done() {
	t.mu.Lock()
	if t.n--; t.n == 0 {
		t.cond().Broadcast()
	}
	t.mu.Unlock()
}

// wait returns once no task runs.
func (t *bgTasks) wait() {
	t.mu.Lock()
	for t.n > 0 {
		t.cond().Wait()
	}
	t.mu.Unlock()
}

// cond is zero with its lock set. Callers hold mu.
func (t *bgTasks) cond() *sync.Cond {
	if t.zero.L == nil {
		t.zero.L = &t.mu
	}
	return &t.zero
}

// Settle waits until the work operations left running in the background
// (freeing the instance a rollback replaced, making restore targets) is
// done.
func (e *Engine) Settle() {
	e.bg.wait()
	if e.targets != nil {
		e.targets.fills.Wait()
	}
	if e.nets != nil {
		e.nets.fills.Wait()
	}
	e.bg.wait() // what a failed fill dropped
}

// Runtime returns the runtime the engine drives.
func (e *Engine) Runtime() runtime.Runtime { return e.rt }

// Snapshots returns the engine's snapshot repository.
func (e *Engine) Snapshots() *snapshot.Repo { return e.snaps }

// Get returns one sandbox.
func (e *Engine) Get(ctx context.Context, id string) (Sandbox, error) {
	rec, err := e.load(id)
	if err != nil {
		return Sandbox{}, err
	}
	return rec.view(), nil
}

// List returns every sandbox, oldest first.
func (e *Engine) List(ctx context.Context) []Sandbox {
	e.mu.Lock()
	out := make([]Sandbox, 0, len(e.records))
	for _, r := range e.records {
		out = append(out, r.view())
	}
	e.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Exec runs a command in a running sandbox and returns its exit code. The
// sandbox's environment and working directory are the defaults.
func (e *Engine) Exec(ctx context.Context, id string, spec runtime.ExecSpec) (int, error) {
	rec, err := e.load(id)
	if err != nil {
		return -1, err
	}
	if rec.State != StateRunning || rec.Instance == "" {
		return -1, fmt.Errorf("sandbox %s is %s: cannot exec in it: %w", id, rec.view().State, errdefs.ErrConflict)
	}
	e.touch(id)
	spec.Env = append(append([]string(nil), rec.Run.Env...), spec.Env...)
	if spec.Cwd == "" {
		spec.Cwd = rec.Run.Cwd
	}
	code, err := e.rt.Exec(ctx, rec.Instance, spec)
	if errdefs.IsNotFound(err) {
		// The instance changed under us (rollback, hibernate, kill).
		return -1, fmt.Errorf("sandbox %s changed while exec started: %w", id, errdefs.ErrConflict)
	}
	return code, err
}

// DeleteSnapshot deletes a snapshot (or template). A snapshot that a
// restore is reading, or that holds a hibernated sandbox, is refused.
func (e *Engine) DeleteSnapshot(ctx context.Context, ref string) error {
	m, err := e.snaps.Get(ref)
	if err != nil {
		return err
	}
	e.mu.Lock()
	busy := e.inUse[m.ID] > 0
	for _, r := range e.records {
		if r.Hibernation == m.ID {
			busy = true
		}
	}
	if busy {
		e.mu.Unlock()
		return fmt.Errorf("snapshot %s is in use: %w", m.ID, errdefs.ErrConflict)
	}
	// Hold it as in use while deleting so no restore starts meanwhile.
	e.inUse[m.ID] = -1 << 30
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.inUse, m.ID)
		e.mu.Unlock()
	}()
	if err := e.snaps.Delete(m.ID); err != nil {
		return err
	}
	e.dropCopies(m.Run) // its exclusive volumes' content (exclusive.go)
	return nil
}

// acquireSnapshot resolves ref and marks the snapshot as being read, so it
// cannot be deleted until release is called.
func (e *Engine) acquireSnapshot(ref string) (snapshot.Manifest, func(), error) {
	m, err := e.snaps.Get(ref)
	if err != nil {
		return snapshot.Manifest{}, nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.inUse[m.ID] < 0 {
		return snapshot.Manifest{}, nil, fmt.Errorf("snapshot %s: %w (being deleted)", m.ID, errdefs.ErrNotFound)
	}
	e.inUse[m.ID]++
	return m, func() {
		e.mu.Lock()
		e.inUse[m.ID]--
		if e.inUse[m.ID] == 0 {
			delete(e.inUse, m.ID)
		}
		e.mu.Unlock()
	}, nil
}

// instanceSpec is the runtime spec of a new instance restored from m:
// over the tree m was taken over, with the runtime build that wrote it
// (versions.go).
func (e *Engine) instanceSpec(instance string, m snapshot.Manifest) (runtime.Spec, error) {
	root, err := e.treeOf(m)
	if err != nil {
		return runtime.Spec{}, err
	}
	build, err := e.buildOf(m)
	if err != nil {
		return runtime.Spec{}, err
	}
	return runtime.Spec{
		ID: instance, RootFS: root,
		Args: m.Run.Args, Env: m.Run.Env, Cwd: m.Run.Cwd, User: m.Run.User,
		Hostname: m.Run.Hostname, Limits: m.Run.Limits, Mounts: m.Run.Mounts,
		MemoryAlertSignal: m.Run.MemoryAlertSignal, Build: build,
	}, nil
}

// tmpDir makes a scratch directory (fork images); Open empties the parent.
func (e *Engine) tmpDir(prefix string) (string, error) {
	return os.MkdirTemp(filepath.Join(e.dir, "tmp"), prefix)
}

// cleanupCtx is a context for undoing an operation whose own context may
// have ended: cleanup must run to completion.
func cleanupCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 2*time.Minute)
}

func isRecordFile(name string) (string, bool) {
	if !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
		return "", false
	}
	return strings.TrimSuffix(name, ".json"), true
}
