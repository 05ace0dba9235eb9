// Package store is the control plane's metadata contract and the fleet's
// source of truth: sandboxes (with their node and a version for
// compare-and-swap), snapshots, templates, template builds (with their
// logs) and tags, nodes, leases and API keys.
// SQLite (store/sqlite) backs one machine (`spore up`); PostgreSQL
// (store/postgres) backs a fleet of API replicas. Both are held to the
// same contract by the conformance suite in store/storetest.
package store

import (
	"context"
	"time"
)

// Sandbox states as the API shows them.
const (
	StateRunning    = "running"
	StatePaused     = "paused"     // frozen in memory
	StateHibernated = "hibernated" // checkpointed to disk; the API shows it as "paused"
	StateError      = "error"      // died on its own (Reason says why); only kill applies
	// StateCreating: the control plane wrote the row (ID and token
	// minted) before asking the node; it becomes running when the node
	// answers, or goes (the node's sandbox killed by its ID) when the
	// create failed or was abandoned.
	StateCreating = "creating"
	// StatePooled: a warm-pool sandbox restored ahead of time (ID, token,
	// node and address set), not yet anyone's. Never listed to users nor
	// reaped by timeouts; a create claims it by CompareAndSwapSandbox
	// (to creating), so exactly one create gets it.
	StatePooled = "pooled"
)

// NetworkRule is one of E2B's transform rules for a domain: the headers
// set (added or replacing) on matching requests.
type NetworkRule struct {
	Headers map[string]string `json:"headers,omitempty"`
}

// Sandbox is the control plane's record of a sandbox.
type Sandbox struct {
	ID string `json:"id"`
	// TeamID is the team that owns it ("" while it is pooled: nobody's
	// until a create claims it for its team).
	TeamID     string `json:"teamID,omitempty"`
	TemplateID string `json:"templateID"` // as asked: a template name or a snapshot ID
	// ForkedFrom is the sandbox a fork child was forked from (its
	// lineage; "" for any other sandbox).
	ForkedFrom string            `json:"forkedFrom,omitempty"`
	Alias      string            `json:"alias,omitempty"`
	State      string            `json:"state"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"envVars,omitempty"`
	CPUCount   int               `json:"cpuCount"`
	MemoryMB   int               `json:"memoryMB"`
	DiskSizeMB int               `json:"diskSizeMB"`
	StartedAt  time.Time         `json:"startedAt"`
	EndAt      time.Time         `json:"endAt"` // when the timeout acts
	AutoPause  bool              `json:"autoPause"`
	// AutoResume: traffic to it while paused or hibernated resumes it
	// (E2B's lifecycle autoResume; only with AutoPause).
	AutoResume    bool `json:"autoResume,omitempty"`
	AllowInternet bool `json:"allowInternet"`
	// PrivateTraffic: its ports (but envd's) take only requests with its
	// traffic access token (E2B's allowPublicTraffic false).
	PrivateTraffic bool     `json:"privateTraffic,omitempty"`
	AllowOut       []string `json:"allowOut,omitempty"`
	DenyOut        []string `json:"denyOut,omitempty"`
	// NetworkRules are E2B's per-domain transforms of outbound HTTPS
	// requests, as given: header values hold ${e2b.secrets.NAME}
	// placeholders, never secret values.
	NetworkRules map[string][]NetworkRule `json:"networkRules,omitempty"`
	// EgressCA is the sandbox's egress CA (certificate and key, PEM),
	// sealed by the control plane (secrets key); forks share it, as they
	// share the trust store that holds its certificate.
	EgressCA []byte `json:"egressCA,omitempty"`
	NodeID   string `json:"nodeID"`
	// Addr is where the node reaches the sandbox (opaque to the store).
	Addr string `json:"addr,omitempty"`
	// EnvdAccessToken is minted by the control plane; GET answers it
	// from here, not from the node.
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
	// Version is set to 1 by CreateSandbox and incremented by every
	// successful UpdateSandbox and CompareAndSwapSandbox; the value a
	// caller sets is ignored except as CompareAndSwapSandbox's expectation.
	Version int64 `json:"version"`
	// Reason says why a sandbox in state error died: "oom" (its memory
	// limit) or "crashed"; ReasonDetail explains it in words.
	Reason       string `json:"reason,omitempty"`
	ReasonDetail string `json:"reasonDetail,omitempty"`
	// Hibernation is the snapshot holding a hibernated sandbox (on its
	// node); HibernationDurable says it is in the blob store too, so the
	// sandbox can resume on another node.
	Hibernation        string `json:"hibernation,omitempty"`
	HibernationDurable bool   `json:"hibernationDurable,omitempty"`
	// HibernatingAt is the reaper's claim: set (to when it was taken) by
	// a compare-and-swap at the version the reaper judged expired, before
	// it hibernates the sandbox, and cleared when the hibernation is
	// recorded or has failed. While it is set no connect answers
	// "running": it waits and then resumes the sandbox.
	HibernatingAt time.Time `json:"hibernatingAt,omitzero"`
	// VolumeMounts are the volumes it shows (its snapshots and fork
	// children show the same ones).
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
}

// VolumeMount is a volume a sandbox shows at Path.
type VolumeMount struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	// Exclusive: the volume's content is captured with the sandbox's
	// snapshots when mounted read-write; a sandbox restored from one of
	// them (a fork child, a create from it) gets a volume of its own.
	Exclusive bool  `json:"exclusive,omitempty"`
	SizeBytes int64 `json:"sizeBytes,omitempty"` // the volume's quota, for such copies
}

// Snapshot is the control plane's record of a snapshot.
type Snapshot struct {
	ID     string `json:"id"`
	TeamID string `json:"teamID,omitempty"` // the team that owns it
	// Names are unique within its team.
	Names     []string  `json:"names,omitempty"`
	SandboxID string    `json:"sandboxID,omitempty"` // the sandbox it was taken of
	Kind      string    `json:"kind"`
	CreatedAt time.Time `json:"createdAt"`
	SizeBytes int64     `json:"sizeBytes"`
	NodeID    string    `json:"nodeID,omitempty"`  // the node that holds it
	Storage   string    `json:"storage,omitempty"` // StorageLocal ("" too), StorageUploading or StorageDurable
	// StoredBytes is what its upload added to the blob store (compressed
	// chunks no earlier snapshot had); the rest was shared.
	StoredBytes int64 `json:"storedBytes,omitempty"`
	// RunscBuild and CPUFeatures are those of the node that took it: a
	// node restores it only with the same build and all those features.
	RunscBuild  string   `json:"runscBuild,omitempty"`
	CPUFeatures []string `json:"cpuFeatures,omitempty"`
	// Copies are other nodes known to hold a copy (fetched for a create,
	// rollback or fork): placement prefers them.
	Copies   []string `json:"copies,omitempty"`
	Template string   `json:"template,omitempty"` // the template it belongs to, if any
	// VolumeMounts are its sandbox's volumes: a sandbox made from it
	// mounts the same ones (a snapshot records the mount, not the content).
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
}

// Snapshot kinds the store tells apart (those of internal/snapshot): a
// user's snapshot counts against its team's SnapshotBytes quota when
// written; a hibernation is counted but never refused.
const (
	SnapshotKindUser        = "snapshot"
	SnapshotKindHibernation = "hibernation"
)

// Where a snapshot's bytes are.
const (
	StorageLocal     = "local"     // only on NodeID's disk ("" means the same)
	StorageUploading = "uploading" // being copied to shared storage
	StorageDurable   = "durable"   // in shared storage: any node can use it
)

// Template is a named, buildable sandbox image: the snapshot it starts
// from, its build spec and the nodes that hold a copy.
type Template struct {
	// Name is its key (TemplateKey): the default team's name, another
	// team's "<name>.<teamID>"; nodes know it by this.
	Name string `json:"name"`
	// TeamID is the team that made it ("" in rows from before teams: the
	// default team's). Names are per team (TemplateName); another team
	// sees it only when it is public (docs/teams.md).
	TeamID     string   `json:"teamID,omitempty"`
	SnapshotID string   `json:"snapshotID,omitempty"`
	Spec       []byte   `json:"spec,omitempty"`    // opaque JSON
	NodeIDs    []string `json:"nodeIDs,omitempty"` // the node that made it first, then nodes holding a copy
	// Storage, RunscBuild, CPUFeatures: as for a Snapshot (a template made
	// from a sandbox is a snapshot that takes over a name).
	Storage     string    `json:"storage,omitempty"`
	RunscBuild  string    `json:"runscBuild,omitempty"`
	CPUFeatures []string  `json:"cpuFeatures,omitempty"`
	CreatedAt   time.Time `json:"createdAt"` // kept from the first PutTemplate
	UpdatedAt   time.Time `json:"updatedAt"` // set by the store on every write
}

// Node states.
const (
	NodeReady   = "ready"
	NodeJoining = "joining" // registered; its sandboxes are being reconciled
	NodeLost    = "lost"    // stopped answering
	NodeLeft    = "left"    // left on purpose
)

// Resources is an amount of node capacity.
type Resources struct {
	MemoryMB  int64   `json:"memoryMB"`
	VCPUs     float64 `json:"vcpus"`
	Sandboxes int     `json:"sandboxes"`
}

// Overcommit is a node's ratio of sandbox limits to capacity, per
// dimension.
type Overcommit struct {
	Memory float64 `json:"memory"`
	VCPUs  float64 `json:"vcpus"`
}

// Node is a node agent as the fleet knows it.
type Node struct {
	ID       string            `json:"id"`
	Addr     string            `json:"addr"`
	Labels   map[string]string `json:"labels,omitempty"`
	Capacity Resources         `json:"capacity"`
	Reserved Resources         `json:"reserved"` // the node's admission reserve
	// Overcommit is the node's ratio of sandbox limits to Capacity that
	// placement may promise (0, in rows from before it, reads as 1: their
	// capacity was advertised already multiplied).
	Overcommit  Overcommit `json:"overcommit"`
	RunscBuild  string     `json:"runscBuild,omitempty"`
	CPUFeatures []string   `json:"cpuFeatures,omitempty"`
	// Durable: the node has a blob store (it uploads its snapshots, fetches
	// others', and serves its own to peers).
	Durable bool `json:"durable,omitempty"`
	// MemoryFreeMB is the memory the host really had for new sandboxes
	// at its last heartbeat (nodeapi.NodeInfo.MemoryFreeMB; nil: none
	// reported).
	MemoryFreeMB *int64 `json:"memoryFreeMB,omitempty"`
	// LaunchesQueued is how many launches waited for a launch slot on the
	// node at its last heartbeat (nodeapi.NodeInfo.LaunchesQueued).
	LaunchesQueued int       `json:"launchesQueued,omitempty"`
	Heartbeat      time.Time `json:"heartbeat"`
	// Draining is an operator's decision: UpsertNode (a node registering
	// or heart-beating) keeps the stored value; only UpdateNode changes it.
	Draining bool      `json:"draining"`
	State    string    `json:"state"`
	JoinedAt time.Time `json:"joinedAt"` // kept from the first UpsertNode
}

// APIKey is a stored API key: only its hash is kept.
type APIKey struct {
	ID   string `json:"id"`
	Hash string `json:"hash"` // hex sha256 of the key
	// Name is the operator's label for the key (not unique).
	Name string `json:"name"`
	// TeamID is the team the key acts for; "" for an operator key, which
	// belongs to no team.
	TeamID string `json:"teamID,omitempty"`
	// Role is what the key may do: RoleOperator (the operator routes,
	// teams and every team's keys), RoleAdmin (everything in its team,
	// its keys too) or RoleMember (everything in its team but its keys).
	Role string `json:"role"`
	// Scope, when set, narrows a team key further: the operations it may
	// call and the templates it may create from.
	Scope *KeyScope `json:"scope,omitempty"`
	// Source says where the key came from: SourceConfig (the deployment's
	// configured key, --api-key-file: a newer one revokes the older),
	// SourceGenerated (made by `spore up`), SourceAPI (POST /api-keys).
	Source string `json:"source"`
	// Mask shows the key's first and last characters, never enough to
	// use it ("spore_3f2a…91c0").
	Mask      string    `json:"mask"`
	CreatedAt time.Time `json:"createdAt"`
	// ExpiresAt, when set, is when the key stops being valid.
	ExpiresAt time.Time `json:"expiresAt,omitzero"`
	// LastUsedAt is when the key last authenticated a request, to the
	// minute (store.APIKeys.TouchAPIKey; zero: never).
	LastUsedAt time.Time `json:"lastUsedAt,omitzero"`
	// RevokedAt is when the key was revoked; zero while it is valid. A
	// revoked key stays listed (who had access, and until when) and is
	// never valid again.
	RevokedAt time.Time `json:"revokedAt,omitzero"`
}

// KeyScope narrows what a team key may do. Operations are the API's
// operation names ("sandboxes.create", "sandboxes.read"...: see the
// api package's route table); Templates are patterns (path.Match: "ci-*")
// of the templates and snapshots a create may start from. An empty list
// allows nothing of its kind.
type KeyScope struct {
	Operations []string `json:"operations"`
	Templates  []string `json:"templates"`
}

// API key roles.
const (
	RoleOperator = "operator"
	RoleAdmin    = "admin"
	RoleMember   = "member"
)

// API key sources.
const (
	SourceConfig    = "config"
	SourceGenerated = "generated"
	SourceAPI       = "api"
)

// ValidRole reports whether r is a role a key can have.
func ValidRole(r string) bool { return r == RoleOperator || r == RoleAdmin || r == RoleMember }

// Revoked reports whether the key was revoked.
func (k APIKey) Revoked() bool { return !k.RevokedAt.IsZero() }

// Expired reports whether the key has expired at now.
func (k APIKey) Expired(now time.Time) bool { return !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt) }

// SandboxFilter selects sandboxes. Metadata matches every pair given.
type SandboxFilter struct {
	TeamID   string // "": every team
	States   []string
	Metadata map[string]string
	Template string
	NodeID   string // "": every node
	Limit    int    // 0: no limit
	Cursor   string // from a previous page; "" starts at the beginning
}

// SnapshotFilter selects snapshots.
type SnapshotFilter struct {
	TeamID    string // "": every team
	SandboxID string
	Name      string // within TeamID (with TeamID "": matches nothing)
	Limit     int
	Cursor    string
}

// Store is the metadata contract. Errors are errdefs kinds: ErrNotFound,
// ErrAlreadyExists, ErrConflict (a compare-and-swap lost), and
// ErrInvalidArgument (a malformed cursor). Every method is safe to call
// concurrently, also from several processes on one database.
type Store interface {
	Sandboxes
	Snapshots
	Templates
	Refs
	Nodes
	Leases
	APIKeys
	Builds
	Secrets
	Volumes
	Teams
	Audits
	TeamMetrics
	Close() error
}

// Sandboxes are the sandbox records.
type Sandboxes interface {
	// CreateSandbox stores a new sandbox with Version 1.
	CreateSandbox(ctx context.Context, s Sandbox) error
	GetSandbox(ctx context.Context, id string) (Sandbox, error)
	// UpdateSandbox reads, changes with fn and writes a sandbox in one
	// transaction (concurrent updates, also from other processes, are
	// serialized, none lost) and increments its Version; an error from
	// fn aborts it.
	UpdateSandbox(ctx context.Context, id string, fn func(*Sandbox) error) (Sandbox, error)
	// CompareAndSwapSandbox writes s only if the stored Version equals
	// s.Version, and returns the stored row (Version incremented). A
	// different stored Version is ErrConflict; a missing one ErrNotFound.
	CompareAndSwapSandbox(ctx context.Context, s Sandbox) (Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error
	// DeleteSandboxIf deletes the sandbox only if its stored Version is
	// version: whoever changed it since (a connect extending its timeout)
	// wins. A different Version is ErrConflict; a missing row ErrNotFound.
	DeleteSandboxIf(ctx context.Context, id string, version int64) error
	// ListSandboxes returns a page, oldest first, and the cursor of the
	// next page ("" when it is the last).
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, string, error)
	// Expired returns the sandboxes in the given states whose EndAt is
	// not after now.
	Expired(ctx context.Context, now time.Time, states ...string) ([]Sandbox, error)
}

// Snapshots is the snapshot catalog.
type Snapshots interface {
	// PutSnapshot inserts or replaces a snapshot, names included; a name
	// another snapshot holds is ErrAlreadyExists.
	PutSnapshot(ctx context.Context, s Snapshot) error
	// CreateSnapshot inserts a snapshot only if no row has its ID
	// (ErrAlreadyExists otherwise, and for a name another holds).
	CreateSnapshot(ctx context.Context, s Snapshot) error
	GetSnapshot(ctx context.Context, id string) (Snapshot, error)
	// UpdateSnapshot reads, changes with fn and writes a snapshot in one
	// transaction: concurrent updates are serialized, none lost, and a row
	// deleted meanwhile is ErrNotFound, never written back. An error from
	// fn aborts it. The ID and the names are kept (PutSnapshot renames).
	UpdateSnapshot(ctx context.Context, id string, fn func(*Snapshot) error) (Snapshot, error)
	ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, string, error)
	DeleteSnapshot(ctx context.Context, id string) error
}

// Templates are the named templates.
type Templates interface {
	// PutTemplate inserts or replaces a template (CreatedAt kept from the
	// first put; zero there means now) and returns the stored row.
	PutTemplate(ctx context.Context, t Template) (Template, error)
	GetTemplate(ctx context.Context, name string) (Template, error)
	// ListTemplates returns every template by name.
	ListTemplates(ctx context.Context) ([]Template, error)
	// UpdateTemplate is read-change-write in one transaction.
	UpdateTemplate(ctx context.Context, name string, fn func(*Template) error) (Template, error)
	DeleteTemplate(ctx context.Context, name string) error
}

// Refs resolve what a create or rollback names.
type Refs interface {
	// ResolveRef finds what ref names for a team, the first match
	// winning: a snapshot of the team's by ID, a snapshot by one of the
	// team's names, the team's template of that name (its key:
	// TemplateKey), a template by key (the default team's by name). team "" is the control plane's
	// own lookup: a snapshot of any team by ID, no snapshot by name. One
	// read (one round trip on PostgreSQL); none of them: ErrNotFound.
	ResolveRef(ctx context.Context, team, ref string) (Ref, error)
}

// Ref is what ResolveRef found: exactly one of its fields is set.
type Ref struct {
	Snapshot *Snapshot
	Template *Template
}

// Nodes are the fleet's node agents.
type Nodes interface {
	// UpsertNode registers a node or records its heartbeat: it writes n
	// but keeps the stored Draining and JoinedAt (JoinedAt is now on the
	// first call if n leaves it zero), and returns the stored row.
	UpsertNode(ctx context.Context, n Node) (Node, error)
	GetNode(ctx context.Context, id string) (Node, error)
	// ListNodes returns every node by ID.
	ListNodes(ctx context.Context) ([]Node, error)
	// UpdateNode is read-change-write in one transaction (drain, lost).
	UpdateNode(ctx context.Context, id string, fn func(*Node) error) (Node, error)
	DeleteNode(ctx context.Context, id string) error
	// BindNodeKey binds a node ID to the public key (its fingerprint)
	// its fleet certificate is issued for: the first binding of an ID
	// stays, the same key again is nil, another key is ErrConflict. So
	// whoever enrolls an ID first owns it: a join token cannot take over
	// an existing node's identity.
	BindNodeKey(ctx context.Context, nodeID, keyID string) error
}

// Leases make background work (the reaper, reconcile, warm pools) run
// once across API replicas sharing the database.
type Leases interface {
	// AcquireLease takes the lease name for holder for ttl and reports
	// whether it got it: true when it was free, expired, or already held
	// by holder (then renewed for ttl from now). Expiry is judged by the
	// database's clock in PostgreSQL and the process clock in SQLite.
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error)
	// ReleaseLease frees the lease if holder holds it; otherwise it does
	// nothing.
	ReleaseLease(ctx context.Context, name, holder string) error
}

// APIKeys are the stored API keys. Every change (an add, a revocation)
// increments one counter, APIKeysVersion, in the same transaction: a
// replica that keeps the keys in memory reads that one number to know
// whether its copy is current.
type APIKeys interface {
	// AddAPIKey stores a new key (valid; an empty Role is RoleOperator).
	// The same hash or ID again is ErrAlreadyExists, also when that key
	// was revoked: a revoked key never comes back.
	AddAPIKey(ctx context.Context, k APIKey) error
	APIKeyByHash(ctx context.Context, hash string) (APIKey, error)
	// CountAPIKeys counts the valid (not revoked) keys.
	CountAPIKeys(ctx context.Context) (int, error)
	// ListAPIKeys returns the keys, oldest first; revoked ones only with
	// revoked.
	ListAPIKeys(ctx context.Context, revoked bool) ([]APIKey, error)
	// RevokeAPIKey revokes a key at the given time and returns it; a key
	// already revoked keeps its first revocation time. Unknown:
	// ErrNotFound.
	RevokeAPIKey(ctx context.Context, id string, at time.Time) (APIKey, error)
	// APIKeysVersion is the change counter (see above).
	APIKeysVersion(ctx context.Context) (int64, error)
	// TouchAPIKey records that the key was used at at (kept when a later
	// use is stored already). It is not a change of the keys: the
	// counter stays.
	TouchAPIKey(ctx context.Context, id string, at time.Time) error
}
