// Package sqlite implements store.Store on an embedded SQLite database
// (pure Go: modernc.org/sqlite, no cgo), with versioned migrations.
package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// DB is a SQLite-backed store.
type DB struct {
	db  *sql.DB
	now func() time.Time // leases' expiry, templates' and nodes' times
}

// Option configures Open.
type Option func(*DB)

// WithClock replaces the process clock (tests of lease expiry).
func WithClock(now func() time.Time) Option { return func(s *DB) { s.now = now } }

var _ store.Store = (*DB)(nil)

// migrations are applied in order, each once, each in a transaction.
var migrations = []string{
	// 1: sandboxes, their metadata (for filtering), snapshots, API keys.
	`CREATE TABLE sandboxes (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		id TEXT NOT NULL UNIQUE,
		state TEXT NOT NULL,
		template_id TEXT NOT NULL,
		end_at INTEGER NOT NULL,
		data TEXT NOT NULL
	);
	CREATE INDEX sandboxes_state_end ON sandboxes(state, end_at);
	CREATE TABLE sandbox_metadata (
		sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
		key TEXT NOT NULL,
		value TEXT NOT NULL,
		PRIMARY KEY (sandbox_id, key)
	);
	CREATE INDEX sandbox_metadata_kv ON sandbox_metadata(key, value);
	CREATE TABLE snapshots (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		id TEXT NOT NULL UNIQUE,
		sandbox_id TEXT NOT NULL,
		data TEXT NOT NULL
	);
	CREATE TABLE snapshot_names (
		snapshot_id TEXT NOT NULL REFERENCES snapshots(id) ON DELETE CASCADE,
		name TEXT NOT NULL UNIQUE
	);
	CREATE TABLE api_keys (
		id TEXT PRIMARY KEY,
		hash TEXT NOT NULL UNIQUE,
		created_at INTEGER NOT NULL
	);`,
	// 2: the fleet: sandbox version (compare-and-swap) and node (reconcile
	// per node) as columns, templates, nodes, leases.
	`ALTER TABLE sandboxes ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
	ALTER TABLE sandboxes ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
	UPDATE sandboxes SET node_id = COALESCE(json_extract(data, '$.nodeID'), ''),
		data = json_set(data, '$.version', 1);
	CREATE INDEX sandboxes_node ON sandboxes(node_id);
	CREATE TABLE templates (
		name TEXT PRIMARY KEY,
		data TEXT NOT NULL
	);
	CREATE TABLE nodes (
		id TEXT PRIMARY KEY,
		data TEXT NOT NULL
	);
	CREATE TABLE leases (
		name TEXT PRIMARY KEY,
		holder TEXT NOT NULL,
		expires_at INTEGER NOT NULL
	);`,
	// 3: template builds, their logs (n: the entry's index in the build's
	// log, assigned under the build row's write lock; log_count the next
	// one) and the templates' tags.
	`CREATE TABLE builds (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
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
		created_at INTEGER NOT NULL,
		PRIMARY KEY (template, tag)
	);`,
	// 4: secrets (the value sealed inside data, never in the clear).
	`CREATE TABLE secrets (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		id TEXT NOT NULL UNIQUE,
		name TEXT NOT NULL UNIQUE,
		data TEXT NOT NULL
	);`,
	// 5: revocable API keys with a role (the keys before it were all
	// administrators, and stay so) and the keys' change counter.
	`ALTER TABLE api_keys ADD COLUMN name TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_keys ADD COLUMN role TEXT NOT NULL DEFAULT 'admin';
	ALTER TABLE api_keys ADD COLUMN source TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_keys ADD COLUMN mask TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_keys ADD COLUMN revoked_at INTEGER NOT NULL DEFAULT 0;
	CREATE TABLE api_key_version (
		id INTEGER PRIMARY KEY CHECK (id = 1),
		version INTEGER NOT NULL
	);
	INSERT INTO api_key_version(id, version) VALUES (1, 1);`,
	// 6: the public key each node ID's fleet certificate is issued for
	// (the first enrollment of an ID binds it).
	`CREATE TABLE node_keys (
		node_id TEXT PRIMARY KEY,
		key_id TEXT NOT NULL,
		bound_at INTEGER NOT NULL
	);`,
	// 7: volumes (docs/volumes.md).
	`CREATE TABLE volumes (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		id TEXT NOT NULL UNIQUE,
		name TEXT NOT NULL UNIQUE,
		data TEXT NOT NULL
	);`,
	// 8: teams (docs/teams.md). Everything made before belongs to the
	// default team; names become unique per team (the tables whose
	// names were unique deployment-wide are rebuilt, keeping their
	// sequence numbers, which cursors name); the administrators' keys
	// become operator keys and the users' the default team's members.
	`CREATE TABLE teams (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		id TEXT NOT NULL UNIQUE,
		name TEXT NOT NULL UNIQUE,
		created_at INTEGER NOT NULL
	);
	INSERT INTO teams(id, name, created_at) VALUES ('default', 'default', CAST(strftime('%s', 'now') AS INTEGER) * 1000);
	ALTER TABLE sandboxes ADD COLUMN team_id TEXT NOT NULL DEFAULT '';
	UPDATE sandboxes SET team_id = 'default', data = json_set(data, '$.teamID', 'default') WHERE state != 'pooled';
	CREATE INDEX sandboxes_team ON sandboxes(team_id, seq);
	ALTER TABLE snapshots ADD COLUMN team_id TEXT NOT NULL DEFAULT '';
	UPDATE snapshots SET team_id = 'default', data = json_set(data, '$.teamID', 'default');
	CREATE INDEX snapshots_team ON snapshots(team_id, seq);
	CREATE TABLE snapshot_names_t (
		snapshot_id TEXT NOT NULL REFERENCES snapshots(id) ON DELETE CASCADE,
		team_id TEXT NOT NULL,
		name TEXT NOT NULL,
		UNIQUE (team_id, name)
	);
	INSERT INTO snapshot_names_t(snapshot_id, team_id, name) SELECT n.snapshot_id, s.team_id, n.name FROM snapshot_names n JOIN snapshots s ON s.id = n.snapshot_id;
	DROP TABLE snapshot_names;
	ALTER TABLE snapshot_names_t RENAME TO snapshot_names;
	CREATE INDEX snapshot_names_snapshot ON snapshot_names(snapshot_id);
	CREATE TABLE secrets_t (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		id TEXT NOT NULL UNIQUE,
		team_id TEXT NOT NULL,
		name TEXT NOT NULL,
		data TEXT NOT NULL,
		UNIQUE (team_id, name)
	);
	INSERT INTO secrets_t(seq, id, team_id, name, data) SELECT seq, id, 'default', name, json_set(data, '$.teamID', 'default') FROM secrets;
	DROP TABLE secrets;
	ALTER TABLE secrets_t RENAME TO secrets;
	CREATE TABLE volumes_t (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		id TEXT NOT NULL UNIQUE,
		team_id TEXT NOT NULL,
		name TEXT NOT NULL,
		data TEXT NOT NULL,
		UNIQUE (team_id, name)
	);
	INSERT INTO volumes_t(seq, id, team_id, name, data) SELECT seq, id, 'default', name, json_set(data, '$.teamID', 'default') FROM volumes;
	DROP TABLE volumes;
	ALTER TABLE volumes_t RENAME TO volumes;
	ALTER TABLE api_keys ADD COLUMN team_id TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_keys ADD COLUMN scope TEXT NOT NULL DEFAULT '';
	ALTER TABLE api_keys ADD COLUMN expires_at INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE api_keys ADD COLUMN last_used_at INTEGER NOT NULL DEFAULT 0;
	UPDATE api_keys SET role = 'operator' WHERE role = 'admin';
	UPDATE api_keys SET role = 'member', team_id = 'default' WHERE role = 'user';
	UPDATE api_key_version SET version = version + 1;`,
	// 9: team quotas (docs/teams.md). A sandbox row carries the size its
	// team is charged (the defaults where it names none), so the quota
	// check sums columns; a team's create rate has its own row.
	`ALTER TABLE teams ADD COLUMN quotas TEXT NOT NULL DEFAULT '{}';
	CREATE TABLE team_rates (
		team_id TEXT PRIMARY KEY,
		minute INTEGER NOT NULL,
		count INTEGER NOT NULL,
		prev INTEGER NOT NULL
	);
	ALTER TABLE sandboxes ADD COLUMN vcpus INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN memory_mb INTEGER NOT NULL DEFAULT 0;
	UPDATE sandboxes SET
		vcpus = CASE WHEN COALESCE(json_extract(data, '$.cpuCount'), 0) > 0 THEN json_extract(data, '$.cpuCount') ELSE 2 END,
		memory_mb = CASE WHEN COALESCE(json_extract(data, '$.memoryMB'), 0) > 0 THEN json_extract(data, '$.memoryMB') ELSE 1024 END;
	CREATE INDEX sandboxes_team_state ON sandboxes(team_id, state);`,
	// 10: the audit trail (docs/teams.md), appended to only; read newest
	// first by team (and resource) within a time range, pruned by age.
	`CREATE TABLE audit (
		seq INTEGER PRIMARY KEY AUTOINCREMENT,
		at INTEGER NOT NULL,
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
		at INTEGER NOT NULL,
		concurrent INTEGER NOT NULL,
		starts INTEGER NOT NULL,
		PRIMARY KEY (team_id, at)
	);
	CREATE INDEX team_samples_at ON team_samples(at);`,
}

// Open opens (creating and migrating) the database at path. WAL with
// synchronous=NORMAL: a committed transaction survives the process being
// killed at any point (SIGKILL); only an operating-system crash can lose
// the last few, which the reconcile at start repairs against the node.
//
// Several handles (processes) may share one file: every transaction
// begins IMMEDIATE, taking the write lock before it reads, so a
// read-change-write never works on a stale read (which SQLite would refuse
// with SQLITE_BUSY_SNAPSHOT rather than wait), and a handle waits for
// another's lock up to the busy timeout.
func Open(ctx context.Context, path string, opts ...Option) (*DB, error) {
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// One connection per handle: SQLite serializes writes anyway.
	db.SetMaxOpenConns(1)
	s := &DB{db: db, now: time.Now}
	for _, o := range opts {
		o(s)
	}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

func (s *DB) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	for {
		done, err := s.migrateOne(ctx)
		if err != nil || done {
			return err
		}
	}
}

// migrateOne applies the next migration, reading the schema version inside
// the (immediate) transaction so two handles opening at once never apply
// one twice.
func (s *DB) migrateOne(ctx context.Context) (done bool, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback()
	var have int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&have); err != nil {
		return false, fmt.Errorf("migrate: %w", err)
	}
	if have > len(migrations) {
		return false, fmt.Errorf("database schema version %d is newer than this binary knows (%d)", have, len(migrations))
	}
	if have == len(migrations) {
		return true, nil
	}
	v := have + 1
	if _, err := tx.ExecContext(ctx, migrations[v-1]); err != nil {
		return false, fmt.Errorf("migration %d: %w", v, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations(version) VALUES (?)`, v); err != nil {
		return false, fmt.Errorf("migration %d: %w", v, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("migration %d: %w", v, err)
	}
	return false, nil
}

// Close closes the database.
func (s *DB) Close() error { return s.db.Close() }

func isUnique(err error) bool {
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed")
}

func encodeCursor(seq int64) string { return store.EncodeCursor(seq) }

func decodeCursor(c string) (int64, error) { return store.DecodeCursor(c) }

// CreateSandbox implements store.Store.
func (s *DB) CreateSandbox(ctx context.Context, sb store.Sandbox) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	sb.Version = 1
	if err := s.chargeSandbox(ctx, tx, nil, sb); err != nil {
		return err
	}
	data, _ := json.Marshal(sb)
	if _, err := tx.ExecContext(ctx, `INSERT INTO sandboxes(id, team_id, state, template_id, node_id, end_at, version, data, vcpus, memory_mb) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sb.ID, sb.TeamID, sb.State, sb.TemplateID, sb.NodeID, sb.EndAt.UnixMilli(), sb.Version, string(data), store.VCPUsOf(sb), store.MemoryOf(sb)); err != nil {
		if isUnique(err) {
			return fmt.Errorf("sandbox %s: %w", sb.ID, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	if err := putMetadata(ctx, tx, sb); err != nil {
		return err
	}
	return tx.Commit()
}

func putMetadata(ctx context.Context, tx *sql.Tx, sb store.Sandbox) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM sandbox_metadata WHERE sandbox_id = ?`, sb.ID); err != nil {
		return err
	}
	for k, v := range sb.Metadata {
		if _, err := tx.ExecContext(ctx, `INSERT INTO sandbox_metadata(sandbox_id, key, value) VALUES (?, ?, ?)`, sb.ID, k, v); err != nil {
			return fmt.Errorf("sandbox %s metadata: %w", sb.ID, err)
		}
	}
	return nil
}

type querier interface {
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
}

func getSandbox(ctx context.Context, q querier, id string) (store.Sandbox, error) {
	var data string
	err := q.QueryRowContext(ctx, `SELECT data FROM sandboxes WHERE id = ?`, id).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return store.Sandbox{}, err
	}
	var sb store.Sandbox
	if err := json.Unmarshal([]byte(data), &sb); err != nil {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: decode: %w", id, err)
	}
	return sb, nil
}

// GetSandbox implements store.Store.
func (s *DB) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	return getSandbox(ctx, s.db, id)
}

// UpdateSandbox implements store.Store.
func (s *DB) UpdateSandbox(ctx context.Context, id string, fn func(*store.Sandbox) error) (store.Sandbox, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer tx.Rollback()
	sb, err := getSandbox(ctx, tx, id)
	if err != nil {
		return store.Sandbox{}, err
	}
	version, prev := sb.Version, sb
	if err := fn(&sb); err != nil {
		return store.Sandbox{}, err
	}
	sb.ID, sb.Version = id, version+1
	if err := s.chargeSandbox(ctx, tx, &prev, sb); err != nil {
		return store.Sandbox{}, err
	}
	if err := writeSandbox(ctx, tx, sb); err != nil {
		return store.Sandbox{}, err
	}
	return sb, tx.Commit()
}

// CompareAndSwapSandbox implements store.Store.
func (s *DB) CompareAndSwapSandbox(ctx context.Context, sb store.Sandbox) (store.Sandbox, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.Sandbox{}, err
	}
	defer tx.Rollback()
	cur, err := getSandbox(ctx, tx, sb.ID)
	if err != nil {
		return store.Sandbox{}, err
	}
	if cur.Version != sb.Version {
		return store.Sandbox{}, fmt.Errorf("sandbox %s: version %d, stored %d: %w", sb.ID, sb.Version, cur.Version, errdefs.ErrConflict)
	}
	sb.Version++
	if err := s.chargeSandbox(ctx, tx, &cur, sb); err != nil {
		return store.Sandbox{}, err
	}
	if err := writeSandbox(ctx, tx, sb); err != nil {
		return store.Sandbox{}, err
	}
	return sb, tx.Commit()
}

// writeSandbox replaces an existing sandbox row and its metadata.
func writeSandbox(ctx context.Context, tx *sql.Tx, sb store.Sandbox) error {
	data, _ := json.Marshal(sb)
	if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET team_id = ?, state = ?, template_id = ?, node_id = ?, end_at = ?, version = ?, data = ?, vcpus = ?, memory_mb = ? WHERE id = ?`,
		sb.TeamID, sb.State, sb.TemplateID, sb.NodeID, sb.EndAt.UnixMilli(), sb.Version, string(data), store.VCPUsOf(sb), store.MemoryOf(sb), sb.ID); err != nil {
		return fmt.Errorf("sandbox %s: %w", sb.ID, err)
	}
	return putMetadata(ctx, tx, sb)
}

// DeleteSandbox implements store.Store.
func (s *DB) DeleteSandbox(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}

// DeleteSandboxIf implements store.Store.
func (s *DB) DeleteSandboxIf(ctx context.Context, id string, version int64) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ? AND version = ?`, id, version)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	if _, err := s.GetSandbox(ctx, id); err != nil {
		return err
	}
	return fmt.Errorf("sandbox %s changed since version %d: %w", id, version, errdefs.ErrConflict)
}

// ListSandboxes implements store.Store.
func (s *DB) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, string, error) {
	after, err := decodeCursor(f.Cursor)
	if err != nil {
		return nil, "", err
	}
	q := `SELECT seq, data FROM sandboxes s WHERE seq > ?`
	args := []any{after}
	if f.TeamID != "" {
		q += ` AND team_id = ?`
		args = append(args, f.TeamID)
	}
	if len(f.States) > 0 {
		q += ` AND state IN (` + strings.TrimSuffix(strings.Repeat("?,", len(f.States)), ",") + `)`
		for _, st := range f.States {
			args = append(args, st)
		}
	}
	if f.Template != "" {
		q += ` AND template_id = ?`
		args = append(args, f.Template)
	}
	if f.NodeID != "" {
		q += ` AND node_id = ?`
		args = append(args, f.NodeID)
	}
	for k, v := range f.Metadata {
		q += ` AND EXISTS (SELECT 1 FROM sandbox_metadata m WHERE m.sandbox_id = s.id AND m.key = ? AND m.value = ?)`
		args = append(args, k, v)
	}
	return page[store.Sandbox](ctx, s.db, q, args, f.Limit)
}

// page runs a "SELECT seq, data ... ORDER BY seq" query (adding the limit,
// one row more to know whether a next page exists) and decodes a page of
// JSON records with the cursor of the next page.
func page[T any](ctx context.Context, db *sql.DB, q string, args []any, limit int) ([]T, string, error) {
	q += ` ORDER BY seq`
	if limit > 0 {
		q += ` LIMIT ?`
		args = append(args, limit+1)
	}
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, "", err
	}
	defer rows.Close()
	var out []T
	var seqs []int64
	for rows.Next() {
		var seq int64
		var data string
		if err := rows.Scan(&seq, &data); err != nil {
			return nil, "", err
		}
		var v T
		if err := json.Unmarshal([]byte(data), &v); err != nil {
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
		next = encodeCursor(seqs[limit-1])
	}
	return out, next, nil
}

// Expired implements store.Store.
func (s *DB) Expired(ctx context.Context, now time.Time, states ...string) ([]store.Sandbox, error) {
	if len(states) == 0 {
		return nil, nil
	}
	q := `SELECT data FROM sandboxes WHERE end_at <= ? AND state IN (` + strings.TrimSuffix(strings.Repeat("?,", len(states)), ",") + `) ORDER BY end_at`
	args := []any{now.UnixMilli()}
	for _, st := range states {
		args = append(args, st)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Sandbox
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, err
		}
		var sb store.Sandbox
		if err := json.Unmarshal([]byte(data), &sb); err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// PutSnapshot implements store.Store (insert or replace, names included).
func (s *DB) PutSnapshot(ctx context.Context, sn store.Snapshot) error {
	return s.writeSnapshot(ctx, sn, true)
}

// CreateSnapshot implements store.Store (insert only).
func (s *DB) CreateSnapshot(ctx context.Context, sn store.Snapshot) error {
	return s.writeSnapshot(ctx, sn, false)
}

func (s *DB) writeSnapshot(ctx context.Context, sn store.Snapshot, replace bool) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if sn.Kind == store.SnapshotKindUser {
		prev := int64(-1)
		if err := tx.QueryRowContext(ctx, `SELECT json_extract(data, '$.sizeBytes') FROM snapshots WHERE id = ?`, sn.ID).Scan(&prev); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("snapshot %s: %w", sn.ID, err)
		}
		if err := chargeBytes(ctx, tx, sn.TeamID, "snapshotBytes", sn.ID, prev, sn.SizeBytes); err != nil {
			return err
		}
	}
	data, _ := json.Marshal(sn)
	if !replace {
		if _, err := tx.ExecContext(ctx, `INSERT INTO snapshots(id, team_id, sandbox_id, data) VALUES (?, ?, ?, ?)`, sn.ID, sn.TeamID, sn.SandboxID, string(data)); err != nil {
			if isUnique(err) {
				return fmt.Errorf("snapshot %s: %w", sn.ID, errdefs.ErrAlreadyExists)
			}
			return fmt.Errorf("snapshot %s: %w", sn.ID, err)
		}
	} else if _, err := tx.ExecContext(ctx, `INSERT INTO snapshots(id, team_id, sandbox_id, data) VALUES (?, ?, ?, ?)
		ON CONFLICT(id) DO UPDATE SET team_id = excluded.team_id, sandbox_id = excluded.sandbox_id, data = excluded.data`, sn.ID, sn.TeamID, sn.SandboxID, string(data)); err != nil {
		return fmt.Errorf("snapshot %s: %w", sn.ID, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM snapshot_names WHERE snapshot_id = ?`, sn.ID); err != nil {
		return err
	}
	for _, n := range sn.Names {
		if _, err := tx.ExecContext(ctx, `INSERT INTO snapshot_names(snapshot_id, team_id, name) VALUES (?, ?, ?)`, sn.ID, sn.TeamID, n); err != nil {
			if isUnique(err) {
				return fmt.Errorf("snapshot name %q: %w", n, errdefs.ErrAlreadyExists)
			}
			return err
		}
	}
	return tx.Commit()
}

// GetSnapshot implements store.Store.
func (s *DB) GetSnapshot(ctx context.Context, id string) (store.Snapshot, error) {
	var data string
	err := s.db.QueryRowContext(ctx, `SELECT data FROM snapshots WHERE id = ?`, id).Scan(&data)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return store.Snapshot{}, err
	}
	var sn store.Snapshot
	return sn, json.Unmarshal([]byte(data), &sn)
}

// UpdateSnapshot implements store.Store.
func (s *DB) UpdateSnapshot(ctx context.Context, id string, fn func(*store.Snapshot) error) (store.Snapshot, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return store.Snapshot{}, err
	}
	defer tx.Rollback()
	var sn store.Snapshot
	if err := getJSON(ctx, tx, "snapshots", "id", id, "snapshot", &sn); err != nil {
		return store.Snapshot{}, err
	}
	names, team := sn.Names, sn.TeamID
	if err := fn(&sn); err != nil {
		return store.Snapshot{}, err
	}
	sn.ID, sn.Names, sn.TeamID = id, names, team
	data, _ := json.Marshal(sn)
	if _, err := tx.ExecContext(ctx, `UPDATE snapshots SET sandbox_id = ?, data = ? WHERE id = ?`, sn.SandboxID, string(data), id); err != nil {
		return store.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	return sn, tx.Commit()
}

// ListSnapshots implements store.Store.
func (s *DB) ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]store.Snapshot, string, error) {
	after, err := decodeCursor(f.Cursor)
	if err != nil {
		return nil, "", err
	}
	q := `SELECT seq, data FROM snapshots s WHERE seq > ?`
	args := []any{after}
	if f.TeamID != "" {
		q += ` AND team_id = ?`
		args = append(args, f.TeamID)
	}
	if f.SandboxID != "" {
		q += ` AND sandbox_id = ?`
		args = append(args, f.SandboxID)
	}
	if f.Name != "" {
		q += ` AND EXISTS (SELECT 1 FROM snapshot_names n WHERE n.snapshot_id = s.id AND n.team_id = ? AND n.team_id != '' AND n.name = ?)`
		args = append(args, f.TeamID, f.Name)
	}
	return page[store.Snapshot](ctx, s.db, q, args, f.Limit)
}

// DeleteSnapshot implements store.Store.
func (s *DB) DeleteSnapshot(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("snapshot %s: %w", id, errdefs.ErrNotFound)
	}
	return nil
}
