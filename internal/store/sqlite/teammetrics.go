package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/spore-run/spore/internal/store"
)

// LiveSandboxes implements store.Store.
func (s *DB) LiveSandboxes(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT team_id, COUNT(*) FROM sandboxes
		WHERE state IN ('creating', 'running', 'paused') AND team_id != '' GROUP BY team_id`)
	if err != nil {
		return nil, fmt.Errorf("live sandboxes: %w", err)
	}
	return countsOf(rows, "live sandboxes")
}

// CountAuditActions implements store.Store.
func (s *DB) CountAuditActions(ctx context.Context, action string, since, until time.Time) (map[string]int, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT team_id, COUNT(*) FROM audit
		WHERE at >= ? AND at < ? AND action = ? GROUP BY team_id`, since.UnixMilli(), until.UnixMilli(), action)
	if err != nil {
		return nil, fmt.Errorf("audit: count %s: %w", action, err)
	}
	return countsOf(rows, "audit: count "+action)
}

func countsOf(rows *sql.Rows, what string) (map[string]int, error) {
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var team string
		var n int
		if err := rows.Scan(&team, &n); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out[team] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// NoteTeamSamples implements store.Store.
func (s *DB) NoteTeamSamples(ctx context.Context, samples []store.TeamSample) error {
	if len(samples) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("team samples: %w", err)
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO team_samples(team_id, at, concurrent, starts) VALUES (?, ?, ?, ?)
		ON CONFLICT(team_id, at) DO UPDATE SET concurrent = max(concurrent, excluded.concurrent), starts = max(starts, excluded.starts)`)
	if err != nil {
		return fmt.Errorf("team samples: %w", err)
	}
	defer stmt.Close()
	for _, x := range samples {
		if _, err := stmt.ExecContext(ctx, x.TeamID, x.At.Unix(), x.Concurrent, x.Starts); err != nil {
			return fmt.Errorf("team samples: %w", err)
		}
	}
	return tx.Commit()
}

// ListTeamSamples implements store.Store.
func (s *DB) ListTeamSamples(ctx context.Context, team string, since, until time.Time, bucket time.Duration) ([]store.TeamSample, error) {
	q, args, err := store.TeamSampleQuery(team, since, until, bucket)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("team %s: samples: %w", team, err)
	}
	defer rows.Close()
	out := []store.TeamSample{}
	for rows.Next() {
		x := store.TeamSample{TeamID: team}
		var at, starts int64
		if err := rows.Scan(&at, &x.Concurrent, &starts); err != nil {
			return nil, fmt.Errorf("team %s: samples: %w", team, err)
		}
		x.At, x.Starts = time.Unix(at, 0).UTC(), int(starts)
		out = append(out, x)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("team %s: samples: %w", team, err)
	}
	return out, nil
}

// TopTeamSample implements store.Store.
func (s *DB) TopTeamSample(ctx context.Context, team string, since, until time.Time, figure string) (store.TeamSample, bool, error) {
	q, args, err := store.TopTeamSampleQuery(team, since, until, figure)
	if err != nil {
		return store.TeamSample{}, false, err
	}
	x := store.TeamSample{TeamID: team}
	var at int64
	switch err := s.db.QueryRowContext(ctx, q, args...).Scan(&at, &x.Concurrent, &x.Starts); {
	case errors.Is(err, sql.ErrNoRows):
		return x, false, nil
	case err != nil:
		return x, false, fmt.Errorf("team %s: samples: %w", team, err)
	}
	x.At = time.Unix(at, 0).UTC()
	return x, true, nil
}

// PruneTeamSamples implements store.Store.
func (s *DB) PruneTeamSamples(ctx context.Context, before time.Time) (int, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM team_samples WHERE at < ?`, before.Unix())
	if err != nil {
		return 0, fmt.Errorf("team samples: prune: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// Census implements store.Store.
func (s *DB) Census(ctx context.Context) (store.Census, error) {
	var c store.Census
	rows, err := s.db.QueryContext(ctx, store.CensusSandboxesSQL)
	if err != nil {
		return c, fmt.Errorf("census: %w", err)
	}
	for rows.Next() {
		var x store.SandboxCount
		if err := rows.Scan(&x.NodeID, &x.State, &x.N); err != nil {
			rows.Close()
			return c, fmt.Errorf("census: %w", err)
		}
		c.Sandboxes = append(c.Sandboxes, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return c, fmt.Errorf("census: %w", err)
	}
	rows, err = s.db.QueryContext(ctx, store.CensusPooledSQL)
	if err != nil {
		return c, fmt.Errorf("census: %w", err)
	}
	for rows.Next() {
		var x store.PooledCount
		if err := rows.Scan(&x.TemplateID, &x.N); err != nil {
			rows.Close()
			return c, fmt.Errorf("census: %w", err)
		}
		c.Pooled = append(c.Pooled, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return c, fmt.Errorf("census: %w", err)
	}
	rows, err = s.db.QueryContext(ctx, `SELECT COALESCE(json_extract(data, '$.kind'), ''), COALESCE(json_extract(data, '$.storage'), ''),
		COUNT(*), COALESCE(SUM(json_extract(data, '$.sizeBytes')), 0) FROM snapshots GROUP BY 1, 2 ORDER BY 1, 2`)
	if err != nil {
		return c, fmt.Errorf("census: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var x store.SnapshotCount
		if err := rows.Scan(&x.Kind, &x.Storage, &x.N, &x.Bytes); err != nil {
			return c, fmt.Errorf("census: %w", err)
		}
		c.Snapshots = append(c.Snapshots, x)
	}
	return c, rows.Err()
}
