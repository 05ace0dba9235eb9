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

// getJSON reads the data column of the row of table whose key column is
// key and decodes it into v; kind names the record in errors.
func getJSON(ctx context.Context, q querier, table, col, key, kind string, v any) error {
	var data string
	err := q.QueryRowContext(ctx, `SELECT data FROM `+table+` WHERE `+col+` = ?`, key).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%s %s: %w", kind, key, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", kind, key, err)
	}
	if err := json.Unmarshal([]byte(data), v); err != nil {
		return fmt.Errorf("%s %s: decode: %w", kind, key, err)
	}
	return nil
}

// putJSON inserts or replaces the row of table keyed by key.
func putJSON(ctx context.Context, tx *sql.Tx, table, col, key string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO `+table+`(`+col+`, data) VALUES (?, ?)
		ON CONFLICT(`+col+`) DO UPDATE SET data = excluded.data`, key, string(data))
	return err
}

// listJSON decodes every row of table, ordered by its key.
func listJSON[T any](ctx context.Context, db *sql.DB, table, col string) ([]T, error) {
	rows, err := db.QueryContext(ctx, `SELECT data FROM `+table+` ORDER BY `+col)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		var v T
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			return nil, fmt.Errorf("%s: decode: %w", table, err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func (s *DB) deleteRow(ctx context.Context, table, col, key, kind string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM `+table+` WHERE `+col+` = ?`, key)
	if err != nil {
		return fmt.Errorf("%s %s: %w", kind, key, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%s %s: %w", kind, key, errdefs.ErrNotFound)
	}
	return nil
}

// PutTemplate implements store.Store.
func (s *DB) PutTemplate(ctx context.Context, t store.Template) (store.Template, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.Template{}, err
	}
	defer tx.Rollback()
	var old store.Template
	switch err := getJSON(ctx, tx, "templates", "name", t.Name, "template", &old); {
	case err == nil:
		t.CreatedAt = old.CreatedAt
	case !errdefs.IsNotFound(err):
		return store.Template{}, err
	}
	now := s.now().UTC()
	if t.CreatedAt.IsZero() {
		t.CreatedAt = now
	}
	t.UpdatedAt = now
	if err := putJSON(ctx, tx, "templates", "name", t.Name, t); err != nil {
		return store.Template{}, fmt.Errorf("template %s: %w", t.Name, err)
	}
	return t, tx.Commit()
}

// GetTemplate implements store.Store.
func (s *DB) GetTemplate(ctx context.Context, name string) (store.Template, error) {
	var t store.Template
	return t, getJSON(ctx, s.db, "templates", "name", name, "template", &t)
}

// ListTemplates implements store.Store.
func (s *DB) ListTemplates(ctx context.Context) ([]store.Template, error) {
	return listJSON[store.Template](ctx, s.db, "templates", "name")
}

// UpdateTemplate implements store.Store.
func (s *DB) UpdateTemplate(ctx context.Context, name string, fn func(*store.Template) error) (store.Template, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.Template{}, err
	}
	defer tx.Rollback()
	var t store.Template
	if err := getJSON(ctx, tx, "templates", "name", name, "template", &t); err != nil {
		return store.Template{}, err
	}
	created := t.CreatedAt
	if err := fn(&t); err != nil {
		return store.Template{}, err
	}
	t.Name, t.CreatedAt, t.UpdatedAt = name, created, s.now().UTC()
	if err := putJSON(ctx, tx, "templates", "name", name, t); err != nil {
		return store.Template{}, fmt.Errorf("template %s: %w", name, err)
	}
	return t, tx.Commit()
}

// DeleteTemplate implements store.Store.
func (s *DB) DeleteTemplate(ctx context.Context, name string) error {
	return s.deleteRow(ctx, "templates", "name", name, "template")
}

// UpsertNode implements store.Store.
func (s *DB) UpsertNode(ctx context.Context, n store.Node) (store.Node, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.Node{}, err
	}
	defer tx.Rollback()
	var old store.Node
	switch err := getJSON(ctx, tx, "nodes", "id", n.ID, "node", &old); {
	case err == nil:
		n.Draining, n.JoinedAt = old.Draining, old.JoinedAt
	case !errdefs.IsNotFound(err):
		return store.Node{}, err
	}
	if n.JoinedAt.IsZero() {
		n.JoinedAt = s.now().UTC()
	}
	if err := putJSON(ctx, tx, "nodes", "id", n.ID, n); err != nil {
		return store.Node{}, fmt.Errorf("node %s: %w", n.ID, err)
	}
	return n, tx.Commit()
}

// GetNode implements store.Store.
func (s *DB) GetNode(ctx context.Context, id string) (store.Node, error) {
	var n store.Node
	return n, getJSON(ctx, s.db, "nodes", "id", id, "node", &n)
}

// ListNodes implements store.Store.
func (s *DB) ListNodes(ctx context.Context) ([]store.Node, error) {
	return listJSON[store.Node](ctx, s.db, "nodes", "id")
}

// UpdateNode implements store.Store.
func (s *DB) UpdateNode(ctx context.Context, id string, fn func(*store.Node) error) (store.Node, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.Node{}, err
	}
	defer tx.Rollback()
	var n store.Node
	if err := getJSON(ctx, tx, "nodes", "id", id, "node", &n); err != nil {
		return store.Node{}, err
	}
	if err := fn(&n); err != nil {
		return store.Node{}, err
	}
	n.ID = id
	if err := putJSON(ctx, tx, "nodes", "id", id, n); err != nil {
		return store.Node{}, fmt.Errorf("node %s: %w", id, err)
	}
	return n, tx.Commit()
}

// DeleteNode implements store.Store.
func (s *DB) DeleteNode(ctx context.Context, id string) error {
	return s.deleteRow(ctx, "nodes", "id", id, "node")
}

// AcquireLease implements store.Store. One statement: SQLite's write lock
// makes the check (free, expired or ours) and the take one step.
func (s *DB) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	if name == "" || holder == "" || ttl <= 0 {
		return false, errdefs.Invalidf("lease %q for %q with ttl %s", name, holder, ttl)
	}
	now := s.now()
	res, err := s.db.ExecContext(ctx, `INSERT INTO leases(name, holder, expires_at) VALUES (?, ?, ?)
		ON CONFLICT(name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
		WHERE leases.holder = excluded.holder OR leases.expires_at <= ?`,
		name, holder, now.Add(ttl).UnixMicro(), now.UnixMicro())
	if err != nil {
		return false, fmt.Errorf("lease %s: %w", name, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("lease %s: %w", name, err)
	}
	return n == 1, nil
}

// ReleaseLease implements store.Store.
func (s *DB) ReleaseLease(ctx context.Context, name, holder string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM leases WHERE name = ? AND holder = ?`, name, holder); err != nil {
		return fmt.Errorf("lease %s: %w", name, err)
	}
	return nil
}

// ResolveRef implements store.Store: the four lookups in one statement,
// ranked.
func (s *DB) ResolveRef(ctx context.Context, team, ref string) (store.Ref, error) {
	var rank int
	var data string
	err := s.db.QueryRowContext(ctx, `SELECT 0, data FROM snapshots WHERE id = ?1 AND (?2 = '' OR team_id = ?2)
		UNION ALL SELECT 1, s.data FROM snapshots s JOIN snapshot_names n ON n.snapshot_id = s.id WHERE n.name = ?1 AND ?2 != '' AND n.team_id = ?2
		UNION ALL SELECT 2, data FROM templates WHERE name = ?3 AND ?3 != ?1
		UNION ALL SELECT 3, data FROM templates WHERE name = ?1
		ORDER BY 1 LIMIT 1`, ref, team, store.TemplateKey(team, ref)).Scan(&rank, &data)
	return store.DecodeRef(err, rank, []byte(data), ref, sql.ErrNoRows)
}
