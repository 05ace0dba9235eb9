package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// CreateVolume implements store.Store.
func (s *DB) CreateVolume(ctx context.Context, v store.Volume) error {
	store.StampVolume(&v, time.Now().UTC())
	data, _ := json.Marshal(v)
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if err := chargeBytes(ctx, tx, v.TeamID, "volumeBytes", v.ID, -1, v.SizeBytes); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO volumes(id, team_id, name, data) VALUES ($1, $2, $3, $4)`, v.ID, v.TeamID, v.Name, string(data))
		return err
	})
	var qe *store.QuotaError
	if errors.As(err, &qe) || errdefs.IsNotFound(err) {
		return err
	}
	if isUnique(err) {
		return fmt.Errorf("volume %s: %w", v.Name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create volume %s: %w", v.Name, err)
	}
	return nil
}

// GetVolume implements store.Store.
func (s *DB) GetVolume(ctx context.Context, team, ref string) (store.Volume, error) {
	var v store.Volume
	return v, getJSON(ctx, s.pool, &v, "volume", ref, `SELECT data FROM volumes WHERE `+inTeam, ref, team)
}

// UpdateVolume implements store.Store (the row locked from read to write).
func (s *DB) UpdateVolume(ctx context.Context, team, ref string, fn func(*store.Volume) error) (store.Volume, error) {
	var v store.Volume
	err := updateJSONIn(ctx, s, "volume", ref, `SELECT data FROM volumes WHERE `+inTeam+` FOR UPDATE`, []any{ref, team}, &v,
		func(q querier, v *store.Volume) (string, []any, error) {
			id, owner, name, created, size := v.ID, v.TeamID, v.Name, v.CreatedAt, v.SizeBytes
			if err := fn(v); err != nil {
				return "", nil, err
			}
			if err := chargeBytes(ctx, q, owner, "volumeBytes", id, size, v.SizeBytes); err != nil {
				return "", nil, err
			}
			v.ID, v.TeamID, v.Name, v.CreatedAt = id, owner, name, created
			store.StampVolume(v, time.Now().UTC())
			data, _ := json.Marshal(v)
			return `UPDATE volumes SET data = $2 WHERE id = $1`, []any{id, string(data)}, nil
		})
	if err != nil {
		return store.Volume{}, err
	}
	return v, nil
}

// ListVolumes implements store.Store.
func (s *DB) ListVolumes(ctx context.Context, team string, limit int, cursor string) ([]store.Volume, string, error) {
	after, err := store.DecodeCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	w := where{q: `SELECT seq, data FROM volumes WHERE seq > $1`, args: []any{after}}
	if team != "" {
		w.and(`team_id = $%d`, team)
	}
	return page[store.Volume](ctx, s.pool, w, limit)
}

// DeleteVolume implements store.Store. The check runs on the row locked
// (FOR UPDATE) until the delete commits, so an update that would make it
// refuse (a mount recorded by another replica) waits or is waited for.
// Without a check, the delete is one statement.
func (s *DB) DeleteVolume(ctx context.Context, team, ref string, check func(store.Volume) error) error {
	if check == nil {
		return s.deleteRow(ctx, `DELETE FROM volumes WHERE `+inTeam, "volume", ref, team)
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var v store.Volume
		if err := getJSON(ctx, tx, &v, "volume", ref, `SELECT data FROM volumes WHERE `+inTeam+` FOR UPDATE`, ref, team); err != nil {
			return err
		}
		if err := check(v); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM volumes WHERE id = $1`, v.ID); err != nil {
			return fmt.Errorf("volume %s: %w", ref, err)
		}
		return nil
	})
}
