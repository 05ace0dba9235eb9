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

func bytesUse(ctx context.Context, q txq, quota, team, except string) (n int, bytes int64, err error) {
	table := "snapshots"
	if quota == "volumeBytes" {
		table = "volumes"
	}
	err = q.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(json_extract(data, '$.sizeBytes')), 0) FROM `+table+` WHERE team_id = ? AND id != ?`, team, except).Scan(&n, &bytes)
	if err != nil {
		err = fmt.Errorf("team %s: %s usage: %w", team, table, err)
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

// quotaTx answers store.ChargeSandbox and store.ChargeBytes in a
// transaction; HoldTeam has nothing to do (the transaction holds the
// database's write lock).
type quotaTx struct{ q txq }

func (x quotaTx) TeamQuotas(ctx context.Context, team string) (store.Quotas, error) {
	return teamQuotas(ctx, x.q, team)
}

func (quotaTx) HoldTeam(context.Context, string) error { return nil }

func (x quotaTx) SandboxUse(ctx context.Context, team string) (store.TeamUsage, error) {
	return sandboxUse(ctx, x.q, team)
}

func (x quotaTx) BytesUse(ctx context.Context, quota, team, except string) (int64, error) {
	_, b, err := bytesUse(ctx, x.q, quota, team, except)
	return b, err
}

func (x quotaTx) CreateRate(ctx context.Context, team string) (store.Rate, error) {
	return readRate(ctx, x.q, team)
}

func (x quotaTx) SetCreateRate(ctx context.Context, team string, r store.Rate) error {
	if _, err := x.q.ExecContext(ctx, `INSERT INTO team_rates(team_id, minute, count, prev) VALUES (?, ?, ?, ?)
		ON CONFLICT(team_id) DO UPDATE SET minute = excluded.minute, count = excluded.count, prev = excluded.prev`, team, r.Minute, r.Count, r.Prev); err != nil {
		return fmt.Errorf("team %s: create rate: %w", team, err)
	}
	return nil
}

// chargeSandbox is store.ChargeSandbox in transaction q.
func (s *DB) chargeSandbox(ctx context.Context, q txq, prev *store.Sandbox, next store.Sandbox) error {
	return store.ChargeSandbox(ctx, quotaTx{q}, s.now(), prev, next)
}

// chargeBytes is store.ChargeBytes in transaction q.
func chargeBytes(ctx context.Context, q txq, team, quota, id string, prevSize, size int64) error {
	return store.ChargeBytes(ctx, quotaTx{q}, team, quota, id, prevSize, size)
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
	if u.Snapshots, u.SnapshotBytes, err = bytesUse(ctx, tx, "snapshotBytes", id, ""); err != nil {
		return u, err
	}
	if u.Volumes, u.VolumeBytes, err = bytesUse(ctx, tx, "volumeBytes", id, ""); err != nil {
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
