package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// CreateTeam implements store.Store.
func (s *DB) CreateTeam(ctx context.Context, t store.Team) error {
	if t.CreatedAt.IsZero() {
		t.CreatedAt = s.now().UTC()
	}
	if err := t.Quotas.Validate(); err != nil {
		return err
	}
	quotas, _ := json.Marshal(t.Quotas)
	_, err := s.db.ExecContext(ctx, `INSERT INTO teams(id, name, created_at, quotas) VALUES (?, ?, ?, ?)`, t.ID, t.Name, t.CreatedAt.UnixMilli(), string(quotas))
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
	var created int64
	var quotas string
	if err := sc.Scan(&t.ID, &t.Name, &created, &quotas); err != nil {
		return t, err
	}
	t.CreatedAt = time.UnixMilli(created).UTC()
	if err := json.Unmarshal([]byte(quotas), &t.Quotas); err != nil {
		return t, fmt.Errorf("team %s: quotas: %w", t.ID, err)
	}
	return t, nil
}

// GetTeam implements store.Store.
func (s *DB) GetTeam(ctx context.Context, ref string) (store.Team, error) {
	t, err := scanTeam(s.db.QueryRowContext(ctx, `SELECT id, name, created_at, quotas FROM teams WHERE id = ?1 OR name = ?1 ORDER BY id = ?1 DESC LIMIT 1`, ref))
	if errors.Is(err, sql.ErrNoRows) {
		return t, errdefs.NotFoundf("team %s not found", ref)
	}
	if err != nil {
		return t, fmt.Errorf("team %s: %w", ref, err)
	}
	return t, nil
}

// ListTeams implements store.Store.
func (s *DB) ListTeams(ctx context.Context) ([]store.Team, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, name, created_at, quotas FROM teams ORDER BY seq`)
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

// teamHoldings are the tables whose rows a team owns, as DeleteTeam
// names them.
var teamHoldings = []struct{ table, what string }{
	{"sandboxes", "sandboxes"}, {"snapshots", "snapshots"}, {"secrets", "secrets"}, {"volumes", "volumes"},
}

// DeleteTeam implements store.Store.
func (s *DB) DeleteTeam(ctx context.Context, id string, at time.Time) error {
	if id == store.DefaultTeam {
		return errdefs.Conflictf("team %s is the default team: it is never removed", id)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var held []string
	for _, h := range teamHoldings {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+h.table+` WHERE team_id = ?`, id).Scan(&n); err != nil {
			return fmt.Errorf("team %s: %w", id, err)
		}
		if n > 0 {
			held = append(held, fmt.Sprintf("%d %s", n, h.what))
		}
	}
	if len(held) > 0 {
		return errdefs.Conflictf("team %s still owns %s: remove them first", id, strings.Join(held, ", "))
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM team_rates WHERE team_id = ?`, id); err != nil {
		return fmt.Errorf("team %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM team_samples WHERE team_id = ?`, id); err != nil {
		return fmt.Errorf("team %s: %w", id, err)
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM teams WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("team %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.NotFoundf("team %s not found", id)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ? WHERE team_id = ? AND revoked_at = 0`, at.UTC().UnixMilli(), id); err != nil {
		return fmt.Errorf("team %s: revoke its keys: %w", id, err)
	}
	if err := bumpKeys(ctx, tx); err != nil {
		return fmt.Errorf("team %s: %w", id, err)
	}
	return tx.Commit()
}
