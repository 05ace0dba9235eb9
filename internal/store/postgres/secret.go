package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// CreateSecret implements store.Store.
func (s *DB) CreateSecret(ctx context.Context, sec store.Secret) error {
	store.StampSecret(&sec, time.Now().UTC())
	data, _ := json.Marshal(sec)
	_, err := s.pool.Exec(ctx, `INSERT INTO secrets(id, name, data) VALUES ($1, $2, $3)`, sec.ID, sec.Name, string(data))
	if isUnique(err) {
		return fmt.Errorf("secret %s: %w", sec.Name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create secret %s: %w", sec.Name, err)
	}
	return nil
}

// GetSecret implements store.Store.
func (s *DB) GetSecret(ctx context.Context, ref string) (store.Secret, error) {
	var sec store.Secret
	return sec, getJSON(ctx, s.pool, &sec, "secret", ref, `SELECT data FROM secrets WHERE id = $1 OR name = $1`, ref)
}

// UpdateSecret implements store.Store (the row locked from read to write).
func (s *DB) UpdateSecret(ctx context.Context, ref string, fn func(*store.Secret) error) (store.Secret, error) {
	var sec store.Secret
	err := updateJSON(ctx, s, "secret", ref, `SELECT data FROM secrets WHERE id = $1 OR name = $1 FOR UPDATE`, &sec,
		func(sec *store.Secret) (string, []any, error) {
			id, name, created := sec.ID, sec.Name, sec.CreatedAt
			if err := fn(sec); err != nil {
				return "", nil, err
			}
			sec.ID, sec.Name, sec.CreatedAt = id, name, created
			store.StampSecret(sec, time.Now().UTC())
			data, _ := json.Marshal(sec)
			return `UPDATE secrets SET data = $2 WHERE id = $1`, []any{id, string(data)}, nil
		})
	if err != nil {
		return store.Secret{}, err
	}
	return sec, nil
}

// ListSecrets implements store.Store.
func (s *DB) ListSecrets(ctx context.Context, limit int, cursor string) ([]store.Secret, string, error) {
	after, err := store.DecodeCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	return page[store.Secret](ctx, s.pool, where{q: `SELECT seq, data FROM secrets WHERE seq > $1`, args: []any{after}}, limit)
}

// DeleteSecret implements store.Store.
func (s *DB) DeleteSecret(ctx context.Context, ref string) error {
	return s.deleteRow(ctx, `DELETE FROM secrets WHERE id = $1 OR name = $1`, "secret", ref)
}
