package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// CreateTeam implements store.Store.
func (s *DB) CreateTeam(ctx context.Context, t store.Team) error {
	if t.CreatedAt.IsZero() {
		t.CreatedAt = time.Now().UTC()
	}
	if err := t.Quotas.Validate(); err != nil {
		return err
	}
	quotas, _ := json.Marshal(t.Quotas)
	_, err := s.pool.Exec(ctx, `INSERT INTO teams(id, name, created_at, quotas) VALUES ($1, $2, $3, $4)`, t.ID, t.Name, t.CreatedAt, quotas)
	if isUnique(err) {
		return fmt.Errorf("team %s: %w", t.Name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create team %s: %w", t.Name, err)
	}
	return nil
}

func scanTeam(sc interface{ Scan(...any) error }) (store.Team, error) {
	var t store.Team
	var quotas []byte
	if err := sc.Scan(&t.ID, &t.Name, &t.CreatedAt, &quotas); err != nil {
		return store.Team{}, err
	}
	t.CreatedAt = t.CreatedAt.UTC()
	if err := json.Unmarshal(quotas, &t.Quotas); err != nil {
		return store.Team{}, fmt.Errorf("team %s: quotas: %w", t.ID, err)
	}
	return t, nil
}

// GetTeam implements store.Store: by ID first, then by name.
func (s *DB) GetTeam(ctx context.Context, ref string) (store.Team, error) {
	t, err := scanTeam(s.pool.QueryRow(ctx, `SELECT id, name, created_at, quotas FROM teams WHERE id = $1 OR name = $1 ORDER BY id = $1 DESC LIMIT 1`, ref))
	if errors.Is(err, pgx.ErrNoRows) {
		return t, errdefs.NotFoundf("team %s not found", ref)
	}
	if err != nil {
		return t, fmt.Errorf("team %s: %w", ref, err)
	}
	return t, nil
}

// ListTeams implements store.Store.
func (s *DB) ListTeams(ctx context.Context) ([]store.Team, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, name, created_at, quotas FROM teams ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("teams: %w", err)
	}
	defer rows.Close()
	out := []store.Team{}
	for rows.Next() {
		t, err := scanTeam(rows)
		if err != nil {
			return nil, fmt.Errorf("teams: %w", err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// teamHoldings are the tables whose rows a team owns, in the order
// DeleteTeam names them.
var teamHoldings = []string{"sandboxes", "snapshots", "secrets", "volumes"}

// DeleteTeam implements store.Store. The team's row is locked first, so
// two deletes of one team (or a delete racing another replica's) run one
// after the other and the second finds no row.
func (s *DB) DeleteTeam(ctx context.Context, id string, at time.Time) error {
	if id == store.DefaultTeam {
		return errdefs.Conflictf("team %s is the default team: it is never removed", id)
	}
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var found string
		err := tx.QueryRow(ctx, `SELECT id FROM teams WHERE id = $1 FOR UPDATE`, id).Scan(&found)
		if errors.Is(err, pgx.ErrNoRows) {
			return errdefs.NotFoundf("team %s not found", id)
		}
		if err != nil {
			return fmt.Errorf("team %s: %w", id, err)
		}
		if err := refuseHeld(ctx, tx, id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM team_rates WHERE team_id = $1`, id); err != nil {
			return fmt.Errorf("team %s: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM team_samples WHERE team_id = $1`, id); err != nil {
			return fmt.Errorf("team %s: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM teams WHERE id = $1`, id); err != nil {
			return fmt.Errorf("team %s: %w", id, err)
		}
		if _, err := tx.Exec(ctx, `UPDATE api_keys SET revoked_at = $1 WHERE team_id = $2 AND revoked_at IS NULL`, at.UTC(), id); err != nil {
			return fmt.Errorf("team %s: revoke its keys: %w", id, err)
		}
		if err := bumpKeys(ctx, tx); err != nil {
			return fmt.Errorf("team %s: %w", id, err)
		}
		return nil
	})
}

// refuseHeld is ErrConflict naming what team still owns, if anything.
func refuseHeld(ctx context.Context, tx pgx.Tx, team string) error {
	var held []string
	for _, table := range teamHoldings {
		var n int
		if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM `+table+` WHERE team_id = $1`, team).Scan(&n); err != nil {
			return fmt.Errorf("team %s: %w", team, err)
		}
		if n > 0 {
			held = append(held, fmt.Sprintf("%d %s", n, table))
		}
	}
	if len(held) > 0 {
		return errdefs.Conflictf("team %s still owns %s: remove them first", team, strings.Join(held, ", "))
	}
	return nil
}
