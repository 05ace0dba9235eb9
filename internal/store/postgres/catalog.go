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

// PutSnapshot implements store.Store (insert or replace, names included).
func (s *DB) PutSnapshot(ctx context.Context, sn store.Snapshot) error {
	return s.writeSnapshot(ctx, sn, `INSERT INTO snapshots(id, sandbox_id, data, team_id) VALUES ($1, $2, $3, $4)
		ON CONFLICT(id) DO UPDATE SET sandbox_id = excluded.sandbox_id, data = excluded.data, team_id = excluded.team_id`)
}

// CreateSnapshot implements store.Store (insert only).
func (s *DB) CreateSnapshot(ctx context.Context, sn store.Snapshot) error {
	return s.writeSnapshot(ctx, sn, `INSERT INTO snapshots(id, sandbox_id, data, team_id) VALUES ($1, $2, $3, $4)`)
}

// writeSnapshot writes a snapshot's row with insert (its ID, sandbox ID,
// data and team as $1-$4) and then its names, in its team.
func (s *DB) writeSnapshot(ctx context.Context, sn store.Snapshot, insert string) error {
	data, _ := json.Marshal(sn)
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if sn.Kind == store.SnapshotKindUser && sn.TeamID != "" {
			prev := int64(-1)
			if err := tx.QueryRow(ctx, `SELECT COALESCE((data->>'sizeBytes')::bigint, 0) FROM snapshots WHERE id = $1`, sn.ID).Scan(&prev); err != nil && !errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("snapshot %s: %w", sn.ID, err)
			}
			if err := chargeBytes(ctx, tx, sn.TeamID, "snapshotBytes", sn.ID, prev, sn.SizeBytes); err != nil {
				return err
			}
		}
		if _, err := tx.Exec(ctx, insert, sn.ID, sn.SandboxID, data, sn.TeamID); err != nil {
			if isUnique(err) {
				return fmt.Errorf("snapshot %s: %w", sn.ID, errdefs.ErrAlreadyExists)
			}
			return fmt.Errorf("snapshot %s: %w", sn.ID, err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM snapshot_names WHERE snapshot_id = $1`, sn.ID); err != nil {
			return fmt.Errorf("snapshot %s: %w", sn.ID, err)
		}
		for _, n := range sn.Names {
			if _, err := tx.Exec(ctx, `INSERT INTO snapshot_names(snapshot_id, team_id, name) VALUES ($1, $2, $3)`, sn.ID, sn.TeamID, n); err != nil {
				if isUnique(err) {
					return fmt.Errorf("snapshot name %q: %w", n, errdefs.ErrAlreadyExists)
				}
				return fmt.Errorf("snapshot %s: %w", sn.ID, err)
			}
		}
		return nil
	})
}

// GetSnapshot implements store.Store.
func (s *DB) GetSnapshot(ctx context.Context, id string) (store.Snapshot, error) {
	var sn store.Snapshot
	return sn, getJSON(ctx, s.pool, &sn, "snapshot", id, `SELECT data FROM snapshots WHERE id = $1`, id)
}

// UpdateSnapshot implements store.Store.
func (s *DB) UpdateSnapshot(ctx context.Context, id string, fn func(*store.Snapshot) error) (store.Snapshot, error) {
	var sn store.Snapshot
	err := updateJSON(ctx, s, "snapshot", id, `SELECT data FROM snapshots WHERE id = $1 FOR UPDATE`, &sn,
		func(sn *store.Snapshot) (string, []any, error) {
			names, team := sn.Names, sn.TeamID
			if err := fn(sn); err != nil {
				return "", nil, err
			}
			sn.ID, sn.Names, sn.TeamID = id, names, team
			data, _ := json.Marshal(sn)
			return `UPDATE snapshots SET sandbox_id = $2, data = $3 WHERE id = $1`, []any{id, sn.SandboxID, data}, nil
		})
	if err != nil {
		return store.Snapshot{}, err
	}
	return sn, nil
}

// ListSnapshots implements store.Store.
func (s *DB) ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]store.Snapshot, string, error) {
	after, err := store.DecodeCursor(f.Cursor)
	if err != nil {
		return nil, "", err
	}
	w := where{q: `SELECT seq, data FROM snapshots s WHERE seq > $1`, args: []any{after}}
	if f.TeamID != "" {
		w.and(`team_id = $%d`, f.TeamID)
	}
	if f.SandboxID != "" {
		w.and(`sandbox_id = $%d`, f.SandboxID)
	}
	if f.Name != "" {
		// A name is only unique within a team: without one it names none.
		w.and(`EXISTS (SELECT 1 FROM snapshot_names n WHERE n.snapshot_id = s.id AND n.team_id = $%d AND n.team_id <> '' AND n.name = $%d)`, f.TeamID, f.Name)
	}
	return page[store.Snapshot](ctx, s.pool, w, f.Limit)
}

// DeleteSnapshot implements store.Store.
func (s *DB) DeleteSnapshot(ctx context.Context, id string) error {
	return s.deleteRow(ctx, `DELETE FROM snapshots WHERE id = $1`, "snapshot", id)
}

// PutTemplate implements store.Store. One statement: a concurrent put of
// the same name cannot lose the first CreatedAt.
func (s *DB) PutTemplate(ctx context.Context, t store.Template) (store.Template, error) {
	now := time.Now().UTC()
	if t.CreatedAt.IsZero() {
		t.CreatedAt = now
	}
	t.UpdatedAt = now
	data, _ := json.Marshal(t)
	var out store.Template
	err := getJSON(ctx, s.pool, &out, "template", t.Name, `INSERT INTO templates(name, data) VALUES ($1, $2)
		ON CONFLICT(name) DO UPDATE SET data = excluded.data || jsonb_build_object('createdAt', templates.data->'createdAt')
		RETURNING data`, t.Name, data)
	return out, err
}

// GetTemplate implements store.Store.
func (s *DB) GetTemplate(ctx context.Context, name string) (store.Template, error) {
	var t store.Template
	return t, getJSON(ctx, s.pool, &t, "template", name, `SELECT data FROM templates WHERE name = $1`, name)
}

// ListTemplates implements store.Store.
func (s *DB) ListTemplates(ctx context.Context) ([]store.Template, error) {
	return list[store.Template](ctx, s.pool, `SELECT data FROM templates ORDER BY name`)
}

// UpdateTemplate implements store.Store.
func (s *DB) UpdateTemplate(ctx context.Context, name string, fn func(*store.Template) error) (store.Template, error) {
	var t store.Template
	err := updateJSON(ctx, s, "template", name, `SELECT data FROM templates WHERE name = $1 FOR UPDATE`, &t,
		func(t *store.Template) (string, []any, error) {
			created := t.CreatedAt
			if err := fn(t); err != nil {
				return "", nil, err
			}
			t.Name, t.CreatedAt, t.UpdatedAt = name, created, time.Now().UTC()
			data, _ := json.Marshal(t)
			return `UPDATE templates SET data = $2 WHERE name = $1`, []any{name, data}, nil
		})
	if err != nil {
		return store.Template{}, err
	}
	return t, nil
}

// DeleteTemplate implements store.Store.
func (s *DB) DeleteTemplate(ctx context.Context, name string) error {
	return s.deleteRow(ctx, `DELETE FROM templates WHERE name = $1`, "template", name)
}

// UpsertNode implements store.Store. One statement: a heartbeat racing an
// operator's drain keeps the drain.
func (s *DB) UpsertNode(ctx context.Context, n store.Node) (store.Node, error) {
	if n.JoinedAt.IsZero() {
		n.JoinedAt = time.Now().UTC()
	}
	data, _ := json.Marshal(n)
	var out store.Node
	err := getJSON(ctx, s.pool, &out, "node", n.ID, `INSERT INTO nodes(id, data) VALUES ($1, $2)
		ON CONFLICT(id) DO UPDATE SET data = excluded.data ||
			jsonb_build_object('draining', nodes.data->'draining', 'joinedAt', nodes.data->'joinedAt')
		RETURNING data`, n.ID, data)
	return out, err
}

// GetNode implements store.Store.
func (s *DB) GetNode(ctx context.Context, id string) (store.Node, error) {
	var n store.Node
	return n, getJSON(ctx, s.pool, &n, "node", id, `SELECT data FROM nodes WHERE id = $1`, id)
}

// ListNodes implements store.Store.
func (s *DB) ListNodes(ctx context.Context) ([]store.Node, error) {
	return list[store.Node](ctx, s.pool, `SELECT data FROM nodes ORDER BY id`)
}

// UpdateNode implements store.Store.
func (s *DB) UpdateNode(ctx context.Context, id string, fn func(*store.Node) error) (store.Node, error) {
	var n store.Node
	err := updateJSON(ctx, s, "node", id, `SELECT data FROM nodes WHERE id = $1 FOR UPDATE`, &n,
		func(n *store.Node) (string, []any, error) {
			if err := fn(n); err != nil {
				return "", nil, err
			}
			n.ID = id
			data, _ := json.Marshal(n)
			return `UPDATE nodes SET data = $2 WHERE id = $1`, []any{id, data}, nil
		})
	if err != nil {
		return store.Node{}, err
	}
	return n, nil
}

// DeleteNode implements store.Store.
func (s *DB) DeleteNode(ctx context.Context, id string) error {
	return s.deleteRow(ctx, `DELETE FROM nodes WHERE id = $1`, "node", id)
}

// AcquireLease implements store.Store. One statement, judged by the
// database's clock: the row lock INSERT ... ON CONFLICT takes makes the
// check (free, expired or ours) and the take one step across replicas.
func (s *DB) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (bool, error) {
	if name == "" || holder == "" || ttl <= 0 {
		return false, errdefs.Invalidf("lease %q for %q with ttl %s", name, holder, ttl)
	}
	tag, err := s.pool.Exec(ctx, `INSERT INTO leases(name, holder, expires_at) VALUES ($1, $2, now() + $3 * interval '1 microsecond')
		ON CONFLICT(name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
		WHERE leases.holder = excluded.holder OR leases.expires_at <= now()`, name, holder, ttl.Microseconds())
	if err != nil {
		return false, fmt.Errorf("lease %s: %w", name, err)
	}
	return tag.RowsAffected() == 1, nil
}

// ReleaseLease implements store.Store.
func (s *DB) ReleaseLease(ctx context.Context, name, holder string) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM leases WHERE name = $1 AND holder = $2`, name, holder); err != nil {
		return fmt.Errorf("lease %s: %w", name, err)
	}
	return nil
}

// ResolveRef implements store.Store: the four lookups in one statement,
// ranked. Team "" finds a snapshot of any team by ID and none by name.
func (s *DB) ResolveRef(ctx context.Context, team, ref string) (store.Ref, error) {
	var rank int
	var data []byte
	err := s.pool.QueryRow(ctx, `SELECT 0, data FROM snapshots WHERE id = $1 AND ($2 = '' OR team_id = $2)
		UNION ALL SELECT 1, s.data FROM snapshots s JOIN snapshot_names n ON n.snapshot_id = s.id WHERE n.name = $1 AND $2 <> '' AND n.team_id = $2
		UNION ALL SELECT 2, data FROM templates WHERE name = $3 AND $3 <> $1
		UNION ALL SELECT 3, data FROM templates WHERE name = $1
		ORDER BY 1 LIMIT 1`, ref, team, store.TemplateKey(team, ref)).Scan(&rank, &data)
	return store.DecodeRef(err, rank, data, ref, pgx.ErrNoRows)
}
