package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

const keyColumns = `id, hash, name, team_id, role, scope, source, mask, created_at, expires_at, last_used_at, revoked_at`

func scanKey(sc interface{ Scan(...any) error }) (store.APIKey, error) {
	var k store.APIKey
	var scope string
	var created, expires, used, revoked int64
	if err := sc.Scan(&k.ID, &k.Hash, &k.Name, &k.TeamID, &k.Role, &scope, &k.Source, &k.Mask, &created, &expires, &used, &revoked); err != nil {
		return store.APIKey{}, err
	}
	var err error
	if k.Scope, err = store.DecodeKeyScope(scope); err != nil {
		return store.APIKey{}, fmt.Errorf("api key %s: %w", k.ID, err)
	}
	k.CreatedAt = time.UnixMilli(created).UTC()
	k.ExpiresAt, k.LastUsedAt, k.RevokedAt = fromMilli(expires), fromMilli(used), fromMilli(revoked)
	return k, nil
}

// fromMilli is a stored time; 0 is none.
func fromMilli(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// toMilli stores a time; none is 0.
func toMilli(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// bumpKeys increments the keys' change counter inside tx.
func bumpKeys(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, `UPDATE api_key_version SET version = version + 1 WHERE id = 1`)
	return err
}

// AddAPIKey implements store.Store.
func (s *DB) AddAPIKey(ctx context.Context, k store.APIKey) error {
	if k.Role == "" {
		k.Role = store.RoleOperator
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `INSERT INTO api_keys(`+keyColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0)`,
		k.ID, k.Hash, k.Name, k.TeamID, k.Role, store.EncodeKeyScope(k.Scope), k.Source, k.Mask, k.CreatedAt.UnixMilli(), toMilli(k.ExpiresAt))
	if isUnique(err) {
		return fmt.Errorf("api key %s: %w", k.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("api key %s: %w", k.ID, err)
	}
	if err := bumpKeys(ctx, tx); err != nil {
		return fmt.Errorf("api key %s: %w", k.ID, err)
	}
	return tx.Commit()
}

// APIKeyByHash implements store.Store.
func (s *DB) APIKeyByHash(ctx context.Context, hash string) (store.APIKey, error) {
	k, err := scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
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
	err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM api_keys WHERE revoked_at = 0`).Scan(&n)
	return n, err
}

// ListAPIKeys implements store.Store.
func (s *DB) ListAPIKeys(ctx context.Context, revoked bool) ([]store.APIKey, error) {
	q := `SELECT ` + keyColumns + ` FROM api_keys`
	if !revoked {
		q += ` WHERE revoked_at = 0`
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY created_at, id`)
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
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.APIKey{}, err
	}
	defer tx.Rollback()
	k, err := scanKey(tx.QueryRowContext(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return store.APIKey{}, errdefs.NotFoundf("api key %s not found", id)
	}
	if err != nil {
		return store.APIKey{}, fmt.Errorf("api key %s: %w", id, err)
	}
	if k.Revoked() {
		return k, nil
	}
	k.RevokedAt = at.UTC().Truncate(time.Millisecond)
	if _, err := tx.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ? WHERE id = ?`, k.RevokedAt.UnixMilli(), id); err != nil {
		return store.APIKey{}, fmt.Errorf("api key %s: %w", id, err)
	}
	if err := bumpKeys(ctx, tx); err != nil {
		return store.APIKey{}, fmt.Errorf("api key %s: %w", id, err)
	}
	return k, tx.Commit()
}

// TouchAPIKey implements store.Store.
func (s *DB) TouchAPIKey(ctx context.Context, id string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE api_keys SET last_used_at = MAX(last_used_at, ?) WHERE id = ?`, at.UnixMilli(), id)
	if err != nil {
		return fmt.Errorf("api key %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFoundf("api key %s not found", id)
	}
	return nil
}

// APIKeysVersion implements store.Store.
func (s *DB) APIKeysVersion(ctx context.Context) (int64, error) {
	var v int64
	if err := s.db.QueryRowContext(ctx, `SELECT version FROM api_key_version WHERE id = 1`).Scan(&v); err != nil {
		return 0, fmt.Errorf("api keys version: %w", err)
	}
	return v, nil
}

// BindNodeKey implements store.Store.
func (s *DB) BindNodeKey(ctx context.Context, nodeID, keyID string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var have string
	err = tx.QueryRowContext(ctx, `SELECT key_id FROM node_keys WHERE node_id = ?`, nodeID).Scan(&have)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := tx.ExecContext(ctx, `INSERT INTO node_keys(node_id, key_id, bound_at) VALUES (?, ?, ?)`, nodeID, keyID, time.Now().UnixMilli()); err != nil {
			return fmt.Errorf("node %s key: %w", nodeID, err)
		}
		return tx.Commit()
	case err != nil:
		return fmt.Errorf("node %s key: %w", nodeID, err)
	case have != keyID:
		return errdefs.Conflictf("node %s is enrolled with another key", nodeID)
	}
	return nil
}
