// Package postgres implements store.Store on PostgreSQL (pgx), the
// metadata store of a fleet: every API replica opens it, and it is the one
// place they share. Migrations are versioned like store/sqlite's (the same
// numbers mean the same schema) and applied under an advisory lock, so
// replicas starting together apply each once.
//
// Concurrency: read-change-write (UpdateSandbox, UpdateTemplate,
// UpdateNode, UpdateBuild, and AppendBuildLogs on the build's row) locks
// the row (SELECT ... FOR UPDATE) for its transaction;
// compare-and-swap, upserts and leases are single statements. Lease expiry
// is judged by the database's clock (now()), never a replica's.
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// DB is a PostgreSQL-backed store.
type DB struct {
	pool *pgxpool.Pool
}

var _ store.Store = (*DB)(nil)

// migrationLock is the advisory lock key migrations run under.
const migrationLock = 0x5370_6f72_6501 // "Spore" + 1

// migrations are applied in order, each once; numbers match store/sqlite's.
var migrations = []string{
	// 1: sandboxes (metadata is filtered inside the JSON record), snapshots
	// and their unique names, API keys.
	`CREATE TABLE sandboxes (
		seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		id TEXT NOT NULL UNIQUE,
		state TEXT NOT NULL,
		template_id TEXT NOT NULL,
		end_at TIMESTAMPTZ NOT NULL,
		data JSONB NOT NULL
	);
	CREATE INDEX sandboxes_state_end ON sandboxes(state, end_at);
	CREATE INDEX sandboxes_metadata ON sandboxes USING GIN ((data->'metadata') jsonb_path_ops);
	CREATE TABLE snapshots (
		seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		id TEXT NOT NULL UNIQUE,
		sandbox_id TEXT NOT NULL,
		data JSONB NOT NULL
	);
	CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id);
	CREATE TABLE snapshot_names (
		snapshot_id TEXT NOT NULL REFERENCES snapshots(id) ON DELETE CASCADE,
		name TEXT NOT NULL UNIQUE
	);
	CREATE INDEX snapshot_names_snapshot ON snapshot_names(snapshot_id);
	CREATE TABLE api_keys (
		id TEXT PRIMARY KEY,
		hash TEXT NOT NULL UNIQUE,
		created_at TIMESTAMPTZ NOT NULL
	);`,
	// 2: the fleet: sandbox version (compare-and-swap) and node (reconcile
	// per node), templates, nodes, leases.
	`ALTER TABLE sandboxes ADD COLUMN version BIGINT NOT NULL DEFAULT 1;
	ALTER TABLE sandboxes ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
	UPDATE sandboxes SET node_id = COALESCE(data->>'nodeID', ''), data = jsonb_set(data, '{version}', '1');
	CREATE INDEX sandboxes_node ON sandboxes(node_id, seq);
	CREATE TABLE templates (
		name TEXT PRIMARY KEY,
		data JSONB NOT NULL
	);
	CREATE TABLE nodes (
		id TEXT PRIMARY KEY,
		data JSONB NOT NULL
	);
	CREATE TABLE leases (
		name TEXT PRIMARY KEY,
		holder TEXT NOT NULL,
		expires_at TIMESTAMPTZ NOT NULL
	);`,
	// 3: template builds, their logs (n: the entry's index in the build's
	// log, assigned under the build row's lock; log_count the next one)
	// and the templates' tags. Builds and log entries are JSON in TEXT,
	// not JSONB: JSONB refuses a \u0000, and a build's output may hold one.
	`CREATE TABLE builds (
		seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		id TEXT NOT NULL UNIQUE,
		template TEXT NOT NULL,
		log_count INTEGER NOT NULL DEFAULT 0,
		data TEXT NOT NULL
	);
	CREATE INDEX builds_template ON builds(template, seq);
	CREATE TABLE build_logs (
		build_id TEXT NOT NULL REFERENCES builds(id) ON DELETE CASCADE,
		n INTEGER NOT NULL,
		data TEXT NOT NULL,
		PRIMARY KEY (build_id, n)
	);
	CREATE TABLE template_tags (
		template TEXT NOT NULL,
		tag TEXT NOT NULL,
		build_id TEXT NOT NULL,
		created_at TIMESTAMPTZ NOT NULL,
		PRIMARY KEY (template, tag)
	);`,
	// 4: secrets (the value sealed inside data, never in the clear).
	`CREATE TABLE secrets (
		seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		id TEXT NOT NULL UNIQUE,
		name TEXT NOT NULL UNIQUE,
		data JSONB NOT NULL
	);`,
	// 5: revocable API keys with a role (the keys before it were all
	// administrators, and stay so) and the keys' change counter.
	`ALTER TABLE api_keys ADD COLUMN name TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_keys ADD COLUMN role TEXT NOT NULL DEFAULT 'admin';
	ALTER TABLE api_keys ADD COLUMN source TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_keys ADD COLUMN mask TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_keys ADD COLUMN revoked_at TIMESTAMPTZ;
	CREATE TABLE api_key_version (
		id INTEGER PRIMARY KEY CHECK (id = 1),
		version BIGINT NOT NULL
	);
	INSERT INTO api_key_version(id, version) VALUES (1, 1);`,
	// 6: the public key each node ID's fleet certificate is issued for
	// (the first enrollment of an ID binds it).
	`CREATE TABLE node_keys (
		node_id TEXT PRIMARY KEY,
		key_id TEXT NOT NULL,
		bound_at TIMESTAMPTZ NOT NULL
	);`,
	// 7: volumes (docs/volumes.md).
	`CREATE TABLE volumes (
		seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		id TEXT NOT NULL UNIQUE,
		name TEXT NOT NULL UNIQUE,
		data JSONB NOT NULL
	);`,
	// 8: teams (docs/teams.md). Everything made before belongs to the
	// default team (a pooled sandbox is nobody's until claimed); names
	// become unique per team, the deployment-wide constraints giving way
	// to (team_id, name) ones; the administrators' keys become operator
	// keys and the users' the default team's members.
	`CREATE TABLE teams (
		seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		id TEXT NOT NULL UNIQUE,
		name TEXT NOT NULL UNIQUE,
		created_at TIMESTAMPTZ NOT NULL
	);
	INSERT INTO teams(id, name, created_at) VALUES ('default', 'default', date_trunc('milliseconds', now()));
	ALTER TABLE sandboxes ADD COLUMN team_id TEXT NOT NULL DEFAULT '';
	UPDATE sandboxes SET team_id = 'default', data = jsonb_set(data, '{teamID}', '"default"') WHERE state != 'pooled';
	CREATE INDEX sandboxes_team ON sandboxes(team_id, seq);
	ALTER TABLE snapshots ADD COLUMN team_id TEXT NOT NULL DEFAULT '';
	UPDATE snapshots SET team_id = 'default', data = jsonb_set(data, '{teamID}', '"default"');
	CREATE INDEX snapshots_team ON snapshots(team_id, seq);
	ALTER TABLE snapshot_names ADD COLUMN team_id TEXT NOT NULL DEFAULT '';
	UPDATE snapshot_names n SET team_id = s.team_id FROM snapshots s WHERE s.id = n.snapshot_id;
	ALTER TABLE snapshot_names ALTER COLUMN team_id DROP DEFAULT;
	ALTER TABLE snapshot_names DROP CONSTRAINT snapshot_names_name_key;
	ALTER TABLE snapshot_names ADD CONSTRAINT snapshot_names_team_name_key UNIQUE (team_id, name);
	ALTER TABLE secrets ADD COLUMN team_id TEXT NOT NULL DEFAULT 'default';
	ALTER TABLE secrets ALTER COLUMN team_id DROP DEFAULT;
	UPDATE secrets SET data = jsonb_set(data, '{teamID}', '"default"');
	ALTER TABLE secrets DROP CONSTRAINT secrets_name_key;
	ALTER TABLE secrets ADD CONSTRAINT secrets_team_name_key UNIQUE (team_id, name);
	ALTER TABLE volumes ADD COLUMN team_id TEXT NOT NULL DEFAULT 'default';
	ALTER TABLE volumes ALTER COLUMN team_id DROP DEFAULT;
	UPDATE volumes SET data = jsonb_set(data, '{teamID}', '"default"');
	ALTER TABLE volumes DROP CONSTRAINT volumes_name_key;
	ALTER TABLE volumes ADD CONSTRAINT volumes_team_name_key UNIQUE (team_id, name);
	ALTER TABLE api_keys ADD COLUMN team_id TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_keys ADD COLUMN scope TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_keys ADD COLUMN expires_at TIMESTAMPTZ;
	ALTER TABLE api_keys ADD COLUMN last_used_at TIMESTAMPTZ;
	UPDATE api_keys SET role = 'operator' WHERE role = 'admin';
	UPDATE api_keys SET role = 'member', team_id = 'default' WHERE role = 'user';
	UPDATE api_key_version SET version = version + 1;`,
	// 9: team quotas (docs/teams.md). A sandbox row carries the size its
	// team is charged (the defaults where it names none), so the quota
	// check sums columns; a team's create rate has its own row (not the
	// team's, which creates lock FOR SHARE).
	`ALTER TABLE teams ADD COLUMN quotas JSONB NOT NULL DEFAULT '{}';
	CREATE TABLE team_rates (
		team_id TEXT PRIMARY KEY,
		minute BIGINT NOT NULL,
		count INTEGER NOT NULL,
		prev INTEGER NOT NULL
	);
	ALTER TABLE sandboxes ADD COLUMN vcpus INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN memory_mb BIGINT NOT NULL DEFAULT 0;
	UPDATE sandboxes SET
		vcpus = CASE WHEN COALESCE((data->>'cpuCount')::int, 0) > 0 THEN (data->>'cpuCount')::int ELSE 2 END,
		memory_mb = CASE WHEN COALESCE((data->>'memoryMB')::bigint, 0) > 0 THEN (data->>'memoryMB')::bigint ELSE 1024 END;
	CREATE INDEX sandboxes_team_state ON sandboxes(team_id, state);`,
	// 10: the audit trail (docs/teams.md), appended to only; read newest
	// first by team (and resource) within a time range, pruned by age.
	`CREATE TABLE audit (
		seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		at BIGINT NOT NULL,
		team_id TEXT NOT NULL,
		key_id TEXT NOT NULL,
		key_name TEXT NOT NULL,
		kind TEXT NOT NULL,
		action TEXT NOT NULL,
		resource TEXT NOT NULL,
		status INTEGER NOT NULL,
		remote TEXT NOT NULL,
		detail TEXT NOT NULL
	);
	CREATE INDEX audit_team_at ON audit(team_id, at, seq);
	CREATE INDEX audit_team_resource_at ON audit(team_id, resource, at, seq);
	CREATE INDEX audit_at ON audit(at, seq);`,
	// 11: team metrics (docs/teams.md): a team's figures per sampling
	// step, merged by the largest value (every replica samples).
	`CREATE TABLE team_samples (
		team_id TEXT NOT NULL,
		at BIGINT NOT NULL,
		concurrent INTEGER NOT NULL,
		starts INTEGER NOT NULL,
		PRIMARY KEY (team_id, at)
	);
	CREATE INDEX team_samples_at ON team_samples(at);`,
}

// Open connects to the database at dsn (a libpq URL or key=value string;
// pool settings such as pool_max_conns go in it) and migrates it.
func Open(ctx context.Context, dsn string) (*DB, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	s := &DB{pool: pool}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

func (s *DB) migrate(ctx context.Context) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
			return fmt.Errorf("migrate: lock: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)`); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		var have int
		if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&have); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		if have > len(migrations) {
			return fmt.Errorf("database schema version %d is newer than this binary knows (%d)", have, len(migrations))
		}
		for v := have + 1; v <= len(migrations); v++ {
			if _, err := tx.Exec(ctx, migrations[v-1]); err != nil {
				return fmt.Errorf("migration %d: %w", v, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations(version) VALUES ($1)`, v); err != nil {
				return fmt.Errorf("migration %d: %w", v, err)
			}
		}
		return nil
	})
}

// Close closes the pool.
func (s *DB) Close() error {
	s.pool.Close()
	return nil
}

func isUnique(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

// querier is a pool or a transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// getJSON decodes the data column of the one row q returns into v; no row
// is ErrNotFound for kind key.
func getJSON(ctx context.Context, q querier, v any, kind, key, sql string, args ...any) error {
	var data []byte
	return decodeRow(q.QueryRow(ctx, sql, args...).Scan(&data), data, v, kind, key)
}

// decodeRow decodes a row's data column read with err into v; no row is
// ErrNotFound for kind key.
func decodeRow(err error, data []byte, v any, kind, key string) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s %s: %w", kind, key, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", kind, key, err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s %s: decode: %w", kind, key, err)
	}
	return nil
}

// CreateSandbox implements store.Store.
func (s *DB) CreateSandbox(ctx context.Context, sb store.Sandbox) error {
	sb.Version = 1
	data, _ := json.Marshal(sb)
	const insert = `INSERT INTO sandboxes(id, team_id, state, template_id, node_id, end_at, version, data, vcpus, memory_mb) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`
	args := []any{sb.ID, sb.TeamID, sb.State, sb.TemplateID, sb.NodeID, sb.EndAt, sb.Version, data, store.VCPUsOf(sb), store.MemoryOf(sb)}
	var err error
	if grows, _ := store.Grows(nil, sb); grows {
		err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if err := chargeSandbox(ctx, tx, nil, sb); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, insert, args...)
			return err
		})
	} else {
		_, err = s.pool.Exec(ctx, insert, args...)
	}
	var qe *store.QuotaError
	if errors.As(err, &qe) || errdefs.IsNotFound(err) {
		return err
	}
	if isUnique(err) {
		return fmt.Errorf("sandbox %s: %w", sb.ID, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// GetSandbox implements store.Store.
func (s *DB) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	var sb store.Sandbox
	return sb, getJSON(ctx, s.pool, &sb, "sandbox", id, `SELECT data FROM sandboxes WHERE id = $1`, id)
}

// UpdateSandbox implements store.Store.
func (s *DB) UpdateSandbox(ctx context.Context, id string, fn func(*store.Sandbox) error) (store.Sandbox, error) {
	var sb store.Sandbox
	err := updateJSONIn(ctx, s, "sandbox", id, `SELECT data FROM sandboxes WHERE id = $1 FOR UPDATE`, []any{id}, &sb,
		func(q querier, sb *store.Sandbox) (string, []any, error) {
			version, prev := sb.Version, *sb
			if err := fn(sb); err != nil {
				return "", nil, err
			}
			sb.ID, sb.Version = id, version+1
			if err := chargeSandbox(ctx, q, &prev, *sb); err != nil {
				return "", nil, err
			}
			sql, args := sandboxUpdate(*sb, version, false)
			return sql, args, nil
		})
	if err != nil {
		return store.Sandbox{}, err
	}
	return sb, nil
}

// CompareAndSwapSandbox implements store.Store.
func (s *DB) CompareAndSwapSandbox(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	expect := sb.Version
	sb.Version++
	// The one-statement write admits a write that adds nothing to the
	// team's charge (the row's stored team, state and size cover it);
	// one that adds is checked against the quotas in a transaction.
	ok, err := writeSandbox(ctx, s.pool, sb, expect)
	if err != nil || ok {
		return sb, err
	}
	if store.ChargeOf(sb).Sandboxes > 0 {
		var stored store.Sandbox
		err := updateJSONIn(ctx, s, "sandbox", sb.ID, `SELECT data FROM sandboxes WHERE id = $1 FOR UPDATE`, []any{sb.ID}, &stored,
			func(q querier, cur *store.Sandbox) (string, []any, error) {
				if cur.Version != expect {
					return "", nil, fmt.Errorf("sandbox %s: version %d, stored %d: %w", sb.ID, expect, cur.Version, errdefs.ErrConflict)
				}
				if err := chargeSandbox(ctx, q, cur, sb); err != nil {
					return "", nil, err
				}
				sql, args := sandboxUpdate(sb, expect, false)
				return sql, args, nil
			})
		if err != nil {
			return store.Sandbox{}, err
		}
		return sb, nil
	}
	var stored int64
	err = s.pool.QueryRow(ctx, `SELECT version FROM sandboxes WHERE id = $1`, sb.ID).Scan(&stored)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: %w", sb.ID, errdefs.ErrNotFound)
	}
	if err != nil {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	return store.Sandbox{}, fmt.Errorf("sandbox %s: version %d, stored %d: %w", sb.ID, expect, stored, errdefs.ErrConflict)
}

// sandboxUpdate is the statement that replaces the sandbox row if its
// version is expect; noGrowth adds that the stored row already charges
// its team as much as sb will (its team, a charged state, its size), so
// a write that passes it needs no quota check.
func sandboxUpdate(sb store.Sandbox, expect int64, noGrowth bool) (string, []any) {
	data, _ := json.Marshal(sb)
	q := `UPDATE sandboxes SET state = $2, template_id = $3, node_id = $4, end_at = $5, version = $6, data = $7, team_id = $9, vcpus = $10, memory_mb = $11
		WHERE id = $1 AND version = $8`
	if noGrowth && store.ChargeOf(sb).Sandboxes > 0 {
		q += ` AND team_id = $9 AND ` + charged + ` AND vcpus >= $10 AND memory_mb >= $11`
	}
	return q, []any{sb.ID, sb.State, sb.TemplateID, sb.NodeID, sb.EndAt, sb.Version, data, expect, sb.TeamID, store.VCPUsOf(sb), store.MemoryOf(sb)}
}

// writeSandbox replaces the sandbox row if its version is expect, and
// reports whether it did.
func writeSandbox(ctx context.Context, q querier, sb store.Sandbox, expect int64) (bool, error) {
	sql, args := sandboxUpdate(sb, expect, true)
	tag, err := q.Exec(ctx, sql, args...)
	if err != nil {
		return false, fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	return tag.RowsAffected() == 1, nil
}

// DeleteSandbox implements store.Store.
func (s *DB) DeleteSandbox(ctx context.Context, id string) error {
	return s.deleteRow(ctx, `DELETE FROM sandboxes WHERE id = $1`, "sandbox", id)
}

// DeleteSandboxIf implements store.Store.
func (s *DB) DeleteSandboxIf(ctx context.Context, id string, version int64) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM sandboxes WHERE id = $1 AND version = $2`, id, version)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	if _, err := s.GetSandbox(ctx, id); err != nil {
		return err
	}
	return fmt.Errorf("sandbox %s changed since version %d: %w", id, version, errdefs.ErrConflict)
}

// deleteRow runs a delete of the row named key ($1; more arguments
// follow it); no row is ErrNotFound.
func (s *DB) deleteRow(ctx context.Context, sql, kind, key string, more ...any) error {
	tag, err := s.pool.Exec(ctx, sql, append([]any{key}, more...)...)
	if err != nil {
		return fmt.Errorf("%s %s: %w", kind, key, err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%s %s: %w", kind, key, errdefs.ErrNotFound)
	}
	return nil
}

// ListSandboxes implements store.Store.
func (s *DB) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, string, error) {
	after, err := store.DecodeCursor(f.Cursor)
	if err != nil {
		return nil, "", err
	}
	w := where{q: `SELECT seq, data FROM sandboxes WHERE seq > $1`, args: []any{after}}
	if f.TeamID != "" {
		w.and(`team_id = $%d`, f.TeamID)
	}
	if len(f.States) > 0 {
		w.and(`state = ANY($%d)`, f.States)
	}
	if f.Template != "" {
		w.and(`template_id = $%d`, f.Template)
	}
	if f.NodeID != "" {
		w.and(`node_id = $%d`, f.NodeID)
	}
	if len(f.Metadata) > 0 {
		md, _ := json.Marshal(f.Metadata)
		w.and(`data->'metadata' @> $%d::jsonb`, string(md))
	}
	return page[store.Sandbox](ctx, s.pool, w, f.Limit)
}

// where builds a query with numbered parameters.
type where struct {
	q    string
	args []any
}

// and adds a condition whose parameters are written $%d, in order.
func (w *where) and(cond string, args ...any) {
	n := make([]any, len(args))
	for i, a := range args {
		w.args = append(w.args, a)
		n[i] = len(w.args)
	}
	w.q += ` AND ` + fmt.Sprintf(cond, n...)
}

// page runs a "SELECT seq, data ... " query ordered by seq (one row more
// than the limit, to know whether a next page exists) and decodes a page
// of JSON records with the cursor of the next page.
func page[T any](ctx context.Context, q querier, w where, limit int) ([]T, string, error) {
	w.q += ` ORDER BY seq`
	if limit > 0 {
		w.args = append(w.args, limit+1)
		w.q += fmt.Sprintf(` LIMIT $%d`, len(w.args))
	}
	rows, err := q.Query(ctx, w.q, w.args...)
	if err != nil {
		return nil, "", err
	}
	defer rows.Close()
	var out []T
	var seqs []int64
	for rows.Next() {
		var seq int64
		var data []byte
		if err := rows.Scan(&seq, &data); err != nil {
			return nil, "", err
		}
		var v T
		if err := json.Unmarshal(data, &v); err != nil {
			return nil, "", err
		}
		out, seqs = append(out, v), append(seqs, seq)
	}
	if err := rows.Err(); err != nil {
		return nil, "", err
	}
	next := ""
	if limit > 0 && len(out) > limit {
		out = out[:limit]
		next = store.EncodeCursor(seqs[limit-1])
	}
	return out, next, nil
}

// Expired implements store.Store.
func (s *DB) Expired(ctx context.Context, now time.Time, states ...string) ([]store.Sandbox, error) {
	if len(states) == 0 {
		return nil, nil
	}
	return list[store.Sandbox](ctx, s.pool, `SELECT data FROM sandboxes WHERE end_at <= $1 AND state = ANY($2) ORDER BY end_at`, now, states)
}

// list decodes the data column of every row the query returns.
func list[T any](ctx context.Context, q querier, sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		var v T
		if err := json.Unmarshal(data, &v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}
