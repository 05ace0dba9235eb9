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

// CreateBuild implements store.Store.
func (s *DB) CreateBuild(ctx context.Context, b store.Build) error {
	store.StampBuild(&b, time.Now().UTC())
	data, _ := json.Marshal(b)
	_, err := s.pool.Exec(ctx, `INSERT INTO builds(id, template, data) VALUES ($1, $2, $3)`, b.ID, b.Template, string(data))
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
	return b, getJSON(ctx, s.pool, &b, "build", id, `SELECT data FROM builds WHERE id = $1`, id)
}

// UpdateBuild implements store.Store (the row locked from read to write).
func (s *DB) UpdateBuild(ctx context.Context, id string, fn func(*store.Build) error) (store.Build, error) {
	var b store.Build
	err := updateJSON(ctx, s, "build", id, `SELECT data FROM builds WHERE id = $1 FOR UPDATE`, &b,
		func(b *store.Build) (string, []any, error) {
			created := b.CreatedAt
			if err := fn(b); err != nil {
				return "", nil, err
			}
			b.ID, b.CreatedAt = id, created
			store.StampBuild(b, time.Now().UTC())
			data, _ := json.Marshal(b)
			return `UPDATE builds SET template = $2, data = $3 WHERE id = $1`, []any{id, b.Template, string(data)}, nil
		})
	if err != nil {
		return store.Build{}, err
	}
	return b, nil
}

// ListBuilds implements store.Store.
func (s *DB) ListBuilds(ctx context.Context, template string) ([]store.Build, error) {
	out, err := list[store.Build](ctx, s.pool, `SELECT data FROM builds WHERE template = $1 ORDER BY seq DESC`, template)
	if err != nil {
		return nil, fmt.Errorf("builds of %s: %w", template, err)
	}
	return out, nil
}

// DeleteBuilds implements store.Store (the logs go by the foreign key's
// cascade).
func (s *DB) DeleteBuilds(ctx context.Context, template string) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		b.Queue(`DELETE FROM builds WHERE template = $1`, template)
		b.Queue(`DELETE FROM template_tags WHERE template = $1`, template)
		return tx.SendBatch(ctx, b).Close()
	})
	if err != nil {
		return fmt.Errorf("builds of %s: %w", template, err)
	}
	return nil
}

// AppendBuildLogs implements store.Store. The build's row is locked
// (FOR UPDATE) from reading log_count to writing it, so concurrent
// appenders, on any replica, take turns.
func (s *DB) AppendBuildLogs(ctx context.Context, id string, logs ...store.BuildLog) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var stored int
		err := tx.QueryRow(ctx, `SELECT log_count FROM builds WHERE id = $1 FOR UPDATE`, id).Scan(&stored)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("build %s: %w", id, errdefs.ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("build %s logs: %w", id, err)
		}
		logs := store.CapBuildLogs(stored, logs)
		if len(logs) == 0 {
			return nil
		}
		data := make([]string, len(logs))
		for i, l := range logs {
			d, _ := json.Marshal(l)
			data[i] = string(d)
		}
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO build_logs(build_id, n, data)
			SELECT $1, $2 + i - 1, d FROM unnest($3::text[]) WITH ORDINALITY AS u(d, i)`, id, stored, data)
		b.Queue(`UPDATE builds SET log_count = $2 WHERE id = $1`, id, stored+len(logs))
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("build %s logs: %w", id, err)
		}
		return nil
	})
}

// BuildLogs implements store.Store. One read: the build's row joined
// with its entries from offset, so an unknown build (no row) and one with
// nothing there yet (one row without an entry) are told apart.
func (s *DB) BuildLogs(ctx context.Context, id string, offset, limit int) ([]store.BuildLog, error) {
	if offset < 0 {
		return nil, errdefs.Invalidf("build %s logs: offset %d", id, offset)
	}
	q := `SELECT l.data FROM builds b LEFT JOIN build_logs l ON l.build_id = b.id AND l.n >= $2
		WHERE b.id = $1 ORDER BY l.n`
	args := []any{id, offset}
	if limit > 0 {
		q += ` LIMIT $3`
		args = append(args, limit)
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("build %s logs: %w", id, err)
	}
	defer rows.Close()
	found := false
	var out []store.BuildLog
	for rows.Next() {
		found = true
		var data *string
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("build %s logs: %w", id, err)
		}
		if data == nil {
			continue // the build, without an entry from offset
		}
		var l store.BuildLog
		if err := json.Unmarshal([]byte(*data), &l); err != nil {
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
		t.CreatedAt = time.Now()
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO template_tags(template, tag, build_id, created_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT(template, tag) DO UPDATE SET build_id = excluded.build_id`,
		t.Template, t.Tag, t.BuildID, t.CreatedAt.Truncate(time.Microsecond)); err != nil {
		return fmt.Errorf("tag %s:%s: %w", t.Template, t.Tag, err)
	}
	return nil
}

// DeleteTag implements store.Store.
func (s *DB) DeleteTag(ctx context.Context, template, tag string) error {
	res, err := s.pool.Exec(ctx, `DELETE FROM template_tags WHERE template = $1 AND tag = $2`, template, tag)
	if err != nil {
		return fmt.Errorf("tag %s:%s: %w", template, tag, err)
	}
	if res.RowsAffected() == 0 {
		return fmt.Errorf("tag %s:%s: %w", template, tag, errdefs.ErrNotFound)
	}
	return nil
}

// ListTags implements store.Store.
func (s *DB) ListTags(ctx context.Context, template string) ([]store.TemplateTag, error) {
	rows, err := s.pool.Query(ctx, `SELECT template, tag, build_id, created_at FROM template_tags WHERE template = $1 ORDER BY tag`, template)
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
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tags of %s: %w", template, err)
	}
	return out, nil
}

// GetTag implements store.Store.
func (s *DB) GetTag(ctx context.Context, template, tag string) (store.TemplateTag, error) {
	t, err := scanTag(s.pool.QueryRow(ctx, `SELECT template, tag, build_id, created_at FROM template_tags WHERE template = $1 AND tag = $2`, template, tag).Scan)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.TemplateTag{}, fmt.Errorf("tag %s:%s: %w", template, tag, errdefs.ErrNotFound)
	}
	if err != nil {
		return store.TemplateTag{}, fmt.Errorf("tag %s:%s: %w", template, tag, err)
	}
	return t, nil
}

func scanTag(scan func(...any) error) (store.TemplateTag, error) {
	var t store.TemplateTag
	err := scan(&t.Template, &t.Tag, &t.BuildID, &t.CreatedAt)
	t.CreatedAt = t.CreatedAt.UTC()
	return t, err
}
