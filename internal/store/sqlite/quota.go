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

// Quotas are checked in the transaction that writes what they count; a
// SQLite transaction here is IMMEDIATE (it holds the write lock from its
// start), so two checks of one team never interleave.

type txq interface {
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
	ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
}

// teamQuotas reads a team's quotas; a team that does not exist (removed
// meanwhile) is ErrNotFound: nothing is made for it.
func teamQuotas(ctx context.Context, q txq, team string) (store.Quotas, error) {
	var raw string
	err := q.QueryRowContext(ctx, `SELECT quotas FROM teams WHERE id = ?`, team).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Quotas{}, errdefs.NotFoundf("team %s not found", team)
	}
	if err != nil {
		return store.Quotas{}, fmt.Errorf("team %s: %w", team, err)
	}
	var qs store.Quotas
	if err := json.Unmarshal([]byte(raw), &qs); err != nil {
		return store.Quotas{}, fmt.Errorf("team %s: quotas: %w", team, err)
	}
	return qs, nil
}

// sandboxUse is what a team's sandbox rows hold now.
func sandboxUse(ctx context.Context, q txq, team string) (store.TeamUsage, error) {
	var u store.TeamUsage
	err := q.QueryRowContext(ctx, `SELECT
		COUNT(*) FILTER (WHERE state IN ('creating', 'running', 'paused')),
		COUNT(*) FILTER (WHERE state = 'hibernated'),
		COALESCE(SUM(vcpus) FILTER (WHERE state IN ('creating', 'running', 'paused')), 0),
		COALESCE(SUM(memory_mb) FILTER (WHERE state IN ('creating', 'running', 'paused')), 0)
		FROM sandboxes WHERE team_id = ?`, team).Scan(&u.Sandboxes, &u.Hibernated, &u.VCPUs, &u.MemoryMB)
	if err != nil {
		return u, fmt.Errorf("team %s: usage: %w", team, err)
	}
	return u, nil
}

func snapshotUse(ctx context.Context, q txq, team, except string) (n int, bytes int64, err error) {
	err = q.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(json_extract(data, '$.sizeBytes')), 0) FROM snapshots WHERE team_id = ? AND id != ?`, team, except).Scan(&n, &bytes)
	if err != nil {
		err = fmt.Errorf("team %s: snapshot usage: %w", team, err)
	}
	return n, bytes, err
}

func volumeUse(ctx context.Context, q txq, team, except string) (n int, bytes int64, err error) {
	err = q.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(json_extract(data, '$.sizeBytes')), 0) FROM volumes WHERE team_id = ? AND id != ?`, team, except).Scan(&n, &bytes)
	if err != nil {
		err = fmt.Errorf("team %s: volume usage: %w", team, err)
	}
	return n, bytes, err
}

func readRate(ctx context.Context, q txq, team string) (store.Rate, error) {
	var r store.Rate
	err := q.QueryRowContext(ctx, `SELECT minute, count, prev FROM team_rates WHERE team_id = ?`, team).Scan(&r.Minute, &r.Count, &r.Prev)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Rate{}, nil
	}
	if err != nil {
		return r, fmt.Errorf("team %s: create rate: %w", team, err)
	}
	return r, nil
}

// chargeSandbox checks writing next over prev (nil: a new row) against
// next's team's quotas, and counts a create in its rate.
func (s *DB) chargeSandbox(ctx context.Context, q txq, prev *store.Sandbox, next store.Sandbox) error {
	grows, creates := store.Grows(prev, next)
	if !grows {
		return nil
	}
	team := next.TeamID
	qs, err := teamQuotas(ctx, q, team)
	if err != nil || qs.Zero() {
		return err
	}
	c, p := store.ChargeOf(next), store.Charge{}
	if prev != nil && prev.TeamID == team {
		p = store.ChargeOf(*prev)
	}
	use, err := sandboxUse(ctx, q, team)
	if err != nil {
		return err
	}
	add := store.Charge{Sandboxes: max(0, c.Sandboxes-p.Sandboxes), VCPUs: max(0, c.VCPUs-p.VCPUs), MemoryMB: max(0, c.MemoryMB-p.MemoryMB)}
	if err := store.CheckCharge(team, qs, use, add); err != nil {
		return err
	}
	if !creates || qs.CreatesPerMinute == 0 {
		return nil
	}
	r, err := readRate(ctx, q, team)
	if err != nil {
		return err
	}
	if r, err = r.Take(team, s.now(), 1, qs.CreatesPerMinute); err != nil {
		return err
	}
	if _, err := q.ExecContext(ctx, `INSERT INTO team_rates(team_id, minute, count, prev) VALUES (?, ?, ?, ?)
		ON CONFLICT(team_id) DO UPDATE SET minute = excluded.minute, count = excluded.count, prev = excluded.prev`, team, r.Minute, r.Count, r.Prev); err != nil {
		return fmt.Errorf("team %s: create rate: %w", team, err)
	}
	return nil
}

// chargeBytes checks a snapshot's or volume's row (id, size) against its
// team's quota; prevSize is the stored row's size (-1: a new row).
func chargeBytes(ctx context.Context, q txq, team, quota, id string, prevSize, size int64) error {
	if team == "" || size <= max(prevSize, 0) {
		return nil
	}
	qs, err := teamQuotas(ctx, q, team)
	if errdefs.IsNotFound(err) {
		return nil // no team row: no quota (only a sandbox needs its team)
	}
	if err != nil {
		return err
	}
	limit := qs.SnapshotBytes
	use := snapshotUse
	if quota == "volumeBytes" {
		limit, use = qs.VolumeBytes, volumeUse
	}
	if limit == 0 {
		return nil
	}
	_, used, err := use(ctx, q, team, id)
	if err != nil {
		return err
	}
	return store.CheckBytes(team, quota, limit, used, size)
}

// SetTeamQuotas implements store.Store.
func (s *DB) SetTeamQuotas(ctx context.Context, id string, qs store.Quotas) (store.Team, error) {
	if err := qs.Validate(); err != nil {
		return store.Team{}, err
	}
	raw, _ := json.Marshal(qs)
	res, err := s.db.ExecContext(ctx, `UPDATE teams SET quotas = ? WHERE id = ?`, string(raw), id)
	if err != nil {
		return store.Team{}, fmt.Errorf("team %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.Team{}, errdefs.NotFoundf("team %s not found", id)
	}
	return s.GetTeam(ctx, id)
}

// TeamUsage implements store.Store.
func (s *DB) TeamUsage(ctx context.Context, id string) (store.TeamUsage, error) {
	tx := s.db // reads: each a consistent view, not all one
	if _, err := teamQuotas(ctx, tx, id); err != nil {
		return store.TeamUsage{}, err
	}
	u, err := sandboxUse(ctx, tx, id)
	if err != nil {
		return u, err
	}
	if u.Snapshots, u.SnapshotBytes, err = snapshotUse(ctx, tx, id, ""); err != nil {
		return u, err
	}
	if u.Volumes, u.VolumeBytes, err = volumeUse(ctx, tx, id, ""); err != nil {
		return u, err
	}
	r, err := readRate(ctx, tx, id)
	if err != nil {
		return u, err
	}
	now := s.now()
	u.CreatesLastMinute = r.At(now).Estimate(now)
	return u, nil
}
