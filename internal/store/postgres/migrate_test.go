package postgres

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/spore-run/spore/internal/store"
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
// keys valid and administrators, as every key was before roles.
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
	if err != nil || k.ID != "k1" || k.Role != store.RoleAdmin || k.Revoked() {
		t.Fatalf("old key = %+v, %v", k, err)
	}
	if n, err := s.CountAPIKeys(ctx); err != nil || n != 1 {
		t.Fatalf("count = %d, %v", n, err)
	}
}
