package store

import (
	"context"
	"time"
)

// Secret is a stored secret (E2B's secrets API). The store never sees a
// value: Sealed is the current version's value encrypted by the control
// plane (internal/secrets), which alone holds the key.
type Secret struct {
	ID       string            `json:"id"`     // "sec_…", minted by the caller
	TeamID   string            `json:"teamID"` // the team that owns it
	Name     string            `json:"name"`   // unique in its team, lower case
	Version  int64             `json:"version"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Sealed is the current version's value, encrypted (nonce and
	// ciphertext with its tag, bound to ID and Version).
	Sealed    []byte    `json:"sealed"`
	CreatedAt time.Time `json:"createdAt"` // zero on create means now; kept by UpdateSecret
	UpdatedAt time.Time `json:"updatedAt"` // set by the store on every write
}

// Secrets are the stored secrets. A ref is a secret's ID or its name
// (names never look like IDs: the caller reserves the ID prefix), looked
// up in one team: another team's secret is ErrNotFound. Team "" is the
// control plane's own lookup: a secret of any team by ID, none by name.
type Secrets interface {
	// CreateSecret stores a new secret (UpdatedAt now; CreatedAt now if
	// zero); an ID, or a name another secret of its team has, is
	// ErrAlreadyExists.
	CreateSecret(ctx context.Context, s Secret) error
	GetSecret(ctx context.Context, team, ref string) (Secret, error)
	// UpdateSecret reads, changes with fn and writes a secret in one
	// transaction (concurrent updates serialized, none lost); an error
	// from fn aborts it. ID, Name and CreatedAt are kept.
	UpdateSecret(ctx context.Context, team, ref string, fn func(*Secret) error) (Secret, error)
	// ListSecrets returns a page of a team's secrets (team "": every
	// team's), oldest first, and the cursor of the next page ("" when it
	// is the last).
	ListSecrets(ctx context.Context, team string, limit int, cursor string) ([]Secret, string, error)
	DeleteSecret(ctx context.Context, team, ref string) error
}

// StampSecret sets the times a write keeps: CreatedAt (when zero) and
// UpdatedAt.
func StampSecret(s *Secret, now time.Time) {
	if s.CreatedAt.IsZero() {
		s.CreatedAt = now
	}
	s.UpdatedAt = now
}
