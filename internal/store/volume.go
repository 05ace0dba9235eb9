package store

import (
	"context"
	"time"
)

// Volume modes (docs/volumes.md).
const (
	// VolumeShared is E2B's volume: mounted read-write by many sandboxes
	// at once, outside snapshots (a snapshot records the mount, not the
	// content). The stock SDK creates these.
	VolumeShared = "shared"
	// VolumeExclusive is mounted read-write by one sandbox at a time; its
	// content at the instant of a snapshot is part of that snapshot.
	VolumeExclusive = "exclusive"
)

// Volume is a named, persistent file tree sandboxes mount. The row is the
// volume's identity and settings; its content lives on nodes and in the
// blob store (docs/volumes.md).
type Volume struct {
	ID     string `json:"id"`     // minted by the caller (ids.New('v'))
	TeamID string `json:"teamID"` // the team that owns it
	Name   string `json:"name"`   // unique in its team; never shaped like an ID
	Mode   string `json:"mode"`   // VolumeShared or VolumeExclusive
	// SizeBytes is the volume's quota: a write past it fails with ENOSPC.
	SizeBytes int64 `json:"sizeBytes"`
	// Token authorizes the volume content API for this volume alone
	// (E2B's volume token; GET /volumes/{id} returns it to the owner).
	Token string `json:"token"`
	// Holder is the sandbox that has an exclusive volume mounted
	// read-write ("" when none): a second read-write mount is refused.
	Holder string `json:"holder,omitempty"`
	// NodeID is the node that holds the volume's content (its image): the
	// first to mount it. Sandboxes that mount it are placed there.
	NodeID string `json:"nodeID,omitempty"`
	// Users are the sandboxes that were given it (a delete checks that
	// none of them is alive; one gone since is ignored).
	Users []string `json:"users,omitempty"`
	// MadeFor is the sandbox this volume was made for: a copy of an
	// exclusive volume given to a fork child or a create from a snapshot.
	// It goes with that sandbox's row when its create fails.
	MadeFor   string    `json:"madeFor,omitempty"`
	CreatedAt time.Time `json:"createdAt"` // zero on create means now; kept by UpdateVolume
	UpdatedAt time.Time `json:"updatedAt"` // set by the store on every write
}

// Volumes are the stored volumes. A ref is a volume's ID or its name
// (the caller keeps names from looking like IDs), looked up in one team:
// another team's volume is ErrNotFound. Team "" is the control plane's
// own lookup: a volume of any team by ID, none by name.
type Volumes interface {
	// CreateVolume stores a new volume (UpdatedAt now; CreatedAt now if
	// zero); an ID, or a name another volume of its team has, is
	// ErrAlreadyExists.
	CreateVolume(ctx context.Context, v Volume) error
	// GetVolume returns the volume ref names; ErrNotFound if none.
	GetVolume(ctx context.Context, team, ref string) (Volume, error)
	// UpdateVolume reads, changes with fn and writes a volume in one
	// transaction (concurrent updates serialized, none lost); an error
	// from fn aborts it and is returned. ID, Name and CreatedAt are kept.
	UpdateVolume(ctx context.Context, team, ref string, fn func(*Volume) error) (Volume, error)
	// ListVolumes returns a page of a team's volumes (team "": every
	// team's), oldest first, and the cursor of the next page ("" when it
	// is the last).
	ListVolumes(ctx context.Context, team string, limit int, cursor string) ([]Volume, string, error)
	// DeleteVolume removes the volume ref names; ErrNotFound if none. With
	// check non-nil it runs inside the transaction on the row read there,
	// and its error aborts the delete (a volume held by a sandbox stays).
	DeleteVolume(ctx context.Context, team, ref string, check func(Volume) error) error
}

// StampVolume sets the times a write keeps: CreatedAt (when zero) and
// UpdatedAt.
func StampVolume(v *Volume, now time.Time) {
	if v.CreatedAt.IsZero() {
		v.CreatedAt = now
	}
	v.UpdatedAt = now
}
