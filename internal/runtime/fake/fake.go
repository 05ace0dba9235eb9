// Package fake is an in-memory runtime.Runtime for fast, deterministic
// tests of what sits above the runtime (the engine's state machine, its
// journal and recovery). It passes the contract part of the runtime
// conformance suite (runtimetest.RunContract); it runs no guest.
//
// An instance holds a small key-value "memory" that Exec's built-in
// commands read and write and that a checkpoint saves into a real file in
// the image directory, so a restore (or a rollback, or a fork) continues
// the memory of the instance it was taken from, and the engine's snapshot
// repository stores, commits and deletes real image directories.
//
// Faults are injected per operation and instance: Fail makes the next
// calls of an operation fail, Die makes an instance's init exit, and Hook
// runs before every operation (to block it, or to count the steps of a
// test).
//
// Instances live in the Runtime value, not in the test process's engine:
// opening a new engine over the same Runtime is a restart after which the
// instances are still there, as runsc's are.
package fake

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime"
)

// Op names a runtime operation, for Fail and Hook.
type Op string

// The operations of runtime.Runtime that can be failed or hooked.
const (
	OpStart      Op = "start"
	OpRestore    Op = "restore"
	OpCheckpoint Op = "checkpoint"
	OpExec       Op = "exec"
	OpPause      Op = "pause"
	OpResume     Op = "resume"
	OpKill       Op = "kill"
	OpState      Op = "state"
	OpList       Op = "list"
	OpRecover    Op = "recover"
	OpPrecreate  Op = "precreate"
)

// Name is what Runtime.Name reports: snapshots written by the fake are
// only restorable by the fake.
const Name = "fake/1"

// imageFile is the checkpoint image inside an image directory.
const imageFile = "checkpoint.img"

// ExecFunc handles an Exec that no built-in command handles. mem is the
// instance's memory (the handler may change it; it is saved by checkpoints).
type ExecFunc func(ctx context.Context, id string, mem map[string]string, spec runtime.ExecSpec) (int, error)

// Runtime is the in-memory runtime. The zero value is not usable: use New.
type Runtime struct {
	mu        sync.Mutex
	instances map[string]*instance
	faults    map[faultKey][]error
	hook      func(op Op, id string) error
	exec      ExecFunc
	calls     map[Op]int
}

type instance struct {
	spec    runtime.Spec
	state   runtime.State
	created time.Time
	pid     int
	mem     map[string]string
	exit    *runtime.Exit // set once its init has exited
	done    chan struct{} // closed when its processes are gone (exit or kill)
	pre     bool          // pre-created, waiting for a restore
	cpu     time.Duration // CPU time Stats reports (AddCPU)
}

type faultKey struct {
	op Op
	id string
}

// image is what a checkpoint writes.
type image struct {
	Version int               `json:"version"`
	RootFS  string            `json:"rootfs"`
	Args    []string          `json:"args"`
	Mounts  []runtime.Mount   `json:"mounts,omitempty"`
	Memory  map[string]string `json:"memory"`
}

var (
	_ runtime.Runtime     = (*Runtime)(nil)
	_ runtime.Waiter      = (*Runtime)(nil)
	_ runtime.StatsReader = (*Runtime)(nil)
	_ runtime.Precreator  = (*Runtime)(nil)
)

// New returns an empty runtime.
func New() *Runtime {
	return &Runtime{instances: map[string]*instance{}, faults: map[faultKey][]error{}, calls: map[Op]int{}}
}

// Fail makes the next n calls of op on instance id ("" for any instance)
// fail with err (wrapped with the instance ID), before they change
// anything. A failed call is counted by Calls.
func (r *Runtime) Fail(op Op, id string, n int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := faultKey{op, id}
	for range n {
		r.faults[k] = append(r.faults[k], err)
	}
}

// Clone returns a copy of the runtime's instances as they are now (a
// crash image: what a restarted process would find), without faults,
// hook or exec handler.
func (r *Runtime) Clone() *Runtime {
	c := New()
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, in := range r.instances {
		cp := *in
		cp.mem = maps.Clone(in.mem)
		cp.done = make(chan struct{})
		if in.exit != nil {
			ex := *in.exit
			cp.exit = &ex
			close(cp.done)
		}
		c.instances[id] = &cp
	}
	return c
}

// ClearFaults drops every fault Fail injected and not yet used.
func (r *Runtime) ClearFaults() {
	r.mu.Lock()
	clear(r.faults)
	r.mu.Unlock()
}

// Hook sets a function run before every operation (outside the runtime's
// lock, so it may block or call the runtime). A non-nil error fails the
// operation before it changes anything. nil removes the hook.
func (r *Runtime) Hook(fn func(op Op, id string) error) {
	r.mu.Lock()
	r.hook = fn
	r.mu.Unlock()
}

// HandleExec sets the handler for commands the built-ins do not know.
func (r *Runtime) HandleExec(fn ExecFunc) {
	r.mu.Lock()
	r.exec = fn
	r.mu.Unlock()
}

// Die makes instance id's init exit: the instance is stopped and holds
// its resources until Kill; Wait returns; Recover frees it.
func (r *Runtime) Die(id string, reason runtime.ExitReason, detail string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.instances[id]
	if !ok {
		return fmt.Errorf("instance %s: %w", id, errdefs.ErrNotFound)
	}
	if in.exit == nil {
		in.state = runtime.StateStopped
		in.exit = &runtime.Exit{ID: id, Reason: reason, Detail: detail, At: time.Now()}
		close(in.done)
	}
	return nil
}

// Calls reports how many times op was called (failed calls included).
func (r *Runtime) Calls(op Op) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[op]
}

// Instances returns the IDs of every instance the runtime holds, sorted.
func (r *Runtime) Instances() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.instances))
}

// Memory returns a copy of an instance's memory.
func (r *Runtime) Memory(id string) (map[string]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.instances[id]
	if !ok {
		return nil, fmt.Errorf("instance %s: %w", id, errdefs.ErrNotFound)
	}
	return maps.Clone(in.mem), nil
}

// enter counts the call, runs the hook and pops an injected fault.
func (r *Runtime) enter(op Op, id string) error {
	r.mu.Lock()
	r.calls[op]++
	hook := r.hook
	r.mu.Unlock()
	if hook != nil {
		if err := hook(op, id); err != nil {
			return fmt.Errorf("%s instance %s: %w", op, id, err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range []faultKey{{op, id}, {op, ""}} {
		if errs := r.faults[k]; len(errs) > 0 {
			r.faults[k] = errs[1:]
			return fmt.Errorf("%s instance %s (injected): %w", op, id, errs[0])
		}
	}
	return nil
}

// Name implements runtime.Runtime.
func (r *Runtime) Name() string { return Name }

// Capabilities implements runtime.Runtime. The disk limit is not enforced.
func (r *Runtime) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{LiveCheckpoint: true, Pause: true}
}

func checkSpec(spec runtime.Spec) error {
	if err := ids.Validate("instance ID", spec.ID); err != nil {
		return err
	}
	if !filepath.IsAbs(spec.RootFS) {
		return errdefs.Invalidf("instance %s: root filesystem %q must be an absolute path", spec.ID, spec.RootFS)
	}
	if st, err := os.Stat(spec.RootFS); err != nil || !st.IsDir() {
		return fmt.Errorf("instance %s: root filesystem %s: %w", spec.ID, spec.RootFS, errdefs.ErrNotFound)
	}
	if len(spec.Args) == 0 {
		return errdefs.Invalidf("instance %s: empty start command", spec.ID)
	}
	if l := spec.Limits; l.VCPUs < 0 || l.MemoryMB < 0 || l.MaxProcs < 0 || l.DiskMB < 0 {
		return errdefs.Invalidf("instance %s: negative resource limit", spec.ID)
	}
	for _, m := range spec.Mounts {
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Destination) || filepath.Clean(m.Destination) == "/" {
			return errdefs.Invalidf("instance %s: mount %s -> %s needs absolute paths and a destination other than /", spec.ID, m.Source, m.Destination)
		}
		if _, err := os.Stat(m.Source); err != nil {
			return fmt.Errorf("instance %s: mount source %s: %w", spec.ID, m.Source, errdefs.ErrNotFound)
		}
	}
	return nil
}

// add registers a new instance, refusing a taken ID.
func (r *Runtime) add(spec runtime.Spec, mem map[string]string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.instances[spec.ID]; ok {
		return fmt.Errorf("instance %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	r.instances[spec.ID] = &instance{
		spec: spec, state: runtime.StateRunning, created: time.Now().UTC(),
		pid: 100000 + len(r.instances), mem: mem, done: make(chan struct{}),
	}
	return nil
}

// Start implements runtime.Runtime: the instance's memory starts empty
// but for "boot", a fresh random-ish token (as a booted process would draw).
func (r *Runtime) Start(ctx context.Context, spec runtime.Spec) error {
	if err := checkSpec(spec); err != nil {
		return err
	}
	if err := r.enter(OpStart, spec.ID); err != nil {
		return err
	}
	return r.add(spec, map[string]string{"boot": ids.New('k')})
}

// Restore implements runtime.Runtime: the new instance's memory is the
// image's.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	b, err := os.ReadFile(filepath.Join(imageDir, imageFile))
	if err != nil {
		return fmt.Errorf("restore instance %s: image %s: %w", spec.ID, imageDir, errdefs.ErrNotFound)
	}
	if err := checkSpec(spec); err != nil {
		return err
	}
	var img image
	if err := json.Unmarshal(b, &img); err != nil || img.Version != 1 {
		return fmt.Errorf("restore instance %s: image %s is damaged: %w", spec.ID, imageDir, errdefs.ErrInternal)
	}
	// As runsc does, a restore must be given the checkpoint's mounts:
	// the same destinations and options; a source may differ (runsc
	// restores a bind mount over another directory: docs/volumes.md).
	if !slices.EqualFunc(img.Mounts, spec.Mounts, func(a, b runtime.Mount) bool {
		return a.Destination == b.Destination && a.ReadOnly == b.ReadOnly
	}) {
		return fmt.Errorf("restore instance %s: mounts differ from the checkpoint's: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if err := r.enter(OpRestore, spec.ID); err != nil {
		return err
	}
	if img.Memory == nil {
		img.Memory = map[string]string{}
	}
	r.mu.Lock()
	if in, ok := r.instances[spec.ID]; ok && in.pre {
		defer r.mu.Unlock()
		if in.spec.ID != spec.ID || in.spec.NetNS != spec.NetNS || !reflect.DeepEqual(runtime.RestoreShape(in.spec), runtime.RestoreShape(spec)) {
			return errdefs.Conflictf("instance %s was pre-created for another spec", spec.ID)
		}
		in.pre, in.mem, in.created = false, img.Memory, time.Now().UTC()
		return nil
	}
	r.mu.Unlock()
	return r.add(spec, img.Memory)
}

// Precreate implements runtime.Precreator: an instance with nothing in
// it, which only a Restore with the same spec fills.
func (r *Runtime) Precreate(ctx context.Context, spec runtime.Spec) error {
	if err := checkSpec(spec); err != nil {
		return err
	}
	if err := r.enter(OpPrecreate, spec.ID); err != nil {
		return err
	}
	if err := r.add(spec, map[string]string{}); err != nil {
		return err
	}
	r.mu.Lock()
	r.instances[spec.ID].pre = true
	r.mu.Unlock()
	return nil
}

// get returns a live instance (locked by the caller).
func (r *Runtime) get(id string) (*instance, error) {
	if err := ids.Validate("instance ID", id); err != nil {
		return nil, err
	}
	in, ok := r.instances[id]
	if !ok {
		return nil, fmt.Errorf("instance %s: %w", id, errdefs.ErrNotFound)
	}
	return in, nil
}

// Checkpoint implements runtime.Runtime: it writes the instance's memory
// into imageDir/checkpoint.img.
func (r *Runtime) Checkpoint(ctx context.Context, id, imageDir string, opts runtime.CheckpointOptions) error {
	r.mu.Lock()
	_, err := r.get(id)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	if err := r.enter(OpCheckpoint, id); err != nil {
		return err
	}
	r.mu.Lock()
	in, err := r.get(id)
	if err != nil {
		r.mu.Unlock()
		return err
	}
	if in.state == runtime.StateStopped {
		r.mu.Unlock()
		return fmt.Errorf("checkpoint instance %s: it has exited: %w", id, errdefs.ErrConflict)
	}
	img := image{Version: 1, RootFS: in.spec.RootFS, Args: in.spec.Args, Mounts: in.spec.Mounts, Memory: maps.Clone(in.mem)}
	r.mu.Unlock()
	b, err := json.Marshal(img)
	if err != nil {
		return fmt.Errorf("checkpoint instance %s: %w", id, err)
	}
	if err := os.WriteFile(filepath.Join(imageDir, imageFile), b, 0o600); err != nil {
		return fmt.Errorf("checkpoint instance %s: %w", id, err)
	}
	if !opts.LeaveRunning {
		r.remove(id)
	}
	return nil
}

func (r *Runtime) remove(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if in, ok := r.instances[id]; ok {
		if in.exit == nil {
			close(in.done)
		}
		delete(r.instances, id)
	}
}

// Exec implements runtime.Runtime with a few built-in commands, each a
// whole argument vector:
//
//	true | false | exit N             exit 0, 1, N
//	echo ARGS...                      print ARGS
//	env                               print the environment, one per line
//	set KEY VALUE                     store VALUE under KEY in the memory
//	get KEY                           print the value of KEY (exit 1: unset)
//	cat                               copy stdin to stdout
//
// Anything else goes to the HandleExec handler, or exits 127.
func (r *Runtime) Exec(ctx context.Context, id string, spec runtime.ExecSpec) (int, error) {
	if len(spec.Args) == 0 {
		if err := ids.Validate("instance ID", id); err != nil {
			return -1, err
		}
		return -1, errdefs.Invalidf("exec in %s: empty command", id)
	}
	r.mu.Lock()
	_, err := r.get(id)
	r.mu.Unlock()
	if err != nil {
		return -1, err
	}
	if err := r.enter(OpExec, id); err != nil {
		return -1, err
	}
	r.mu.Lock()
	in, err := r.get(id)
	if err == nil && in.state != runtime.StateRunning {
		err = fmt.Errorf("exec in %s: instance is %s: %w", id, in.state, errdefs.ErrConflict)
	}
	handler := r.exec
	r.mu.Unlock()
	if err != nil {
		return -1, err
	}
	var out bytes.Buffer
	code := 0
	a := spec.Args
	switch {
	case a[0] == "true" && len(a) == 1:
	case a[0] == "false" && len(a) == 1:
		code = 1
	case a[0] == "exit" && len(a) == 2:
		n, err := strconv.Atoi(a[1])
		if err != nil {
			return -1, errdefs.Invalidf("exec in %s: exit %q", id, a[1])
		}
		code = n
	case a[0] == "echo":
		out.WriteString(strings.Join(a[1:], " ") + "\n")
	case a[0] == "env" && len(a) == 1:
		for _, kv := range spec.Env {
			out.WriteString(kv + "\n")
		}
	case a[0] == "set" && len(a) == 3:
		r.mu.Lock()
		in.mem[a[1]] = a[2]
		r.mu.Unlock()
	case a[0] == "get" && len(a) == 2:
		r.mu.Lock()
		v, ok := in.mem[a[1]]
		r.mu.Unlock()
		if !ok {
			code = 1
		} else {
			out.WriteString(v + "\n")
		}
	case a[0] == "cat" && len(a) == 1:
		if spec.Stdin != nil {
			if _, err := out.ReadFrom(spec.Stdin); err != nil {
				return -1, fmt.Errorf("exec in %s: stdin: %w", id, err)
			}
		}
	case handler != nil:
		r.mu.Lock()
		mem := maps.Clone(in.mem)
		r.mu.Unlock()
		code, err := handler(ctx, id, mem, spec)
		r.mu.Lock()
		in.mem = mem
		r.mu.Unlock()
		return code, err
	default:
		if spec.Stderr != nil {
			fmt.Fprintf(spec.Stderr, "%s: command not found\n", a[0])
		}
		return 127, nil
	}
	if spec.Stdout != nil {
		if _, err := spec.Stdout.Write(out.Bytes()); err != nil {
			return -1, fmt.Errorf("exec in %s: stdout: %w", id, err)
		}
	}
	return code, nil
}

// setState moves a live instance between running and paused.
func (r *Runtime) setState(op Op, id string, from, to runtime.State) error {
	r.mu.Lock()
	_, err := r.get(id)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	if err := r.enter(op, id); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	in, err := r.get(id)
	if err != nil {
		return err
	}
	if in.state != from {
		return fmt.Errorf("%s instance %s: it is %s: %w", op, id, in.state, errdefs.ErrConflict)
	}
	in.state = to
	return nil
}

// Pause implements runtime.Runtime.
func (r *Runtime) Pause(ctx context.Context, id string) error {
	return r.setState(OpPause, id, runtime.StateRunning, runtime.StatePaused)
}

// Resume implements runtime.Runtime.
func (r *Runtime) Resume(ctx context.Context, id string) error {
	return r.setState(OpResume, id, runtime.StatePaused, runtime.StateRunning)
}

// Kill implements runtime.Runtime.
func (r *Runtime) Kill(ctx context.Context, id string) error {
	r.mu.Lock()
	_, err := r.get(id)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	if err := r.enter(OpKill, id); err != nil {
		return err
	}
	r.mu.Lock()
	_, err = r.get(id)
	r.mu.Unlock()
	if err != nil {
		return err
	}
	r.remove(id)
	return nil
}

func (in *instance) info(id string) runtime.Info {
	return runtime.Info{ID: id, State: in.state, PID: in.pid, Created: in.created}
}

// State implements runtime.Runtime.
func (r *Runtime) State(ctx context.Context, id string) (runtime.Info, error) {
	if err := ids.Validate("instance ID", id); err != nil {
		return runtime.Info{}, err
	}
	if err := r.enter(OpState, id); err != nil {
		return runtime.Info{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	in, err := r.get(id)
	if err != nil {
		return runtime.Info{}, err
	}
	return in.info(id), nil
}

// List implements runtime.Runtime.
func (r *Runtime) List(ctx context.Context) ([]runtime.Info, error) {
	if err := r.enter(OpList, ""); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]runtime.Info, 0, len(r.instances))
	for id, in := range r.instances {
		out = append(out, in.info(id))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Recover implements runtime.Runtime: an instance whose init exited is
// freed and reported as not found.
func (r *Runtime) Recover(ctx context.Context, id string) (runtime.Info, error) {
	if err := ids.Validate("instance ID", id); err != nil {
		return runtime.Info{}, err
	}
	if err := r.enter(OpRecover, id); err != nil {
		return runtime.Info{}, err
	}
	r.mu.Lock()
	in, err := r.get(id)
	if err != nil {
		r.mu.Unlock()
		return runtime.Info{}, err
	}
	info, exited := in.info(id), in.exit != nil
	r.mu.Unlock()
	if exited {
		r.remove(id)
		return runtime.Info{}, fmt.Errorf("instance %s has exited: %w", id, errdefs.ErrNotFound)
	}
	return info, nil
}

// Wait implements runtime.Waiter.
func (r *Runtime) Wait(ctx context.Context, id string) (runtime.Exit, error) {
	r.mu.Lock()
	in, err := r.get(id)
	r.mu.Unlock()
	if err != nil {
		return runtime.Exit{}, err
	}
	select {
	case <-in.done:
	case <-ctx.Done():
		return runtime.Exit{}, ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if in.exit != nil {
		return *in.exit, nil
	}
	// Killed or checkpointed away: the caller asked for it.
	return runtime.Exit{ID: id, Reason: runtime.ExitCrashed, Detail: "killed", At: time.Now()}, nil
}

// Stats implements runtime.StatsReader: the memory is the size of the
// instance's key-value memory; the limits are the spec's.
func (r *Runtime) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, err := r.get(id)
	if err != nil {
		return runtime.Stats{}, err
	}
	var n int64
	for k, v := range in.mem {
		n += int64(len(k) + len(v))
	}
	return runtime.Stats{At: time.Now(), MemoryBytes: n, CPUUsage: in.cpu, MemoryLimit: in.spec.Limits.MemoryMB << 20, DiskLimit: in.spec.Limits.DiskMB << 20}, nil
}

// AddCPU adds d to the CPU time Stats reports for instance id, as if its
// processes had used that much.
func (r *Runtime) AddCPU(id string, d time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, err := r.get(id)
	if err != nil {
		return err
	}
	in.cpu += d
	return nil
}
