// Package nodeapi is the contract between the control plane and a node:
// what control asks of the host that runs sandboxes, in types that carry
// nothing host-side (no engine, runtime, network or snapshot package), so
// the same control code drives an in-process node (`spore up`,
// nodeapi/local) and a remote node agent over Connect-RPC (nodeapi/rpc).
//
// # Who mints IDs
//
// The control plane mints every identifier a call creates (sandbox IDs,
// snapshot IDs, fork children's IDs) and every sandbox's envd access
// token, before it calls, and records them in its store first. A node
// never invents them. That makes the creating calls idempotent: a caller
// that did not get an answer (a timeout, a dropped connection, a crash of
// the caller) repeats the same call with the same IDs and gets the one
// sandbox or snapshot the first attempt made, never a second.
//
// # Idempotency
//
//   - Create with a SandboxID the node already has, asked from the same
//     Template: returns that sandbox as it is now (no second instance). The
//     same ID with another Template is errdefs.ErrAlreadyExists.
//   - Snapshot with a SnapshotID the node already holds, taken of the same
//     sandbox: returns that snapshot. Another sandbox's snapshot under the
//     ID is ErrAlreadyExists.
//   - Fork: a child whose SandboxID already exists (from the same source
//     lineage) is returned as it is; only the missing children are made.
//   - Kill, DeleteSnapshot of something gone: ErrNotFound, which a caller
//     retrying a kill treats as done.
//   - Pause, Resume, Hibernate are not replay-safe by themselves: a replay
//     finds the sandbox already in the target state and gets ErrConflict;
//     the caller reads Get to see where it is.
//
// # Errors
//
// Every error wraps one errdefs kind, which survives the wire (Connect
// codes map to and from the kinds): ErrInvalidArgument (malformed ID or
// request), ErrNotFound (no such sandbox or snapshot), ErrConflict (the
// sandbox's state does not allow the operation, or another operation holds
// it), ErrAlreadyExists (an ID or name taken by something else),
// ErrResourceLimit (the node's admission refused: memory, task table),
// ErrUnavailable (the node or its runtime cannot answer now; retry),
// ErrInternal (a bug or a host failure; the message is for logs only).
// An error of unknown kind from a remote node is ErrUnavailable when the
// call may not have reached it: the caller retries the same idempotent
// call, it never assumes "nothing happened".
package nodeapi

import (
	"context"
	"net/netip"
	"time"
)

// Node is one host that runs sandboxes, as the control plane sees it.
// Every method is safe for concurrent use; operations on one sandbox are
// serialized by the node, and an operation that does not apply in the
// sandbox's current state is ErrConflict.
type Node interface {
	// Info describes the node: identity, capacity, build, what it caches.
	Info(ctx context.Context) (NodeInfo, error)

	// Create restores a new sandbox from a template (name) or a snapshot
	// (ID or name) under req.SandboxID with req.AccessToken. Idempotent by
	// SandboxID (see the package comment).
	Create(ctx context.Context, req CreateRequest) (Sandbox, error)
	// Get returns one sandbox (ErrNotFound when the node has none by id).
	Get(ctx context.Context, id string) (Sandbox, error)
	// List returns every sandbox the node holds, oldest first. Reconcile
	// compares it with the store's rows of this node.
	List(ctx context.Context) ([]Sandbox, error)
	// Kill stops a sandbox and frees everything it holds, its hibernation
	// snapshot included.
	Kill(ctx context.Context, id string) error
	// Pause freezes a running sandbox in memory.
	Pause(ctx context.Context, id string) error
	// Resume continues a paused sandbox or restores a hibernated one and
	// returns it as Get would (its address may be new), saving the caller
	// a second call.
	Resume(ctx context.Context, id string) (Sandbox, error)
	// Hibernate checkpoints a sandbox to the node's disk and frees its
	// memory; Resume brings it back.
	Hibernate(ctx context.Context, id string) error
	// Quiesce readies a hibernation that must not cut requests (a drain's):
	// the node's proxy forwards sandbox id nothing new (new requests get
	// the transition 503, which a replica sends again once the sandbox has
	// moved or woken) and Quiesce waits until the requests it is
	// forwarding there have ended, grace has passed or ctx has ended. It
	// returns how many were still open (0: the hibernation cuts nothing).
	// The mark holds until the sandbox's next Hibernate, Pause, Resume or
	// Kill returns, or a minute after the wait. A node with no proxy of its
	// own in front of its sandboxes (the one-process server's) has nothing
	// in flight to wait for: 0 at once. ErrNotFound for an unknown sandbox.
	Quiesce(ctx context.Context, id string, grace time.Duration) (int, error)
	// DeleteVolume removes a volume's content (its image) from the node,
	// once the volume's record is gone. An unknown volume is not an
	// error; one a sandbox on the node still shows is ErrConflict.
	DeleteVolume(ctx context.Context, volumeID string) error
	// VolumeUsage is a volume's bytes in use and its capacity, as the
	// file system of its image on the node counts them. ErrNotFound when
	// the node holds no image of it.
	VolumeUsage(ctx context.Context, volumeID string) (VolumeUsage, error)
	// Snapshot captures a running or paused sandbox live under
	// req.SnapshotID. Idempotent by SnapshotID.
	Snapshot(ctx context.Context, id string, req SnapshotRequest) (SnapshotInfo, error)
	// Fork captures a sandbox once and restores one child per
	// req.Children entry. The error is for the fork as a whole (the
	// source is missing or in the wrong state); each child's own outcome
	// is in the result. Idempotent by child SandboxID.
	Fork(ctx context.Context, id string, req ForkRequest) (ForkResult, error)
	// Rollback puts a sandbox back to a snapshot in place (same ID, same
	// access token); on failure the sandbox is unchanged.
	Rollback(ctx context.Context, id, snapshotRef string) (Sandbox, error)
	// GetSnapshot returns one snapshot the node holds, by ID or name.
	GetSnapshot(ctx context.Context, ref string) (SnapshotInfo, error)
	// DeleteSnapshot deletes a snapshot or template by ID or name; one in
	// use (a restore reads it, a hibernated sandbox lives in it) is
	// ErrConflict.
	DeleteSnapshot(ctx context.Context, ref string) error
	// Snapshots lists what the node holds: templates, snapshots and
	// hibernations.
	Snapshots(ctx context.Context) ([]SnapshotInfo, error)
	// SetPolicy replaces a sandbox's egress policy.
	SetPolicy(ctx context.Context, id string, p Policy) error
	// Reconfigure gives a running sandbox (a warm-pool one) a new
	// environment for its commands and, when p is set, a new egress
	// policy.
	Reconfigure(ctx context.Context, id string, env []string, p *Policy) (Sandbox, error)
	// Stats reads a running or paused sandbox's resource use from the
	// host side (ErrConflict when it has no instance; ErrUnavailable when
	// the runtime cannot tell).
	Stats(ctx context.Context, id string) (Stats, error)
	// StatsHistory lists the samples of a sandbox's resource use the node
	// keeps (every 5 s, the last hour, in memory: a sandbox's history starts
	// again on another node) taken in [start, end] (a zero bound is open),
	// oldest first. An unknown sandbox is ErrNotFound.
	StatsHistory(ctx context.Context, id string, start, end time.Time) ([]StatsSample, error)
	// Events streams what happens on the node by itself or finishes: a
	// sandbox's instance died, an operation completed. The channel is
	// closed when ctx ends (or the node goes away). Events are hints
	// delivered at most once; a caller that may have missed some (it
	// started late, the stream broke) reconciles with List.
	Events(ctx context.Context) (<-chan Event, error)
	// Upload makes a snapshot the node holds durable in the blob store
	// (idempotent: one already there stores nothing more). A node
	// without a blob store answers ErrConflict.
	Upload(ctx context.Context, ref string) (UploadInfo, error)
	// Adopt takes over a sandbox hibernated on another node (gone, full
	// or drained) from its durable hibernation snapshot: fetched (peers
	// first, then the blob store) and recorded here under the same ID,
	// hibernated; Resume then wakes it. Idempotent for the same snapshot;
	// ErrConflict without a blob store.
	Adopt(ctx context.Context, req AdoptRequest) (Sandbox, error)
	// CollectGarbage deletes the blob store's chunks that no snapshot
	// uses and that are older than the request's grace (safe beside
	// uploads in flight: see package chunk). ErrConflict without a blob
	// store.
	CollectGarbage(ctx context.Context, req GCRequest) (GCReport, error)
	// BuildImage builds template req.Name from an OCI image, pulled by
	// this node from its registry, and returns the template's snapshot
	// info (Kind template) as GetSnapshot would. A template of that name
	// already there is replaced, as Snapshot with Template does. It takes
	// minutes at most (pull, unpack, boot, snapshot): the caller's ctx
	// bounds it. Errors: ErrInvalidArgument for a malformed name, ref or
	// platform, refused credentials (oci.ErrUnauthorized, which stays
	// InvalidArgument over the wire) or a registry over plain HTTP that
	// is not in the node's insecure list; ErrNotFound for an unknown
	// repository, tag, digest or platform; ErrUnavailable for an
	// unreachable or failing registry.
	BuildImage(ctx context.Context, req ImageBuildRequest) (SnapshotInfo, error)
	// Export writes a running sandbox's filesystem as an OCI image: to a
	// registry (req.Ref, pushed with the node's registry rules: plain
	// HTTP only to its insecure registries), into an OCI image layout
	// directory on the node (req.LayoutDir) or as an OCI image layout in
	// one tar into the node's blob store (req.BlobKey). Two layers: the sandbox's
	// root filesystem and what the sandbox changed over it; the config
	// has the sandbox daemon's default user, working directory and
	// environment (without the variables its create added). The sandbox
	// keeps running. Errors: ErrNotFound (no such sandbox), ErrConflict
	// (not running, a node that does not export, or a BlobKey on a node
	// without a blob store),
	// ErrInvalidArgument (malformed request or ref, a registry over plain
	// HTTP not in the insecure list, refused credentials),
	// ErrUnavailable (registry unreachable).
	Export(ctx context.Context, req ExportRequest) (ExportInfo, error)
	// EgressAudit returns sandbox id's outbound connection attempts this
	// node recorded at or after since, oldest first, at most limit (<= 0:
	// the node's maximum; the newest when there are more), whether the
	// sandbox still exists or not: a node keeps them for its retention
	// after their last entry. Errors: ErrInvalidArgument (malformed ID),
	// ErrNotFound (nothing recorded here), ErrConflict (a node that does
	// not audit egress).
	EgressAudit(ctx context.Context, id string, since time.Time, limit int) ([]EgressEntry, error)
	// FileTree lists a running sandbox's filesystem as its daemon sees it
	// now: every entry of the root overlay, parents first, in lexical
	// order, without the files Spore writes per sandbox and what is under
	// /proc, /sys, /dev and the daemon's mount; another filesystem's
	// mount point (a volume) is one entry of type "mount", not entered.
	// At most MaxTreeEntries entries (more is ErrConflict). Errors:
	// ErrInvalidArgument (malformed ID), ErrNotFound, ErrConflict (not
	// running, or a node that does not read sandboxes' files).
	FileTree(ctx context.Context, id string) ([]FileEntry, error)
	// ReadFiles reads regular files of a running sandbox as root, at
	// most MaxReadFiles paths (absolute, clean) a call; a file larger
	// than MaxReadBytes comes back with its size and no data, one that is
	// not there or not a regular file with Missing. Errors as FileTree's,
	// and ErrInvalidArgument for a malformed or too long list of paths.
	ReadFiles(ctx context.Context, id string, paths []string) ([]FileData, error)
}

// Limits of FileTree and ReadFiles.
const (
	MaxTreeEntries = 250_000
	MaxReadFiles   = 256
	MaxReadBytes   = 64 << 10
)

// File types of a FileEntry.
const (
	FileRegular = "file"
	FileDir     = "dir"
	FileSymlink = "symlink"
	FileChar    = "char"
	FileBlock   = "block"
	FileFIFO    = "fifo"
	FileSocket  = "socket"
	FileMount   = "mount" // another filesystem's mount point (not entered)
)

// FileEntry is one entry of a sandbox's filesystem.
type FileEntry struct {
	Path     string // absolute, clean ("/etc/passwd")
	Type     string // FileRegular, FileDir, ...
	Mode     uint32 // permission bits with setuid, setgid, sticky (07777)
	UID, GID uint32
	Size     int64 // regular files only
	Mtime    time.Time
	Link     string // a symlink's target
}

// FileData is a file read from a sandbox.
type FileData struct {
	Path    string
	Size    int64  // the file's size
	Data    []byte // its content; nil when Size > MaxReadBytes or Missing
	Missing bool   // not there, or not a regular file
}

// ExportRequest asks for a sandbox's filesystem as an OCI image.
type ExportRequest struct {
	SandboxID string
	// Ref is "registry/repo:tag" to push to. Exactly one of Ref,
	// LayoutDir and BlobKey.
	Ref                string
	Username, Password string // registry basic auth; both or neither
	// LayoutDir is an absolute directory on the node (absent or empty) to
	// write an OCI image layout into instead: for operators and tests,
	// not for tenants (it writes where it is told on the node).
	LayoutDir string
	// BlobKey is a key of the node's blob store to write the OCI image
	// layout to as one tar (oci-layout, index.json, blobs/sha256/...):
	// how a caller off the node gets a layout. The caller picks the key
	// and deletes the blob when done.
	BlobKey string
}

// ExportInfo describes an exported image.
type ExportInfo struct {
	Ref       string // as pushed ("" for a layout)
	Digest    string // the image manifest's digest
	Layers    int
	Bytes     int64 // compressed bytes of all layers
	DiffBytes int64 // compressed bytes of the sandbox's changes (the top layer)
	Changed   int64 // entries in the top layer
	Deleted   int64 // whiteouts in it
	// LayoutBytes is the size of the layout's tar (BlobKey only).
	LayoutBytes int64
}

// EgressEntry is one outbound connection attempt of a sandbox.
type EgressEntry struct {
	At       time.Time  // the attempt, or the connection's start
	End      *time.Time // when an allowed connection ended (nil: open, or denied)
	Proto    string     // tcp, udp, icmp, ...
	Dst      string     // address:port (the address alone without ports)
	Domain   string     // the TLS SNI or HTTP Host, when the egress proxy saw one
	Allowed  bool
	Rule     string // what decided a denial ("floor", "deny", "internet off") or, through the egress proxy, the rule that decided
	Reason   string
	BytesOut int64 // sandbox -> destination
	BytesIn  int64 // destination -> sandbox
	Open     bool  // still open when read
}

// ImageBuildRequest asks for a template built from an OCI image.
type ImageBuildRequest struct {
	Name string // template name (ids.ValidateName)
	// Ref is "registry/repo:tag" or "registry/repo@sha256:...".
	Ref                string
	Username, Password string // registry basic auth; both or neither
	Platform           string // optional "os/arch[/variant]" (default linux/amd64)
}

// GCRequest asks for a garbage collection of the blob store.
type GCRequest struct {
	Grace  time.Duration // chunks written more recently stay (0: an hour)
	DryRun bool          // report only
}

// GCReport is what a collection freed and kept.
type GCReport struct {
	DeletedChunks int64
	FreedBytes    int64
	KeptChunks    int64 // named by a snapshot, or young
	YoungChunks   int64 // unnamed but within the grace period
	Manifests     int64 // snapshots in the store
}

// AdoptRequest names a hibernated sandbox to take over.
type AdoptRequest struct {
	SandboxID   string
	Hibernation string // its hibernation snapshot (durable)
	Policy      *Policy
	Peers       []string // nodes (host:port) that may hold its chunks
}

// UploadInfo describes an upload.
type UploadInfo struct {
	TotalBytes  int64 // the snapshot's bytes
	StoredBytes int64 // compressed bytes this upload added (the rest was stored already)
}

// Sandbox states a node reports. The stable ones are below; while an
// operation runs the node shows it ("creating", "snapshotting",
// "forking", "rolling_back", "hibernating", "resuming", "killing").
const (
	StateRunning    = "running"
	StatePaused     = "paused"
	StateHibernated = "hibernated"
	// StateDead: the instance died on its own; Death says why. Only Kill
	// applies.
	StateDead = "dead"
)

// The templates every node builds itself: they have no store row, and a
// create names them to the node as they are.
const (
	TemplateBase            = "base"
	TemplateCodeInterpreter = "code-interpreter-v1"
)

// BuiltinTemplate reports whether name is a template every node builds.
func BuiltinTemplate(name string) bool {
	return name == TemplateBase || name == TemplateCodeInterpreter
}

// Snapshot kinds.
const (
	KindTemplate    = "template"
	KindSnapshot    = "snapshot"
	KindHibernation = "hibernation"
)

// Event kinds.
const (
	EventDied   = "died"    // a sandbox's instance ended by itself
	EventOpDone = "op-done" // an operation on a sandbox finished
	// EventHibernated: the node hibernated a sandbox on its own (Reason
	// "memory-pressure": its memory fell under the floor); Get gives its
	// hibernation snapshot, and Resume brings it back.
	EventHibernated = "hibernated"
)

// Resources is an amount of node capacity.
type Resources struct {
	MemoryMB  int64
	VCPUs     float64
	Sandboxes int
}

// Overcommit is how many times its real memory and CPUs a node lets
// placement promise to sandboxes' limits (0 reads as 1: none).
type Overcommit struct {
	Memory float64 `json:"memory"`
	VCPUs  float64 `json:"vcpus"`
}

// NodeInfo describes a node.
type NodeInfo struct {
	ID   string
	Addr string // where the control plane reaches the node ("" in process)
	// Capacity is the host's real memory and CPUs (and sandbox slots);
	// Reserved is what its admission keeps for the host (sandboxes may not
	// use it); Overcommit is the operator's ratio of sandbox limits to
	// capacity placement may promise (a limit is a cap, not a reservation).
	Capacity, Reserved Resources
	Overcommit         Overcommit
	RunscBuild         string   // runtime build: snapshots restore only on the same
	CPUFeatures        []string // host CPU flags a checkpoint may depend on
	Labels             map[string]string
	Templates          []string // names of the templates it holds
	// Durable: the node has a blob store; its snapshots can be uploaded,
	// and it fetches the durable snapshots it does not hold.
	Durable bool
	// MemoryFreeMB is the memory the host really has for new sandboxes
	// now: its MemAvailable less its memory floor and what its admissions
	// hold for launches in flight (negative under the floor). nil: the
	// node admits by nothing (no floor) or could not read it. Placement
	// binds on it beside the limits (scheduler.NodeView.MemoryFree).
	MemoryFreeMB *int64
	// LaunchesQueued is how many launches (boots and restores) wait for
	// one of the node's launch slots now (engine.LaunchLoad): a node with
	// a queue is busy with a burst, and placement sends other work to a
	// node without one while one fits (scheduler.NodeView.Busy).
	LaunchesQueued int
}

// Limits are a sandbox's resource limits.
type Limits struct {
	VCPUs    float64
	MemoryMB int64
	DiskMB   int64
	MaxProcs int64
}

// Policy is a sandbox's egress policy: Internet says whether the public
// internet is reachable at all; Allow entries are reachable even when it
// is not, Deny entries are not even when it is (IPv4 or IPv6 prefixes);
// an allow entry wins over a deny entry. AllowDomains and DenyDomains are
// domain entries (egress.ParseDomain's form: "api.example.com",
// "*.example.com"), judged on the TLS SNI (port 443) and HTTP Host (port
// 80) by the node's egress proxy; they share the lists' MaxPolicyEntries.
type Policy struct {
	Internet     bool
	Allow        []netip.Prefix
	Deny         []netip.Prefix
	AllowDomains []string
	DenyDomains  []string
	// Inject sets headers on the sandbox's HTTPS requests to matching
	// names (E2B's network rules, values resolved: secrets included),
	// the node's egress proxy terminating their TLS with a certificate
	// signed by CA, which the sandbox's trust store gets. The node keeps
	// both in memory only and never returns them (Get's Policy has
	// neither).
	Inject []Injection
	CA     *CA
}

// Injection is the headers set on HTTPS requests to the names Pattern
// matches ("api.example.com", "*.example.com").
type Injection struct {
	Pattern string
	Headers []Header
}

// Header is one injected header.
type Header struct{ Name, Value string }

// CA is a sandbox's egress certificate authority, PEM encoded.
type CA struct{ CertPEM, KeyPEM []byte }

// MaxPolicyEntries bounds Allow and Deny (each entry is a rule in the
// sandbox's gateway).
const MaxPolicyEntries = 256

// Death says why a sandbox's instance died on its own.
type Death struct {
	Reason string // "oom" or "crashed"
	Detail string
	At     time.Time
}

// Sandbox is a sandbox as its node holds it.
type Sandbox struct {
	ID       string
	State    string
	Template string // template name (or the snapshot ID it was created from)
	Parent   string // snapshot last restored into it
	// Addr is where the node reaches the sandbox's ports: an address the
	// node's side of the proxy dials (an IP on the node; "" while
	// hibernated or dead). Opaque to the store.
	Addr        string
	AccessToken string // envd's access token (minted by the control plane)
	Limits      Limits
	Policy      Policy
	Env         []string // environment added for its commands
	CreatedAt   time.Time
	Death       *Death // set when State is dead
	// Hibernation is the snapshot holding it while hibernated ("" else).
	Hibernation string
	// RulesLoaded: the node holds the sandbox's network rules (Inject,
	// CA) in memory; false after a restart of the node's process forgot
	// them, until the control plane sets its policy again.
	RulesLoaded bool
}

// CreateRequest asks for a new sandbox.
type CreateRequest struct {
	SandboxID   string // minted by the control plane (ids.Validate)
	AccessToken string // minted by the control plane; "" is refused
	// Template is a template name or a snapshot's ID or name.
	Template string
	Env      []string // added to the sandbox's default environment
	// VCPUs and MemoryMB, when set, override the template's limits.
	VCPUs    float64
	MemoryMB int64
	Policy   *Policy // nil: internet allowed
	// Peers are nodes (host:port) that may hold the chunks of a durable
	// snapshot this node does not have; it asks them before the store.
	Peers []string
	// Volumes are shown in the sandbox, each at its path (at most
	// MaxVolumeMounts; a snapshot's own volumes come with it).
	Volumes []VolumeMount
}

// MaxVolumeMounts is how many volumes a sandbox mounts at most: the
// volume slots every template has.
const MaxVolumeMounts = 4

// VolumeMount is a volume to show in a new sandbox. The node makes the
// volume's image (SizeBytes, its quota) the first time one mounts it.
type VolumeMount struct {
	VolumeID  string
	SizeBytes int64
	Path      string
	ReadOnly  bool
	// Exclusive: the volume's content is captured with the sandbox's
	// snapshots (when mounted read-write).
	Exclusive bool
}

// VolumeUsage is a volume's bytes in use and its capacity on its node.
type VolumeUsage struct {
	UsedBytes     int64 `json:"usedBytes"`
	CapacityBytes int64 `json:"capacityBytes"`
}

// SnapshotRequest asks for a live snapshot.
type SnapshotRequest struct {
	SnapshotID string // minted by the control plane
	Names      []string
	// Template makes it a template: it takes its name over from an older
	// template of that name, which is then deleted.
	Template bool
}

// SnapshotInfo describes a snapshot the node holds.
type SnapshotInfo struct {
	ID        string
	Names     []string
	Kind      string // KindTemplate, KindSnapshot, KindHibernation
	Template  string // template the lineage started from
	Origin    string // sandbox it was taken of
	Parent    string // snapshot that sandbox was restored from
	CreatedAt time.Time
	SizeBytes int64
	Limits    Limits
	// Copy: fetched from the blob store, not taken here (the catalog row
	// names the node that took it).
	Copy bool
}

// ForkChildSpec names one child to make.
type ForkChildSpec struct {
	SandboxID   string
	AccessToken string
}

// ForkRequest asks for children of a sandbox.
type ForkRequest struct {
	Children []ForkChildSpec // 1..MaxFork
	// Concurrency bounds the restores running at once (0: the node's
	// default).
	Concurrency int
}

// MaxFork is the most children one fork makes.
const MaxFork = 100

// ForkChild is one child's outcome: a sandbox, or an error (one errdefs
// kind) after which nothing of that child is left on the node.
type ForkChild struct {
	Sandbox Sandbox
	Err     error
}

// ForkResult reports a fork, one entry per requested child, in order.
type ForkResult struct {
	Children []ForkChild
}

// Stats is one sample of a sandbox's resource use, read on the host.
type Stats struct {
	At          time.Time
	CPUUsage    time.Duration // CPU time used since the instance started
	MemoryBytes int64
	MemoryLimit int64 // 0: none
	DiskBytes   int64
	DiskLimit   int64 // 0: none
}

// StatsSample is one sample of a sandbox's resource use over the few
// seconds before At.
type StatsSample struct {
	At          time.Time
	CPUPct      float64 // of its vCPUs, 0-100
	VCPUs       float64
	MemoryBytes int64
	MemoryLimit int64 // 0: none
	DiskBytes   int64
}

// Event is something that happened on a node.
type Event struct {
	Kind      string // EventDied, EventOpDone, EventHibernated
	SandboxID string
	Op        string // EventOpDone: "create", "snapshot", "fork", ...
	Reason    string // EventDied: "oom" or "crashed"; EventHibernated: "memory-pressure"
	Detail    string
	Err       string // EventOpDone: the operation's error, "" on success
	At        time.Time
}

// MaxQuiesceGrace bounds a Quiesce's wait (a drain's DrainGrace).
const MaxQuiesceGrace = 10 * time.Minute
