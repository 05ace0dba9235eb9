package sqlite

import (
	"context"
	"fmt"
	"time"

	"github.com/spore-run/spore/internal/store"
)

// AppendAudit implements store.Store.
func (s *DB) AppendAudit(ctx context.Context, recs []store.AuditRecord) error {
	if len(recs) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	defer tx.Rollback()
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO audit(at, team_id, key_id, key_name, kind, action, resource, status, remote, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	defer stmt.Close()
	for _, r := range recs {
		if _, err := stmt.ExecContext(ctx, r.At.UnixMilli(), r.TeamID, r.KeyID, r.KeyName, r.Kind, r.Action, r.Resource, r.Status, r.Remote, r.Detail); err != nil {
			return fmt.Errorf("audit: %w", err)
		}
	}
	return tx.Commit()
}

// ListAudit implements store.Store.
func (s *DB) ListAudit(ctx context.Context, f store.AuditFilter) ([]store.AuditRecord, string, error) {
	q, args, err := store.AuditQuery(f)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("audit: %w", err)
	}
	defer rows.Close()
	out := []store.AuditRecord{}
	for rows.Next() {
		r, err := store.ScanAudit(rows)
		if err != nil {
			return nil, "", fmt.Errorf("audit: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("audit: %w", err)
	}
	out, next := store.AuditPage(out, f)
	return out, next, nil
}

// PruneAudit implements store.Store.
func (s *DB) PruneAudit(ctx context.Context, before time.Time, limit int) (int, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM audit WHERE seq IN (SELECT seq FROM audit WHERE at < ? ORDER BY at LIMIT ?)`, before.UnixMilli(), limit)
	if err != nil {
		return 0, fmt.Errorf("audit: prune: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}
