package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spore-run/spore/internal/store"
)

// AppendAudit implements store.Store: one COPY-free batch of inserts in a
// transaction (pgx sends the batch in one round trip).
func (s *DB) AppendAudit(ctx context.Context, recs []store.AuditRecord) error {
	if len(recs) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, r := range recs {
		b.Queue(`INSERT INTO audit(at, team_id, key_id, key_name, kind, action, resource, status, remote, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
			r.At.UnixMilli(), r.TeamID, r.KeyID, r.KeyName, r.Kind, r.Action, r.Resource, r.Status, r.Remote, r.Detail)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() })
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	return nil
}

// ListAudit implements store.Store.
func (s *DB) ListAudit(ctx context.Context, f store.AuditFilter) ([]store.AuditRecord, string, error) {
	q, args, err := store.AuditQuery(f)
	if err != nil {
		return nil, "", err
	}
	rows, err := s.pool.Query(ctx, numbered(q), args...)
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
	tag, err := s.pool.Exec(ctx, `DELETE FROM audit WHERE seq IN (SELECT seq FROM audit WHERE at < $1 ORDER BY at LIMIT $2)`, before.UnixMilli(), limit)
	if err != nil {
		return 0, fmt.Errorf("audit: prune: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// numbered turns a query's "?" placeholders into $1, $2, ...
func numbered(q string) string {
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}
