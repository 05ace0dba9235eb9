package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// CreateSecret implements store.Store.
func (s *DB) CreateSecret(ctx context.Context, sec store.Secret) error {
	store.StampSecret(&sec, s.now().UTC())
	data, _ := json.Marshal(sec)
	_, err := s.db.ExecContext(ctx, `INSERT INTO secrets(id, team_id, name, data) VALUES (?, ?, ?, ?)`, sec.ID, sec.TeamID, sec.Name, string(data))
	if isUnique(err) {
		return fmt.Errorf("secret %s: %w", sec.Name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create secret %s: %w", sec.Name, err)
	}
	return nil
}

func getSecret(ctx context.Context, q querier, team, ref string) (store.Secret, error) {
	var data string
	var sec store.Secret
	err := q.QueryRowContext(ctx, `SELECT data FROM secrets WHERE (id = ?1 AND (?2 = '' OR team_id = ?2)) OR (name = ?1 AND ?2 != '' AND team_id = ?2)`, ref, team).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return sec, fmt.Errorf("secret %s: %w", ref, errdefs.ErrNotFound)
	}
	if err != nil {
		return sec, fmt.Errorf("secret %s: %w", ref, err)
	}
	if err := json.Unmarshal([]byte(data), &sec); err != nil {
		return sec, fmt.Errorf("secret %s: decode: %w", ref, err)
	}
	return sec, nil
}

// GetSecret implements store.Store.
func (s *DB) GetSecret(ctx context.Context, team, ref string) (store.Secret, error) {
	return getSecret(ctx, s.db, team, ref)
}

// UpdateSecret implements store.Store (IMMEDIATE: the write lock is held
// from the read to the write).
func (s *DB) UpdateSecret(ctx context.Context, team, ref string, fn func(*store.Secret) error) (store.Secret, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.Secret{}, fmt.Errorf("secret %s: %w", ref, err)
	}
	defer tx.Rollback()
	sec, err := getSecret(ctx, tx, team, ref)
	if err != nil {
		return store.Secret{}, err
	}
	id, owner, name, created := sec.ID, sec.TeamID, sec.Name, sec.CreatedAt
	if err := fn(&sec); err != nil {
		return store.Secret{}, err
	}
	sec.ID, sec.TeamID, sec.Name, sec.CreatedAt = id, owner, name, created
	store.StampSecret(&sec, s.now().UTC())
	data, _ := json.Marshal(sec)
	if _, err := tx.ExecContext(ctx, `UPDATE secrets SET data = ? WHERE id = ?`, string(data), id); err != nil {
		return store.Secret{}, fmt.Errorf("secret %s: %w", ref, err)
	}
	if err := tx.Commit(); err != nil {
		return store.Secret{}, fmt.Errorf("secret %s: %w", ref, err)
	}
	return sec, nil
}

// ListSecrets implements store.Store.
func (s *DB) ListSecrets(ctx context.Context, team string, limit int, cursor string) ([]store.Secret, string, error) {
	after, err := decodeCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	q, args := `SELECT seq, data FROM secrets WHERE seq > ?`, []any{after}
	if team != "" {
		q, args = q+` AND team_id = ?`, append(args, team)
	}
	return page[store.Secret](ctx, s.db, q, args, limit)
}

// DeleteSecret implements store.Store.
func (s *DB) DeleteSecret(ctx context.Context, team, ref string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM secrets WHERE (id = ?1 AND (?2 = '' OR team_id = ?2)) OR (name = ?1 AND ?2 != '' AND team_id = ?2)`, ref, team)
	if err != nil {
		return fmt.Errorf("secret %s: %w", ref, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("secret %s: %w", ref, errdefs.ErrNotFound)
	}
	return nil
}
