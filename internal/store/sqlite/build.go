package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// CreateBuild implements store.Store.
func (s *DB) CreateBuild(ctx context.Context, b store.Build) error {
	store.StampBuild(&b, s.now().UTC())
	data, _ := json.Marshal(b)
	_, err := s.db.ExecContext(ctx, `INSERT INTO builds(id, template, data) VALUES (?, ?, ?)`, b.ID, b.Template, string(data))
	if isUnique(err) {
		return fmt.Errorf("build %s: %w", b.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create build %s: %w", b.ID, err)
	}
	return nil
}

// GetBuild implements store.Store.
func (s *DB) GetBuild(ctx context.Context, id string) (store.Build, error) {
	var b store.Build
	return b, getJSON(ctx, s.db, "builds", "id", id, "build", &b)
}

// UpdateBuild implements store.Store: the transaction is IMMEDIATE, so it
// holds the write lock from the read to the write.
func (s *DB) UpdateBuild(ctx context.Context, id string, fn func(*store.Build) error) (store.Build, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.Build{}, fmt.Errorf("build %s: %w", id, err)
	}
	defer tx.Rollback()
	var b store.Build
	if err := getJSON(ctx, tx, "builds", "id", id, "build", &b); err != nil {
		return store.Build{}, err
	}
	created := b.CreatedAt
	if err := fn(&b); err != nil {
		return store.Build{}, err
	}
	b.ID, b.CreatedAt = id, created
	store.StampBuild(&b, s.now().UTC())
	data, _ := json.Marshal(b)
	if _, err := tx.ExecContext(ctx, `UPDATE builds SET template = ?, data = ? WHERE id = ?`, b.Template, string(data), id); err != nil {
		return store.Build{}, fmt.Errorf("build %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return store.Build{}, fmt.Errorf("build %s: %w", id, err)
	}
	return b, nil
}

// ListBuilds implements store.Store.
func (s *DB) ListBuilds(ctx context.Context, template string) ([]store.Build, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT data FROM builds WHERE template = ? ORDER BY seq DESC`, template)
	if err != nil {
		return nil, fmt.Errorf("builds of %s: %w", template, err)
	}
	return decodeRows[store.Build](rows, "build")
}

// decodeRows decodes the one data column of every row, and closes rows.
func decodeRows[T any](rows *sql.Rows, kind string) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		var v T
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			return nil, fmt.Errorf("%s: decode: %w", kind, err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// DeleteBuilds implements store.Store (the logs go by the foreign key's
// cascade).
func (s *DB) DeleteBuilds(ctx context.Context, template string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("builds of %s: %w", template, err)
	}
	defer tx.Rollback()
	for _, q := range []string{`DELETE FROM builds WHERE template = ?`, `DELETE FROM template_tags WHERE template = ?`} {
		if _, err := tx.ExecContext(ctx, q, template); err != nil {
			return fmt.Errorf("builds of %s: %w", template, err)
		}
	}
	return tx.Commit()
}

// AppendBuildLogs implements store.Store. The IMMEDIATE transaction holds
// the database's write lock from reading log_count to writing it, so
// concurrent appenders (also other processes) take turns.
func (s *DB) AppendBuildLogs(ctx context.Context, id string, logs ...store.BuildLog) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("build %s logs: %w", id, err)
	}
	defer tx.Rollback()
	var stored int
	err = tx.QueryRowContext(ctx, `SELECT log_count FROM builds WHERE id = ?`, id).Scan(&stored)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("build %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("build %s logs: %w", id, err)
	}
	logs = store.CapBuildLogs(stored, logs)
	if len(logs) == 0 {
		return nil
	}
	ins, err := tx.PrepareContext(ctx, `INSERT INTO build_logs(build_id, n, data) VALUES (?, ?, ?)`)
	if err != nil {
		return fmt.Errorf("build %s logs: %w", id, err)
	}
	defer ins.Close()
	for i, l := range logs {
		data, _ := json.Marshal(l)
		if _, err := ins.ExecContext(ctx, id, stored+i, string(data)); err != nil {
			return fmt.Errorf("build %s logs: %w", id, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE builds SET log_count = ? WHERE id = ?`, stored+len(logs), id); err != nil {
		return fmt.Errorf("build %s logs: %w", id, err)
	}
	return tx.Commit()
}

// BuildLogs implements store.Store. One read: the build's row joined
// with its entries from offset, so an unknown build (no row) and one with
// nothing there yet (one row without an entry) are told apart.
func (s *DB) BuildLogs(ctx context.Context, id string, offset, limit int) ([]store.BuildLog, error) {
	if offset < 0 {
		return nil, errdefs.Invalidf("build %s logs: offset %d", id, offset)
	}
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	rows, err := s.db.QueryContext(ctx, `SELECT l.data FROM builds b LEFT JOIN build_logs l ON l.build_id = b.id AND l.n >= ?
		WHERE b.id = ? ORDER BY l.n LIMIT ?`, offset, id, limit)
	if err != nil {
		return nil, fmt.Errorf("build %s logs: %w", id, err)
	}
	defer rows.Close()
	found := false
	var out []store.BuildLog
	for rows.Next() {
		found = true
		var data sql.NullString
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("build %s logs: %w", id, err)
		}
		if !data.Valid {
			continue // the build, without an entry from offset
		}
		var l store.BuildLog
		if err := json.Unmarshal([]byte(data.String), &l); err != nil {
			return nil, fmt.Errorf("build %s logs: decode: %w", id, err)
		}
		out = append(out, l)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("build %s logs: %w", id, err)
	}
	if !found {
		return nil, fmt.Errorf("build %s: %w", id, errdefs.ErrNotFound)
	}
	return out, nil
}

// SetTag implements store.Store. One statement: a concurrent set of the
// same tag cannot lose its first CreatedAt.
func (s *DB) SetTag(ctx context.Context, t store.TemplateTag) error {
	if t.CreatedAt.IsZero() {
		t.CreatedAt = s.now()
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO template_tags(template, tag, build_id, created_at) VALUES (?, ?, ?, ?)
		ON CONFLICT(template, tag) DO UPDATE SET build_id = excluded.build_id`,
		t.Template, t.Tag, t.BuildID, t.CreatedAt.UnixMicro()); err != nil {
		return fmt.Errorf("tag %s:%s: %w", t.Template, t.Tag, err)
	}
	return nil
}

// DeleteTag implements store.Store.
func (s *DB) DeleteTag(ctx context.Context, template, tag string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM template_tags WHERE template = ? AND tag = ?`, template, tag)
	if err != nil {
		return fmt.Errorf("tag %s:%s: %w", template, tag, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("tag %s:%s: %w", template, tag, errdefs.ErrNotFound)
	}
	return nil
}

// ListTags implements store.Store.
func (s *DB) ListTags(ctx context.Context, template string) ([]store.TemplateTag, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT template, tag, build_id, created_at FROM template_tags WHERE template = ? ORDER BY tag`, template)
	if err != nil {
		return nil, fmt.Errorf("tags of %s: %w", template, err)
	}
	defer rows.Close()
	var out []store.TemplateTag
	for rows.Next() {
		t, err := scanTag(rows.Scan)
		if err != nil {
			return nil, fmt.Errorf("tags of %s: %w", template, err)
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// GetTag implements store.Store.
func (s *DB) GetTag(ctx context.Context, template, tag string) (store.TemplateTag, error) {
	t, err := scanTag(s.db.QueryRowContext(ctx, `SELECT template, tag, build_id, created_at FROM template_tags WHERE template = ? AND tag = ?`, template, tag).Scan)
	if errors.Is(err, sql.ErrNoRows) {
		return store.TemplateTag{}, fmt.Errorf("tag %s:%s: %w", template, tag, errdefs.ErrNotFound)
	}
	if err != nil {
		return store.TemplateTag{}, fmt.Errorf("tag %s:%s: %w", template, tag, err)
	}
	return t, nil
}

func scanTag(scan func(...any) error) (store.TemplateTag, error) {
	var t store.TemplateTag
	var created int64
	err := scan(&t.Template, &t.Tag, &t.BuildID, &created)
	t.CreatedAt = time.UnixMicro(created).UTC()
	return t, err
}
