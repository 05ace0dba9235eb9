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

// CreateVolume implements store.Store.
func (s *DB) CreateVolume(ctx context.Context, v store.Volume) error {
	store.StampVolume(&v, s.now().UTC())
	data, _ := json.Marshal(v)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("create volume %s: %w", v.Name, err)
	}
	defer tx.Rollback()
	if err := chargeBytes(ctx, tx, v.TeamID, "volumeBytes", v.ID, -1, v.SizeBytes); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO volumes(id, team_id, name, data) VALUES (?, ?, ?, ?)`, v.ID, v.TeamID, v.Name, string(data))
	if err == nil {
		err = tx.Commit()
	}
	if isUnique(err) {
		return fmt.Errorf("volume %s: %w", v.Name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create volume %s: %w", v.Name, err)
	}
	return nil
}

func getVolume(ctx context.Context, q querier, team, ref string) (store.Volume, error) {
	var data string
	var v store.Volume
	err := q.QueryRowContext(ctx, `SELECT data FROM volumes WHERE (id = ?1 AND (?2 = '' OR team_id = ?2)) OR (name = ?1 AND ?2 != '' AND team_id = ?2)`, ref, team).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return v, fmt.Errorf("volume %s: %w", ref, errdefs.ErrNotFound)
	}
	if err != nil {
		return v, fmt.Errorf("volume %s: %w", ref, err)
	}
	if err := json.Unmarshal([]byte(data), &v); err != nil {
		return v, fmt.Errorf("volume %s: decode: %w", ref, err)
	}
	return v, nil
}

// GetVolume implements store.Store.
func (s *DB) GetVolume(ctx context.Context, team, ref string) (store.Volume, error) {
	return getVolume(ctx, s.db, team, ref)
}

// UpdateVolume implements store.Store (IMMEDIATE: the write lock is held
// from the read to the write).
func (s *DB) UpdateVolume(ctx context.Context, team, ref string, fn func(*store.Volume) error) (store.Volume, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.Volume{}, fmt.Errorf("volume %s: %w", ref, err)
	}
	defer tx.Rollback()
	v, err := getVolume(ctx, tx, team, ref)
	if err != nil {
		return store.Volume{}, err
	}
	id, owner, name, created, size := v.ID, v.TeamID, v.Name, v.CreatedAt, v.SizeBytes
	if err := fn(&v); err != nil {
		return store.Volume{}, err
	}
	if err := chargeBytes(ctx, tx, owner, "volumeBytes", id, size, v.SizeBytes); err != nil {
		return store.Volume{}, err
	}
	v.ID, v.TeamID, v.Name, v.CreatedAt = id, owner, name, created
	store.StampVolume(&v, s.now().UTC())
	data, _ := json.Marshal(v)
	if _, err := tx.ExecContext(ctx, `UPDATE volumes SET data = ? WHERE id = ?`, string(data), id); err != nil {
		return store.Volume{}, fmt.Errorf("volume %s: %w", ref, err)
	}
	if err := tx.Commit(); err != nil {
		return store.Volume{}, fmt.Errorf("volume %s: %w", ref, err)
	}
	return v, nil
}

// ListVolumes implements store.Store.
func (s *DB) ListVolumes(ctx context.Context, team string, limit int, cursor string) ([]store.Volume, string, error) {
	after, err := decodeCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	q, args := `SELECT seq, data FROM volumes WHERE seq > ?`, []any{after}
	if team != "" {
		q, args = q+` AND team_id = ?`, append(args, team)
	}
	return page[store.Volume](ctx, s.db, q, args, limit)
}

// DeleteVolume implements store.Store. The check runs on the row read
// under the write lock (IMMEDIATE), so no mount recorded after it can be
// lost to the delete.
func (s *DB) DeleteVolume(ctx context.Context, team, ref string, check func(store.Volume) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("volume %s: %w", ref, err)
	}
	defer tx.Rollback()
	v, err := getVolume(ctx, tx, team, ref)
	if err != nil {
		return err
	}
	if check != nil {
		if err := check(v); err != nil {
			return err
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM volumes WHERE id = ?`, v.ID); err != nil {
		return fmt.Errorf("volume %s: %w", ref, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("volume %s: %w", ref, err)
	}
	return nil
}
