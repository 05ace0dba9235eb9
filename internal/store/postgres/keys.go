package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

const keyColumns = `id, hash, name, team_id, role, scope, source, mask, created_at, expires_at, last_used_at, revoked_at`

func scanKey(sc interface{ Scan(...any) error }) (store.APIKey, error) {
	var k store.APIKey
	var scope string
	var expires, used, revoked *time.Time
	if err := sc.Scan(&k.ID, &k.Hash, &k.Name, &k.TeamID, &k.Role, &scope, &k.Source, &k.Mask, &k.CreatedAt, &expires, &used, &revoked); err != nil {
		return store.APIKey{}, err
	}
	var err error
	if k.Scope, err = store.DecodeKeyScope(scope); err != nil {
		return store.APIKey{}, fmt.Errorf("api key %s: %w", k.ID, err)
	}
	k.CreatedAt = k.CreatedAt.UTC()
	k.ExpiresAt, k.LastUsedAt, k.RevokedAt = fromNull(expires), fromNull(used), fromNull(revoked)
	return k, nil
}

// fromNull is a stored time; NULL is none.
func fromNull(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}

// toNull stores a time; none is NULL.
func toNull(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// bumpKeys increments the keys' change counter inside tx.
func bumpKeys(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `UPDATE api_key_version SET version = version + 1 WHERE id = 1`)
	return err
}

// AddAPIKey implements store.Store.
func (s *DB) AddAPIKey(ctx context.Context, k store.APIKey) error {
	if k.Role == "" {
		k.Role = store.RoleOperator
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO api_keys(`+keyColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULL, NULL)`,
			k.ID, k.Hash, k.Name, k.TeamID, k.Role, store.EncodeKeyScope(k.Scope), k.Source, k.Mask, k.CreatedAt, toNull(k.ExpiresAt))
		if isUnique(err) {
			return fmt.Errorf("api key %s: %w", k.ID, errdefs.ErrAlreadyExists)
		}
		if err == nil {
			err = bumpKeys(ctx, tx)
		}
		if err != nil {
			return fmt.Errorf("api key %s: %w", k.ID, err)
		}
		return nil
	})
}

// APIKeyByHash implements store.Store.
func (s *DB) APIKeyByHash(ctx context.Context, hash string) (store.APIKey, error) {
	k, err := scanKey(s.pool.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE hash = $1`, hash))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.APIKey{}, fmt.Errorf("api key: %w", errdefs.ErrNotFound)
	}
	if err != nil {
		return store.APIKey{}, fmt.Errorf("api key: %w", err)
	}
	return k, nil
}

// CountAPIKeys implements store.Store.
func (s *DB) CountAPIKeys(ctx context.Context) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NULL`).Scan(&n)
	return n, err
}

// ListAPIKeys implements store.Store.
func (s *DB) ListAPIKeys(ctx context.Context, revoked bool) ([]store.APIKey, error) {
	q := `SELECT ` + keyColumns + ` FROM api_keys`
	if !revoked {
		q += ` WHERE revoked_at IS NULL`
	}
	rows, err := s.pool.Query(ctx, q+` ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("api keys: %w", err)
	}
	defer rows.Close()
	out := []store.APIKey{}
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("api keys: %w", err)
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// RevokeAPIKey implements store.Store.
func (s *DB) RevokeAPIKey(ctx context.Context, id string, at time.Time) (store.APIKey, error) {
	var k store.APIKey
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		k, err = scanKey(tx.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE id = $1 FOR UPDATE`, id))
		if errors.Is(err, pgx.ErrNoRows) {
			return errdefs.NotFoundf("api key %s not found", id)
		}
		if err != nil || k.Revoked() {
			return err
		}
		k.RevokedAt = at.UTC().Truncate(time.Microsecond)
		if _, err := tx.Exec(ctx, `UPDATE api_keys SET revoked_at = $1 WHERE id = $2`, k.RevokedAt, id); err != nil {
			return err
		}
		return bumpKeys(ctx, tx)
	})
	if err != nil {
		if errdefs.IsNotFound(err) {
			return store.APIKey{}, err
		}
		return store.APIKey{}, fmt.Errorf("api key %s: %w", id, err)
	}
	return k, nil
}

// TouchAPIKey implements store.Store: one statement, keeping a later use
// already stored (GREATEST skips the NULL of a key never used).
func (s *DB) TouchAPIKey(ctx context.Context, id string, at time.Time) error {
	tag, err := s.pool.Exec(ctx, `UPDATE api_keys SET last_used_at = GREATEST(last_used_at, $1) WHERE id = $2`, at.UTC(), id)
	if err != nil {
		return fmt.Errorf("api key %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return errdefs.NotFoundf("api key %s not found", id)
	}
	return nil
}

// APIKeysVersion implements store.Store.
func (s *DB) APIKeysVersion(ctx context.Context) (int64, error) {
	var v int64
	if err := s.pool.QueryRow(ctx, `SELECT version FROM api_key_version WHERE id = 1`).Scan(&v); err != nil {
		return 0, fmt.Errorf("api keys version: %w", err)
	}
	return v, nil
}

// BindNodeKey implements store.Store: one statement (the first insert
// wins; a conflict leaves the row as it was).
func (s *DB) BindNodeKey(ctx context.Context, nodeID, keyID string) error {
	var have string
	err := s.pool.QueryRow(ctx, `INSERT INTO node_keys(node_id, key_id, bound_at) VALUES ($1, $2, now())
		ON CONFLICT (node_id) DO UPDATE SET node_id = node_keys.node_id RETURNING key_id`, nodeID, keyID).Scan(&have)
	if err != nil {
		return fmt.Errorf("node %s key: %w", nodeID, err)
	}
	if have != keyID {
		return errdefs.Conflictf("node %s is enrolled with another key", nodeID)
	}
	return nil
}
