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

// Quotas are checked in the transaction that writes what they count.
// The team's row is read FOR SHARE (a DeleteTeam, which locks it FOR
// UPDATE, waits for the write or is waited for: nothing is made for a
// team that is gone); a team with quotas is then held by a transaction
// advisory lock of its own, so two replicas' checks of one team run one
// after the other and each sees what the other committed.

// teamQuotas reads a team's quotas, its row locked FOR SHARE.
func teamQuotas(ctx context.Context, q querier, team string) (store.Quotas, error) {
	var raw []byte
	err := q.QueryRow(ctx, `SELECT quotas FROM teams WHERE id = $1 FOR SHARE`, team).Scan(&raw)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Quotas{}, errdefs.NotFoundf("team %s not found", team)
	}
	if err != nil {
		return store.Quotas{}, fmt.Errorf("team %s: %w", team, err)
	}
	var qs store.Quotas
	if err := json.Unmarshal(raw, &qs); err != nil {
		return store.Quotas{}, fmt.Errorf("team %s: quotas: %w", team, err)
	}
	return qs, nil
}

// holdTeam serializes quota checks of one team until the transaction ends.
func holdTeam(ctx context.Context, q querier, team string) error {
	if _, err := q.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "spore-team-quota:"+team); err != nil {
		return fmt.Errorf("team %s: quota lock: %w", team, err)
	}
	return nil
}

const charged = `state IN ('creating', 'running', 'paused')`

func sandboxUse(ctx context.Context, q querier, team string) (store.TeamUsage, error) {
	var u store.TeamUsage
	err := q.QueryRow(ctx, `SELECT
		COUNT(*) FILTER (WHERE `+charged+`),
		COUNT(*) FILTER (WHERE state = 'hibernated'),
		COALESCE(SUM(vcpus) FILTER (WHERE `+charged+`), 0),
		COALESCE(SUM(memory_mb) FILTER (WHERE `+charged+`), 0)
		FROM sandboxes WHERE team_id = $1`, team).Scan(&u.Sandboxes, &u.Hibernated, &u.VCPUs, &u.MemoryMB)
	if err != nil {
		return u, fmt.Errorf("team %s: usage: %w", team, err)
	}
	return u, nil
}

func bytesUse(ctx context.Context, q querier, quota, team, except string) (n int, bytes int64, err error) {
	table := "snapshots"
	if quota == "volumeBytes" {
		table = "volumes"
	}
	err = q.QueryRow(ctx, `SELECT COUNT(*), COALESCE(SUM((data->>'sizeBytes')::bigint), 0) FROM `+table+` WHERE team_id = $1 AND id != $2`, team, except).Scan(&n, &bytes)
	if err != nil {
		err = fmt.Errorf("team %s: %s usage: %w", team, table, err)
	}
	return n, bytes, err
}

func readRate(ctx context.Context, q querier, team string) (store.Rate, error) {
	var r store.Rate
	err := q.QueryRow(ctx, `SELECT minute, count, prev FROM team_rates WHERE team_id = $1`, team).Scan(&r.Minute, &r.Count, &r.Prev)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Rate{}, nil
	}
	if err != nil {
		return r, fmt.Errorf("team %s: create rate: %w", team, err)
	}
	return r, nil
}

// quotaTx answers store.ChargeSandbox and store.ChargeBytes in a
// transaction.
type quotaTx struct{ q querier }

func (x quotaTx) TeamQuotas(ctx context.Context, team string) (store.Quotas, error) {
	return teamQuotas(ctx, x.q, team)
}

func (x quotaTx) HoldTeam(ctx context.Context, team string) error { return holdTeam(ctx, x.q, team) }

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
	if _, err := x.q.Exec(ctx, `INSERT INTO team_rates(team_id, minute, count, prev) VALUES ($1, $2, $3, $4)
		ON CONFLICT(team_id) DO UPDATE SET minute = excluded.minute, count = excluded.count, prev = excluded.prev`, team, r.Minute, r.Count, r.Prev); err != nil {
		return fmt.Errorf("team %s: create rate: %w", team, err)
	}
	return nil
}

// chargeSandbox is store.ChargeSandbox in transaction q.
func chargeSandbox(ctx context.Context, q querier, prev *store.Sandbox, next store.Sandbox) error {
	return store.ChargeSandbox(ctx, quotaTx{q}, time.Now(), prev, next)
}

// chargeBytes is store.ChargeBytes in transaction q.
func chargeBytes(ctx context.Context, q querier, team, quota, id string, prevSize, size int64) error {
	return store.ChargeBytes(ctx, quotaTx{q}, team, quota, id, prevSize, size)
}

// SetTeamQuotas implements store.Store.
func (s *DB) SetTeamQuotas(ctx context.Context, id string, qs store.Quotas) (store.Team, error) {
	if err := qs.Validate(); err != nil {
		return store.Team{}, err
	}
	raw, _ := json.Marshal(qs)
	tag, err := s.pool.Exec(ctx, `UPDATE teams SET quotas = $1 WHERE id = $2`, raw, id)
	if err != nil {
		return store.Team{}, fmt.Errorf("team %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return store.Team{}, errdefs.NotFoundf("team %s not found", id)
	}
	return s.GetTeam(ctx, id)
}

// TeamUsage implements store.Store.
func (s *DB) TeamUsage(ctx context.Context, id string) (store.TeamUsage, error) {
	var u store.TeamUsage
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{AccessMode: pgx.ReadOnly, IsoLevel: pgx.RepeatableRead}, func(tx pgx.Tx) error {
		var found string
		if err := tx.QueryRow(ctx, `SELECT id FROM teams WHERE id = $1`, id).Scan(&found); errors.Is(err, pgx.ErrNoRows) {
			return errdefs.NotFoundf("team %s not found", id)
		} else if err != nil {
			return fmt.Errorf("team %s: %w", id, err)
		}
		var err error
		if u, err = sandboxUse(ctx, tx, id); err != nil {
			return err
		}
		if u.Snapshots, u.SnapshotBytes, err = bytesUse(ctx, tx, "snapshotBytes", id, ""); err != nil {
			return err
		}
		if u.Volumes, u.VolumeBytes, err = bytesUse(ctx, tx, "volumeBytes", id, ""); err != nil {
			return err
		}
		r, err := readRate(ctx, tx, id)
		if err != nil {
			return err
		}
		now := time.Now()
		u.CreatesLastMinute = r.At(now).Estimate(now)
		return nil
	})
	return u, err
}
