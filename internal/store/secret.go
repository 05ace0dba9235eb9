package store

import (
	"context"
	"time"
)

// Secret is a stored secret (E2B's secrets API). The store never sees a
// value: Sealed is the current version's value encrypted by the control
// plane (internal/secrets), which alone holds the key.
type Secret struct {
	ID       string            `json:"id"`   // "sec_…", minted by the caller
	Name     string            `json:"name"` // unique, lower case
	Version  int64             `json:"version"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Sealed is the current version's value, encrypted (nonce and
	// ciphertext with its tag, bound to ID and Version).
	Sealed    []byte    `json:"sealed"`
	CreatedAt time.Time `json:"createdAt"` // zero on create means now; kept by UpdateSecret
	UpdatedAt time.Time `json:"updatedAt"` // set by the store on every write
}

// Secrets are the stored secrets. A ref is a secret's ID or its name
// (names never look like IDs: the caller reserves the ID prefix).
type Secrets interface {
	// CreateSecret stores a new secret (UpdatedAt now; CreatedAt now if
	// zero); an ID or a name another secret has is ErrAlreadyExists.
	CreateSecret(ctx context.Context, s Secret) error
	GetSecret(ctx context.Context, ref string) (Secret, error)
	// UpdateSecret reads, changes with fn and writes a secret in one
	// transaction (concurrent updates serialized, none lost); an error
	// from fn aborts it. ID, Name and CreatedAt are kept.
	UpdateSecret(ctx context.Context, ref string, fn func(*Secret) error) (Secret, error)
	// ListSecrets returns a page, oldest first, and the cursor of the
	// next page ("" when it is the last).
	ListSecrets(ctx context.Context, limit int, cursor string) ([]Secret, string, error)
	DeleteSecret(ctx context.Context, ref string) error
}

// StampSecret sets the times a write keeps: CreatedAt (when zero) and
// UpdatedAt.
func StampSecret(s *Secret, now time.Time) {
	if s.CreatedAt.IsZero() {
		s.CreatedAt = now
	}
	s.UpdatedAt = now
}
