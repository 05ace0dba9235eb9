package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/storetest"
	"github.com/spore-run/spore/internal/testenv"
)

// A database at schema version 2 (before template builds), as a fleet
// running the previous release has it, opens with its templates intact
// and gains the builds, logs and tags tables.
func TestMigrateFromV2(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY)`,
		migrations[0], migrations[1],
		`INSERT INTO schema_migrations(version) VALUES (1), (2)`,
		`INSERT INTO templates(name, data) VALUES ('py', '{"name":"py","snapshotID":"s1"}')`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	conn.Close(ctx)
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if tpl, err := s.GetTemplate(ctx, "py"); err != nil || tpl.SnapshotID != "s1" {
		t.Fatalf("old template = %+v, %v", tpl, err)
	}
	if err := s.CreateBuild(ctx, store.Build{ID: "b1", Template: "py", Status: store.BuildWaiting}); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendBuildLogs(ctx, "b1", store.BuildLog{Message: "hello"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetTag(ctx, store.TemplateTag{Template: "py", Tag: "latest", BuildID: "b1"}); err != nil {
		t.Fatal(err)
	}
	if l, err := s.BuildLogs(ctx, "b1", 0, 0); err != nil || len(l) != 1 {
		t.Fatalf("logs after the migration = %v, %v", l, err)
	}
	var v int
	if err := s.pool.QueryRow(ctx, `SELECT MAX(version) FROM schema_migrations`).Scan(&v); err != nil || v != len(migrations) {
		t.Fatalf("schema version %d, %v; want %d", v, err, len(migrations))
	}
}

// A fleet database at schema version 4 (keys without roles) opens with its
// keys valid and operators: every key was an administrator before roles,
// and the administrators of then are the operators of teams (migration 8).
func TestMigrateKeysFromV4(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY)`,
		migrations[0], migrations[1], migrations[2], migrations[3],
		`INSERT INTO schema_migrations(version) VALUES (1), (2), (3), (4)`,
		`INSERT INTO api_keys(id, hash, created_at) VALUES ('k1', 'abc', now())`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	conn.Close(ctx)
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k, err := s.APIKeyByHash(ctx, "abc")
	if err != nil || k.ID != "k1" || k.Role != store.RoleOperator || k.TeamID != "" || k.Revoked() {
		t.Fatalf("old key = %+v, %v", k, err)
	}
	if n, err := s.CountAPIKeys(ctx); err != nil || n != 1 {
		t.Fatalf("count = %d, %v", n, err)
	}
}

// A fleet database at schema version 7 (before teams), with a row of
// every kind as that release wrote it, opens with every row kept and the
// default team's (storetest.CheckMigratedToTeams says what that means):
// the same migration as store/sqlite's 8, the deployment-wide unique
// constraints on names replaced by per-team ones.
func TestMigrateToTeams(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	qs := []string{`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY)`}
	qs = append(qs, migrations[:7]...)
	qs = append(qs, `INSERT INTO schema_migrations(version) VALUES (1), (2), (3), (4), (5), (6), (7)`,
		`INSERT INTO sandboxes(id, state, template_id, node_id, end_at, version, data) VALUES ('sb_run', 'running', 'base', 'n1', '2027-01-15T08:30:00Z', 1,
			'{"id":"sb_run","templateID":"base","state":"running","metadata":{"user":"alice"},"cpuCount":2,"memoryMB":512,"diskSizeMB":1024,"startedAt":"2027-01-15T08:00:00Z","endAt":"2027-01-15T08:30:00Z","autoPause":false,"allowInternet":true,"nodeID":"n1","version":1}')`,
		`INSERT INTO sandboxes(id, state, template_id, node_id, end_at, version, data) VALUES ('sb_pool', 'pooled', 'base', 'n1', '2027-01-15T08:30:00Z', 1,
			'{"id":"sb_pool","templateID":"base","state":"pooled","cpuCount":2,"memoryMB":512,"diskSizeMB":1024,"startedAt":"2027-01-15T08:00:00Z","endAt":"2027-01-15T08:30:00Z","autoPause":false,"allowInternet":true,"nodeID":"n1","version":1}')`,
		`INSERT INTO snapshots(id, sandbox_id, data) VALUES ('sn1', 'sb_run',
			'{"id":"sn1","names":["golden"],"sandboxID":"sb_run","kind":"snapshot","createdAt":"2027-01-15T08:10:00Z","sizeBytes":1024,"nodeID":"n1"}')`,
		`INSERT INTO snapshot_names(snapshot_id, name) VALUES ('sn1', 'golden')`,
		`INSERT INTO secrets(id, name, data) VALUES ('sec_1', 'openai',
			'{"id":"sec_1","name":"openai","version":3,"sealed":"AQID","createdAt":"2027-01-15T08:00:00Z","updatedAt":"2027-01-15T08:05:00Z"}')`,
		`INSERT INTO volumes(id, name, data) VALUES ('vol1', 'data',
			'{"id":"vol1","name":"data","mode":"shared","sizeBytes":1073741824,"token":"tok","createdAt":"2027-01-15T08:00:00Z","updatedAt":"2027-01-15T08:00:00Z"}')`,
		`INSERT INTO api_keys(id, hash, name, role, source, mask, created_at, revoked_at) VALUES
			('k_admin', 'h_admin', 'spore up', 'admin', 'generated', 'spore_ad…in', '2026-09-21T14:13:20Z', NULL),
			('k_user', 'h_user', 'ci', 'user', 'api', 'spore_us…er', '2026-09-21T14:13:21Z', NULL),
			('k_gone', 'h_gone', 'old', 'user', 'api', 'spore_go…ne', '2026-09-21T14:13:22Z', '2026-09-21T14:13:23Z')`,
		`UPDATE api_key_version SET version = 5`,
		`INSERT INTO templates(name, data) VALUES ('py', '{"name":"py","snapshotID":"sn0"}')`)
	for _, q := range qs {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	conn.Close(ctx)
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	storetest.CheckMigratedToTeams(t, s, 5)
}
