package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spore-run/spore/internal/store"
)

// LiveSandboxes implements store.Store.
func (s *DB) LiveSandboxes(ctx context.Context) (map[string]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT team_id, COUNT(*) FROM sandboxes
		WHERE state IN ('creating', 'running', 'paused') AND team_id != '' GROUP BY team_id`)
	if err != nil {
		return nil, fmt.Errorf("live sandboxes: %w", err)
	}
	return countsOf(rows, "live sandboxes")
}

// CountAuditActions implements store.Store.
func (s *DB) CountAuditActions(ctx context.Context, action string, since, until time.Time) (map[string]int, error) {
	rows, err := s.pool.Query(ctx, `SELECT team_id, COUNT(*) FROM audit
		WHERE at >= $1 AND at < $2 AND action = $3 GROUP BY team_id`, since.UnixMilli(), until.UnixMilli(), action)
	if err != nil {
		return nil, fmt.Errorf("audit: count %s: %w", action, err)
	}
	return countsOf(rows, "audit: count "+action)
}

func countsOf(rows pgx.Rows, what string) (map[string]int, error) {
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var team string
		var n int64
		if err := rows.Scan(&team, &n); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out[team] = int(n)
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
	b := &pgx.Batch{}
	for _, x := range samples {
		b.Queue(`INSERT INTO team_samples(team_id, at, concurrent, starts) VALUES ($1, $2, $3, $4)
			ON CONFLICT (team_id, at) DO UPDATE SET concurrent = GREATEST(team_samples.concurrent, excluded.concurrent),
			starts = GREATEST(team_samples.starts, excluded.starts)`, x.TeamID, x.At.Unix(), x.Concurrent, x.Starts)
	}
	if err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() }); err != nil {
		return fmt.Errorf("team samples: %w", err)
	}
	return nil
}

// ListTeamSamples implements store.Store.
func (s *DB) ListTeamSamples(ctx context.Context, team string, since, until time.Time, bucket time.Duration) ([]store.TeamSample, error) {
	q, args, err := store.TeamSampleQuery(team, since, until, bucket)
	if err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, numbered(q), args...)
	if err != nil {
		return nil, fmt.Errorf("team %s: samples: %w", team, err)
	}
	defer rows.Close()
	out := []store.TeamSample{}
	for rows.Next() {
		x := store.TeamSample{TeamID: team}
		var at, conc, starts int64
		if err := rows.Scan(&at, &conc, &starts); err != nil {
			return nil, fmt.Errorf("team %s: samples: %w", team, err)
		}
		x.At, x.Concurrent, x.Starts = time.Unix(at, 0).UTC(), int(conc), int(starts)
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
	var at, conc, starts int64
	switch err := s.pool.QueryRow(ctx, numbered(q), args...).Scan(&at, &conc, &starts); {
	case errors.Is(err, pgx.ErrNoRows):
		return x, false, nil
	case err != nil:
		return x, false, fmt.Errorf("team %s: samples: %w", team, err)
	}
	x.At, x.Concurrent, x.Starts = time.Unix(at, 0).UTC(), int(conc), int(starts)
	return x, true, nil
}

// PruneTeamSamples implements store.Store.
func (s *DB) PruneTeamSamples(ctx context.Context, before time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM team_samples WHERE at < $1`, before.Unix())
	if err != nil {
		return 0, fmt.Errorf("team samples: prune: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Census implements store.Store.
func (s *DB) Census(ctx context.Context) (store.Census, error) {
	var c store.Census
	rows, err := s.pool.Query(ctx, store.CensusSandboxesSQL)
	if err != nil {
		return c, fmt.Errorf("census: %w", err)
	}
	for rows.Next() {
		var x store.SandboxCount
		var n int64
		if err := rows.Scan(&x.NodeID, &x.State, &n); err != nil {
			rows.Close()
			return c, fmt.Errorf("census: %w", err)
		}
		x.N = int(n)
		c.Sandboxes = append(c.Sandboxes, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return c, fmt.Errorf("census: %w", err)
	}
	rows, err = s.pool.Query(ctx, store.CensusPooledSQL)
	if err != nil {
		return c, fmt.Errorf("census: %w", err)
	}
	for rows.Next() {
		var x store.PooledCount
		var n int64
		if err := rows.Scan(&x.TemplateID, &n); err != nil {
			rows.Close()
			return c, fmt.Errorf("census: %w", err)
		}
		x.N = int(n)
		c.Pooled = append(c.Pooled, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return c, fmt.Errorf("census: %w", err)
	}
	rows, err = s.pool.Query(ctx, `SELECT COALESCE(data->>'kind', ''), COALESCE(data->>'storage', ''),
		COUNT(*), COALESCE(SUM((data->>'sizeBytes')::bigint), 0) FROM snapshots GROUP BY 1, 2 ORDER BY 1, 2`)
	if err != nil {
		return c, fmt.Errorf("census: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var x store.SnapshotCount
		var n int64
		if err := rows.Scan(&x.Kind, &x.Storage, &n, &x.Bytes); err != nil {
			return c, fmt.Errorf("census: %w", err)
		}
		x.N = int(n)
		c.Snapshots = append(c.Snapshots, x)
	}
	return c, rows.Err()
}
