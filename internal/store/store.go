// Package store is the control plane's metadata contract: sandboxes,
// snapshots and API keys. SQLite (store/sqlite) backs one machine; a
// PostgreSQL implementation can join behind the same contract, held to it
// by the conformance suite in store/storetest.
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
)

// Sandbox is the control plane's record of a sandbox.
type Sandbox struct {
	ID            string            `json:"id"`
	TemplateID    string            `json:"templateID"` // as asked: a template name or a snapshot ID
	Alias         string            `json:"alias,omitempty"`
	State         string            `json:"state"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	EnvVars       map[string]string `json:"envVars,omitempty"`
	CPUCount      int               `json:"cpuCount"`
	MemoryMB      int               `json:"memoryMB"`
	DiskSizeMB    int               `json:"diskSizeMB"`
	StartedAt     time.Time         `json:"startedAt"`
	EndAt         time.Time         `json:"endAt"` // when the timeout acts
	AutoPause     bool              `json:"autoPause"`
	AllowInternet bool              `json:"allowInternet"`
	AllowOut      []string          `json:"allowOut,omitempty"`
	DenyOut       []string          `json:"denyOut,omitempty"`
	NodeID        string            `json:"nodeID"`
	// Reason says why a sandbox in state error died: "oom" (its memory
	// limit) or "crashed"; ReasonDetail explains it in words.
	Reason       string `json:"reason,omitempty"`
	ReasonDetail string `json:"reasonDetail,omitempty"`
}

// Snapshot is the control plane's record of a snapshot.
type Snapshot struct {
	ID        string    `json:"id"`
	Names     []string  `json:"names,omitempty"`
	SandboxID string    `json:"sandboxID,omitempty"` // the sandbox it was taken of
	Kind      string    `json:"kind"`
	CreatedAt time.Time `json:"createdAt"`
	SizeBytes int64     `json:"sizeBytes"`
}

// APIKey is a stored API key: only its hash is kept.
type APIKey struct {
	ID        string    `json:"id"`
	Hash      string    `json:"hash"` // hex sha256 of the key
	CreatedAt time.Time `json:"createdAt"`
}

// SandboxFilter selects sandboxes. Metadata matches every pair given.
type SandboxFilter struct {
	States   []string
	Metadata map[string]string
	Template string
	Limit    int    // 0: no limit
	Cursor   string // from a previous page; "" starts at the beginning
}

// SnapshotFilter selects snapshots.
type SnapshotFilter struct {
	SandboxID string
	Name      string
	Limit     int
	Cursor    string
}

// Store is the metadata contract. Errors are errdefs kinds: ErrNotFound,
// ErrAlreadyExists, ErrInvalidArgument (a malformed cursor).
type Store interface {
	CreateSandbox(ctx context.Context, s Sandbox) error
	GetSandbox(ctx context.Context, id string) (Sandbox, error)
	// UpdateSandbox reads, changes with fn and writes a sandbox in one
	// transaction; an error from fn aborts it.
	UpdateSandbox(ctx context.Context, id string, fn func(*Sandbox) error) (Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error
	// ListSandboxes returns a page, oldest first, and the cursor of the
	// next page ("" when it is the last).
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, string, error)
	// Expired returns the sandboxes in the given states whose EndAt is
	// not after now.
	Expired(ctx context.Context, now time.Time, states ...string) ([]Sandbox, error)

	PutSnapshot(ctx context.Context, s Snapshot) error
	GetSnapshot(ctx context.Context, id string) (Snapshot, error)
	ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, string, error)
	DeleteSnapshot(ctx context.Context, id string) error

	AddAPIKey(ctx context.Context, k APIKey) error
	APIKeyByHash(ctx context.Context, hash string) (APIKey, error)
	CountAPIKeys(ctx context.Context) (int, error)

	Close() error
}
