// Package runtime defines the contract between the Spore engine and the
// sandbox runtime that runs its sandboxes (gVisor's runsc today; a microVM
// driver on hosts with hardware virtualization could join later).
//
// A runtime manages instances. An instance is one running (or paused) copy of
// a sandbox, named by an instance ID the engine picks. The engine maps its
// sandbox IDs to instances, which is how a rollback or a resume from
// hibernation keeps a sandbox's ID while the instance underneath changes.
//
// Every method takes a context; implementations bound each call with a
// deadline and wrap errors with an errdefs kind and the instance ID.
package runtime

import (
	"context"
	"io"
	"time"
)

// Limits are the resources an instance may use. Zero means "no limit".
type Limits struct {
	VCPUs    float64 `json:"vcpus,omitempty"`     // CPU time, in cores
	MemoryMB int64   `json:"memory_mb,omitempty"` // memory, including the sandbox kernel
	MaxProcs int64   `json:"max_procs,omitempty"` // host tasks (threads) of the instance
	DiskMB   int64   `json:"disk_mb,omitempty"`   // size of the writable root overlay
	// ShmMB is the size of /dev/shm, a tmpfs held in the sandbox's memory
	// (0: no size option, as in images taken before it existed; a restore
	// must be given the value its image was taken with, since the mount
	// options must match).
	ShmMB int64 `json:"shm_mb,omitempty"`
}

// User is the identity a process runs as inside the sandbox.
type User struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// Spec describes how to start (or restore) an instance.
type Spec struct {
	ID       string   // instance ID
	RootFS   string   // absolute path of the read-only lower root filesystem
	Args     []string // start command (the instance's init)
	Env      []string // KEY=VALUE
	Cwd      string
	User     User
	Hostname string
	Limits   Limits
	// NetNS is the path of the network namespace the instance joins, or ""
	// for no network at all.
	NetNS string
	// Mounts are host directories bound into the instance (read-only when
	// asked). A restore must be given the same mounts as the checkpoint.
	Mounts []Mount
	// MemoryAlertSignal ("USR1" or "USR2"; "" for none) is sent to the
	// init when the instance's memory crosses a share of its limit, by
	// runtimes that can see that cheaply (gVisor on v1 memory cgroups).
	// Only for inits that handle it: the default action ends the instance.
	MemoryAlertSignal string
	// Build is the build of the runtime the instance runs with (see
	// Builds): "" for the runtime's current one. A restore must name the
	// build its image was written with; the instance keeps its build for
	// every later call (exec, checkpoint, kill).
	Build string
}

// Mount binds a host directory into an instance.
type Mount struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
	ReadOnly    bool   `json:"read_only,omitempty"`
}

// State of an instance.
type State string

const (
	StateRunning State = "running"
	StatePaused  State = "paused"
	StateStopped State = "stopped" // init exited; the instance still holds resources until Kill
)

// Info describes one instance.
type Info struct {
	ID      string
	State   State
	PID     int // host PID of the sandbox process
	Created time.Time
}

// CheckpointOptions tune Checkpoint.
type CheckpointOptions struct {
	// LeaveRunning keeps the instance running after the image is written;
	// otherwise the instance is stopped and removed.
	LeaveRunning bool
}

// ExecSpec describes a command run inside a running instance.
type ExecSpec struct {
	Args   []string
	Env    []string
	Cwd    string
	User   User
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Capabilities says which optional features a runtime has.
type Capabilities struct {
	LiveCheckpoint bool // Checkpoint with LeaveRunning
	Pause          bool // Pause and Resume
	DiskLimit      bool // Limits.DiskMB is enforced
}

// Runtime runs sandbox instances.
type Runtime interface {
	// Name identifies the runtime and its version ("gvisor/<version>"),
	// recorded in snapshots so an image is only restored by a runtime that
	// can read it.
	Name() string
	Capabilities() Capabilities

	// Start boots a new instance from spec.RootFS with spec.Args as init.
	Start(ctx context.Context, spec Spec) error
	// Restore starts a new instance from a checkpoint image. spec.ID must be
	// new, or an instance pre-created with the same spec (see Precreator);
	// spec.RootFS must be the root filesystem the image was taken from.
	Restore(ctx context.Context, spec Spec, imageDir string) error
	// Checkpoint writes the instance's whole state (processes, memory, root
	// overlay) into imageDir, which must exist and be empty.
	Checkpoint(ctx context.Context, id, imageDir string, opts CheckpointOptions) error
	// Exec runs a command in the instance and returns its exit code.
	Exec(ctx context.Context, id string, spec ExecSpec) (int, error)
	Pause(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Kill stops the instance and frees everything it holds. Killing an
	// instance that does not exist returns an errdefs.ErrNotFound error.
	Kill(ctx context.Context, id string) error
	// State reports one instance.
	State(ctx context.Context, id string) (Info, error)
	// List reports every instance this runtime holds, including ones
	// started before the calling process (re)started.
	List(ctx context.Context) ([]Info, error)
	// Recover re-attaches to an instance that survived a restart of the
	// calling process, returning its state. An instance whose init has
	// exited is freed and reported as not found.
	Recover(ctx context.Context, id string) (Info, error)
}

// Precreator is an optional capability: booting an instance ahead of
// time, up to where it only waits for an image, so that a Restore into it
// later pays only the image's load.
type Precreator interface {
	// Precreate boots instance spec.ID with nothing running in it. A
	// Restore with the same spec (ID included) loads an image into it,
	// once; Env and Hostname may differ, since a restore does not use
	// them (the image's processes keep theirs; see RestoreShape). A
	// Restore with another spec for that ID is an errdefs.ErrConflict
	// error and leaves it as it was; Kill frees it.
	// Until restored, State reports it running and List includes it.
	Precreate(ctx context.Context, spec Spec) error
}

// RestoreShape is what of a spec a restore into a pre-created instance
// must match: all of it but the instance's ID and network namespace (which
// are the instance's own), and its Env and Hostname, which only a boot
// uses (runsc's restore does not check them either). The Build is part of
// it: an image restores only into an instance of the build that wrote it.
func RestoreShape(spec Spec) Spec {
	spec.ID, spec.NetNS, spec.Env, spec.Hostname = "", "", nil, ""
	return spec
}

// ExitReason says why an instance ended without being asked to.
type ExitReason string

const (
	// ExitOOM: the host's memory limit of the instance killed it.
	ExitOOM ExitReason = "oom"
	// ExitCrashed: the instance ended for another reason (its sandbox
	// kernel crashed or was killed from outside).
	ExitCrashed ExitReason = "crashed"
)

// Exit describes how an instance ended.
type Exit struct {
	ID     string
	Reason ExitReason
	// Detail is a human-readable explanation ("the sandbox kernel (pid
	// 1234) was killed by the memory cgroup's OOM killer").
	Detail string
	At     time.Time
}

// Builds is an optional capability: a runtime that keeps, besides the
// build it runs new instances with, the builds older images were written
// with, each named by the identity of its content, so that an upgrade of
// the runtime strands no image (a checkpoint image is only read by the
// build that wrote it). Spec.Build picks one; "" is Build().
type Builds interface {
	// Build is the build new instances run with.
	Build() string
	// HasBuild reports whether the runtime holds build (an
	// errdefs.ErrNotFound error when it does not), and its Name.
	HasBuild(build string) (name string, err error)
	// KeptBuilds lists the builds the runtime holds, Build() included.
	KeptBuilds() ([]string, error)
	// RemoveBuild forgets a build nothing needs any more. The current
	// build, and one an instance runs with, is refused (ErrConflict).
	RemoveBuild(ctx context.Context, build string) error
}

// Waiter is an optional capability: learning that an instance has died
// without waiting for someone to use it.
type Waiter interface {
	// Wait blocks until the instance's processes are gone, whatever the
	// cause (including Kill and Checkpoint without LeaveRunning: the
	// caller tells those apart), or until ctx ends (then ctx's error). An
	// instance that does not exist is an errdefs.ErrNotFound error.
	Wait(ctx context.Context, id string) (Exit, error)
}

// Stats are an instance's resource use, read from the host side (never by
// running anything inside the instance).
type Stats struct {
	At          time.Time
	CPUUsage    time.Duration // CPU time used since the instance started
	MemoryBytes int64         // memory charged to the instance (sandbox kernel included)
	MemoryLimit int64         // 0: none
	DiskBytes   int64         // space the writable layer holds
	DiskLimit   int64         // 0: none
}

// StatsReader is an optional capability: reading an instance's resource
// use from the host, bounded in time and size.
type StatsReader interface {
	Stats(ctx context.Context, id string) (Stats, error)
}
