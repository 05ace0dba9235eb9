package store

import (
	"context"
	"fmt"
	"time"
)

// Build statuses (E2B's TemplateBuildStatus).
const (
	BuildWaiting  = "waiting"  // created, not started by any replica yet
	BuildBuilding = "building" // a replica (Owner) is running it
	BuildReady    = "ready"    // done: SnapshotID holds the result
	BuildError    = "error"    // failed: Reason (and FailedStep) say why
)

// MaxBuildLogs is the most log entries a build keeps: the first
// MaxBuildLogs-1 appended, then one entry saying the rest were dropped, so
// a chatty build cannot fill the database.
const MaxBuildLogs = 10000

// Build is one run of a template's build spec (E2B's template build). It
// lives in the store because the build runs on one API replica while
// clients poll its status and logs through any other.
type Build struct {
	ID       string   `json:"id"`               // minted by the caller
	TeamID   string   `json:"teamID,omitempty"` // the team that asked for it ("": the default team)
	Template string   `json:"template"`         // the template name it builds
	Status   string   `json:"status"`
	Spec     []byte   `json:"spec,omitempty"` // opaque JSON (the build spec)
	Tags     []string `json:"tags,omitempty"` // tags the template's build gets when it succeeds
	CPUCount int      `json:"cpuCount"`
	MemoryMB int      `json:"memoryMB"`
	// SnapshotID is the result, once ready.
	SnapshotID string `json:"snapshotID,omitempty"`
	// Reason is the error message when Status is error; FailedStep the
	// step that failed ("base", "0", "1"..., "finalize"), when known.
	Reason     string `json:"reason,omitempty"`
	FailedStep string `json:"failedStep,omitempty"`
	// Owner is the replica running it ("": none yet).
	Owner     string    `json:"owner,omitempty"`
	CreatedAt time.Time `json:"createdAt"` // zero on create means now; kept by UpdateBuild
	UpdatedAt time.Time `json:"updatedAt"` // set by the store on every write
	// FinishedAt is kept by the store: set (to now, if the caller left it
	// zero) when Status becomes ready or error, zero in any other status.
	FinishedAt time.Time `json:"finishedAt,omitzero"`
}

// Finished reports whether the build reached an end (ready or error).
func (b Build) Finished() bool { return b.Status == BuildReady || b.Status == BuildError }

// BuildLog is one line of a build's log.
type BuildLog struct {
	Time    time.Time `json:"time"`
	Level   string    `json:"level"` // "debug", "info", "warn", "error"
	Message string    `json:"message"`
	Step    string    `json:"step,omitempty"` // the step it came from, when known
}

// TemplateTag points a template's tag (name:tag) at one of its builds.
type TemplateTag struct {
	Template  string    `json:"template"`
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"` // when the tag was first set (kept when it moves)
}

// Builds are the template builds, their logs and the templates' tags.
type Builds interface {
	// CreateBuild stores a new build (UpdatedAt now; CreatedAt now if
	// zero); a duplicate ID is ErrAlreadyExists.
	CreateBuild(ctx context.Context, b Build) error
	GetBuild(ctx context.Context, id string) (Build, error)
	// UpdateBuild reads, changes with fn and writes a build in one
	// transaction (concurrent updates, also from other replicas, are
	// serialized, none lost); an error from fn aborts it and is returned.
	// ID and CreatedAt are kept whatever fn does.
	UpdateBuild(ctx context.Context, id string, fn func(*Build) error) (Build, error)
	// ListBuilds returns the template's builds, newest (last created) first.
	ListBuilds(ctx context.Context, template string) ([]Build, error)
	// DeleteBuilds removes the template's builds, their logs and the
	// template's tags (nothing there is no error).
	DeleteBuilds(ctx context.Context, template string) error
	// AppendBuildLogs appends entries after the build's earlier ones, in
	// order, never rewriting those; concurrent appends are serialized
	// (each call's entries stay together). Past MaxBuildLogs entries the
	// rest are dropped, with one final entry saying so. An unknown build
	// is ErrNotFound.
	AppendBuildLogs(ctx context.Context, id string, logs ...BuildLog) error
	// BuildLogs returns entries [offset, offset+limit) in append order
	// (limit <= 0: all from offset). An unknown build is ErrNotFound, a
	// negative offset ErrInvalidArgument.
	BuildLogs(ctx context.Context, id string, offset, limit int) ([]BuildLog, error)
	// SetTag points t.Template's tag t.Tag at t.BuildID, inserting it
	// (CreatedAt now if zero) or moving it (CreatedAt kept). The build is
	// not checked: a tag may name a build the store does not hold.
	SetTag(ctx context.Context, t TemplateTag) error
	// DeleteTag removes a tag; a missing one is ErrNotFound.
	DeleteTag(ctx context.Context, template, tag string) error
	// ListTags returns the template's tags sorted by tag.
	ListTags(ctx context.Context, template string) ([]TemplateTag, error)
	GetTag(ctx context.Context, template, tag string) (TemplateTag, error)
}

// StampBuild sets the times the store keeps on a build being written at
// now: UpdatedAt, CreatedAt if zero, and FinishedAt (now if the build has
// just finished, zero while it has not). Both backends use it.
func StampBuild(b *Build, now time.Time) {
	b.UpdatedAt = now
	if b.CreatedAt.IsZero() {
		b.CreatedAt = now
	}
	switch {
	case !b.Finished():
		b.FinishedAt = time.Time{}
	case b.FinishedAt.IsZero():
		b.FinishedAt = now
	}
}

// CapBuildLogs returns what of logs to store after stored entries: as many
// as fit under MaxBuildLogs-1, then (if any are left out and the marker is
// not there yet) one entry saying the rest were dropped.
func CapBuildLogs(stored int, logs []BuildLog) []BuildLog {
	room := MaxBuildLogs - 1 - stored
	if len(logs) <= room {
		return logs
	}
	if stored >= MaxBuildLogs {
		return nil // full: the marker is already there
	}
	keep := append([]BuildLog(nil), logs[:max(room, 0)]...)
	dropped := logs[max(room, 0)]
	return append(keep, BuildLog{Time: dropped.Time, Level: "warn", Step: dropped.Step,
		Message: fmt.Sprintf("build log truncated: further entries are dropped (a build keeps at most %d)", MaxBuildLogs)})
}
