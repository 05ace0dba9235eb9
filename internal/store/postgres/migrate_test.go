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
