package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// inTeam is the condition of a lookup by ref ($1, an ID or a name) for
// team $2: an ID in the team (in any team when $2 is empty), or a name in
// the team (none when $2 is empty: names are only unique within a team).
const inTeam = `((id = $1 AND ($2 = '' OR team_id = $2)) OR (name = $1 AND $2 <> '' AND team_id = $2))`

// CreateSecret implements store.Store.
func (s *DB) CreateSecret(ctx context.Context, sec store.Secret) error {
	store.StampSecret(&sec, time.Now().UTC())
	data, _ := json.Marshal(sec)
	_, err := s.pool.Exec(ctx, `INSERT INTO secrets(id, team_id, name, data) VALUES ($1, $2, $3, $4)`, sec.ID, sec.TeamID, sec.Name, string(data))
	if isUnique(err) {
		return fmt.Errorf("secret %s: %w", sec.Name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create secret %s: %w", sec.Name, err)
	}
	return nil
}

// GetSecret implements store.Store.
func (s *DB) GetSecret(ctx context.Context, team, ref string) (store.Secret, error) {
	var sec store.Secret
	return sec, getJSON(ctx, s.pool, &sec, "secret", ref, `SELECT data FROM secrets WHERE `+inTeam, ref, team)
}

// UpdateSecret implements store.Store (the row locked from read to write).
func (s *DB) UpdateSecret(ctx context.Context, team, ref string, fn func(*store.Secret) error) (store.Secret, error) {
	var sec store.Secret
	err := updateJSONArgs(ctx, s, "secret", ref, `SELECT data FROM secrets WHERE `+inTeam+` FOR UPDATE`, []any{ref, team}, &sec,
		func(sec *store.Secret) (string, []any, error) {
			id, owner, name, created := sec.ID, sec.TeamID, sec.Name, sec.CreatedAt
			if err := fn(sec); err != nil {
				return "", nil, err
			}
			sec.ID, sec.TeamID, sec.Name, sec.CreatedAt = id, owner, name, created
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
func (s *DB) ListSecrets(ctx context.Context, team string, limit int, cursor string) ([]store.Secret, string, error) {
	after, err := store.DecodeCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	w := where{q: `SELECT seq, data FROM secrets WHERE seq > $1`, args: []any{after}}
	if team != "" {
		w.and(`team_id = $%d`, team)
	}
	return page[store.Secret](ctx, s.pool, w, limit)
}

// DeleteSecret implements store.Store.
func (s *DB) DeleteSecret(ctx context.Context, team, ref string) error {
	return s.deleteRow(ctx, `DELETE FROM secrets WHERE `+inTeam, "secret", ref, team)
}
