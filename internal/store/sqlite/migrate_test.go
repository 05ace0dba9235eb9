package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/spore-run/spore/internal/store"
)

// A database made by the first schema (before the fleet's migration 2)
// opens with its sandboxes intact, at version 1 and filtered by node.
func TestMigrateFromV1(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "spore.db")
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY)`,
		migrations[0],
		`INSERT INTO schema_migrations(version) VALUES (1)`,
		`INSERT INTO sandboxes(id, state, template_id, end_at, data) VALUES ('old', 'running', 'base', 0,
			'{"id":"old","templateID":"base","state":"running","nodeID":"local","cpuCount":2}')`,
	} {
		if _, err := raw.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	raw.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.GetSandbox(ctx, "old")
	if err != nil || got.Version != 1 || got.CPUCount != 2 || got.NodeID != "local" {
		t.Fatalf("old sandbox = %+v, %v", got, err)
	}
	l, _, err := s.ListSandboxes(ctx, store.SandboxFilter{NodeID: "local"})
	if err != nil || len(l) != 1 {
		t.Fatalf("by node = %v, %v", l, err)
	}
	upd, err := s.CompareAndSwapSandbox(ctx, got)
	if err != nil || upd.Version != 2 {
		t.Fatalf("swap = %+v, %v", upd, err)
	}
}

// A database at schema version 2 (before template builds) opens with its
// templates intact and gains the builds, logs and tags tables.
func TestMigrateFromV2(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "spore.db")
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY)`,
		migrations[0], migrations[1],
		`INSERT INTO schema_migrations(version) VALUES (1), (2)`,
		`INSERT INTO templates(name, data) VALUES ('py', '{"name":"py","snapshotID":"s1"}')`,
	} {
		if _, err := raw.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	raw.Close()
	s, err := Open(ctx, path)
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
}

// A database at schema version 4 (keys without roles) opens with its keys
// valid and administrators, as every key was before roles.
func TestMigrateKeysFromV4(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "spore.db")
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY)`,
		migrations[0], migrations[1], migrations[2], migrations[3],
		`INSERT INTO schema_migrations(version) VALUES (1), (2), (3), (4)`,
		`INSERT INTO api_keys(id, hash, created_at) VALUES ('k1', 'abc', 1700000000000)`,
	} {
		if _, err := raw.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	raw.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k, err := s.APIKeyByHash(ctx, "abc")
	if err != nil || k.ID != "k1" || k.Role != store.RoleAdmin || k.Revoked() || k.CreatedAt.UnixMilli() != 1700000000000 {
		t.Fatalf("old key = %+v, %v", k, err)
	}
	if n, err := s.CountAPIKeys(ctx); err != nil || n != 1 {
		t.Fatalf("count = %d, %v", n, err)
	}
	if _, err := s.APIKeysVersion(ctx); err != nil {
		t.Fatal(err)
	}
}
