package apikey

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"path"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/store"
)

// Prefix starts every key Spore makes (a key given by the operator may be
// anything of at least MinLen characters).
const Prefix = "spore_"

// MinLen is the shortest key accepted from an operator's configuration.
const MinLen = 16

// MaxNameLen bounds a key's name.
const MaxNameLen = 128

// Hash is how API keys are stored: hex SHA-256.
func Hash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// Generate returns a new random key: Prefix and 160 random bits in hex.
func Generate() string {
	b := make([]byte, 20)
	rand.Read(b)
	return Prefix + hex.EncodeToString(b)
}

// Mask shows enough of a key to tell keys apart, never enough to use it:
// its first 10 and last 4 characters.
func Mask(key string) string {
	if len(key) < 20 {
		return "…"
	}
	return key[:10] + "…" + key[len(key)-4:]
}

// ValidateName checks a key's name: up to MaxNameLen printable characters.
func ValidateName(name string) error {
	if len(name) > MaxNameLen {
		return errdefs.Invalidf("key name: %d bytes, at most %d", len(name), MaxNameLen)
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return errdefs.Invalidf("key name: %q holds a character that is not printable", name)
		}
	}
	return nil
}

// Store is what making keys reads and writes: the keys, and the teams
// they belong to.
type Store interface {
	store.APIKeys
	GetTeam(ctx context.Context, ref string) (store.Team, error)
}

// Spec is what a new key is: its name, its team and role, an optional
// scope and expiry, and where it came from.
type Spec struct {
	Name string
	// TeamID is the key's team; "" only for an operator key.
	TeamID    string
	Role      string // "" is RoleMember for a team key, RoleOperator without a team
	Scope     *store.KeyScope
	ExpiresAt time.Time
	Source    string
}

// MaxScopeItems bounds the operations and templates a scope lists.
const MaxScopeItems = 64

// ValidateScope checks a key scope: known operations (ops lists them)
// and well-formed template patterns.
func ValidateScope(sc *store.KeyScope, ops []string) error {
	if sc == nil {
		return nil
	}
	if len(sc.Operations) > MaxScopeItems || len(sc.Templates) > MaxScopeItems {
		return errdefs.Invalidf("key scope: at most %d operations and %d templates", MaxScopeItems, MaxScopeItems)
	}
	for _, op := range sc.Operations {
		if !slices.Contains(ops, op) {
			return errdefs.Invalidf("key scope: unknown operation %q (the operations: %s)", op, strings.Join(ops, ", "))
		}
	}
	for _, p := range sc.Templates {
		if _, err := path.Match(p, ""); err != nil || p == "" || len(p) > 128 {
			return errdefs.Invalidf("key scope: template pattern %q is malformed (a name, or a pattern such as ci-*)", p)
		}
	}
	return nil
}

// Create makes a key, stores its hash and returns the key (shown to its
// owner once; only the hash is kept) with its record. The key works at
// once on this replica's checker c (when given), within KeysMissCheck on
// every other. The team must exist; an operator key has none, and a team
// key a team.
func Create(ctx context.Context, st Store, c *Checker, spec Spec) (string, store.APIKey, error) {
	if err := ValidateName(spec.Name); err != nil {
		return "", store.APIKey{}, err
	}
	if spec.Role == "" {
		spec.Role = store.RoleMember
		if spec.TeamID == "" {
			spec.Role = store.RoleOperator
		}
	}
	if !store.ValidRole(spec.Role) {
		return "", store.APIKey{}, errdefs.Invalidf("key role %q: want %s, %s or %s", spec.Role, store.RoleAdmin, store.RoleMember, store.RoleOperator)
	}
	switch {
	case spec.Role == store.RoleOperator && spec.TeamID != "":
		return "", store.APIKey{}, errdefs.Invalidf("an operator key belongs to no team: omit the team")
	case spec.Role == store.RoleOperator && spec.Scope != nil:
		return "", store.APIKey{}, errdefs.Invalidf("an operator key has no scope")
	case spec.Role != store.RoleOperator && spec.TeamID == "":
		return "", store.APIKey{}, errdefs.Invalidf("a %s key belongs to a team: name it", spec.Role)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	if !spec.ExpiresAt.IsZero() && !spec.ExpiresAt.After(now) {
		return "", store.APIKey{}, errdefs.Invalidf("key expiry %s is not in the future", spec.ExpiresAt.UTC().Format(time.RFC3339))
	}
	if spec.TeamID != "" {
		if _, err := st.GetTeam(ctx, spec.TeamID); err != nil {
			return "", store.APIKey{}, err
		}
	}
	key := Generate()
	rec := store.APIKey{ID: ids.New('k'), Hash: Hash(key), Name: spec.Name, TeamID: spec.TeamID, Role: spec.Role, Scope: spec.Scope,
		Source: spec.Source, Mask: Mask(key), CreatedAt: now, ExpiresAt: spec.ExpiresAt.UTC().Truncate(time.Millisecond)}
	if err := st.AddAPIKey(ctx, rec); err != nil {
		return "", store.APIKey{}, err
	}
	if c != nil {
		c.Forget()
	}
	return key, rec, nil
}

// Revoke revokes the key id (at once on this replica's checker c, when
// given; within KeysFresh on every other) and returns its record. The
// last valid operator key is not revoked (ErrConflict): that would leave
// no one able to manage the deployment, or to make a new operator key.
func Revoke(ctx context.Context, st store.APIKeys, c *Checker, id string) (store.APIKey, error) {
	if err := ids.Validate("key ID", id); err != nil {
		return store.APIKey{}, err
	}
	valid, err := st.ListAPIKeys(ctx, false)
	if err != nil {
		return store.APIKey{}, err
	}
	operators, target := 0, false
	for _, k := range valid {
		if k.Role == store.RoleOperator && !k.Expired(time.Now()) {
			operators++
			target = target || k.ID == id
		}
	}
	if target && operators == 1 {
		return store.APIKey{}, errdefs.Conflictf("key %s is the last valid operator key: make another operator key first", id)
	}
	rec, err := st.RevokeAPIKey(ctx, id, time.Now())
	if err == nil && c != nil {
		c.Forget()
	}
	return rec, err
}

// EnsureConfigured makes key, the deployment's configured key (a file an
// operator or Helm manages), a valid operator key, and revokes the configured
// keys older than it: rotating the file's key revokes the previous one on
// every replica as soon as one replica starts with the new key. A replica
// still starting with an older configured key (a rolling update) revokes
// nothing newer. A configured key that was revoked stays revoked: it is
// reported, and the operator configures a new one.
func EnsureConfigured(ctx context.Context, st store.APIKeys, key string, log *slog.Logger) error {
	if len(key) < MinLen {
		return errdefs.Invalidf("the configured API key has %d characters, want at least %d", len(key), MinLen)
	}
	rec := store.APIKey{ID: ids.New('k'), Hash: Hash(key), Name: "configured", Role: store.RoleOperator, Source: store.SourceConfig,
		Mask: Mask(key), CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	err := st.AddAPIKey(ctx, rec)
	switch {
	case errdefs.IsAlreadyExists(err):
		if rec, err = st.APIKeyByHash(ctx, rec.Hash); err != nil {
			return fmt.Errorf("the configured API key: %w", err)
		}
		if rec.Revoked() {
			log.Warn("the configured API key was revoked: it is not valid; configure a new one", "key_id", rec.ID, "revoked_at", rec.RevokedAt)
			return nil
		}
	case err != nil:
		return fmt.Errorf("the configured API key: %w", err)
	default:
		log.Info("the configured API key was added", "key_id", rec.ID)
	}
	all, err := st.ListAPIKeys(ctx, false)
	if err != nil {
		return err
	}
	for _, old := range all {
		if old.Source != store.SourceConfig || old.ID == rec.ID || !old.CreatedAt.Before(rec.CreatedAt) {
			continue
		}
		if _, err := st.RevokeAPIKey(ctx, old.ID, time.Now()); err != nil {
			return fmt.Errorf("revoke the previous configured key %s: %w", old.ID, err)
		}
		log.Info("the previous configured API key was revoked (the configured key changed)", "key_id", old.ID)
	}
	return nil
}
