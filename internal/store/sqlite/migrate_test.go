package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/store/storetest"
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
// valid and operators: every key was an administrator before roles, and
// the administrators of then are the operators of teams (migration 8).
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
	if err != nil || k.ID != "k1" || k.Role != store.RoleOperator || k.TeamID != "" || k.Revoked() || k.CreatedAt.UnixMilli() != 1700000000000 {
		t.Fatalf("old key = %+v, %v", k, err)
	}
	if n, err := s.CountAPIKeys(ctx); err != nil || n != 1 {
		t.Fatalf("count = %d, %v", n, err)
	}
	if _, err := s.APIKeysVersion(ctx); err != nil {
		t.Fatal(err)
	}
}

// A database at schema version 7 (before teams), with a row of every kind
// as that release wrote it, opens with every row kept and the default
// team's (storetest.CheckMigratedToTeams says what that means).
func TestMigrateToTeams(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "spore.db")
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	qs := []string{`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY)`}
	qs = append(qs, migrations[:7]...)
	qs = append(qs, `INSERT INTO schema_migrations(version) VALUES (1), (2), (3), (4), (5), (6), (7)`,
		`INSERT INTO sandboxes(id, state, template_id, node_id, end_at, version, data) VALUES ('sb_run', 'running', 'base', 'n1', 1800000000000, 1,
			'{"id":"sb_run","templateID":"base","state":"running","metadata":{"user":"alice"},"cpuCount":2,"memoryMB":512,"diskSizeMB":1024,"startedAt":"2027-01-15T08:00:00Z","endAt":"2027-01-15T08:30:00Z","autoPause":false,"allowInternet":true,"nodeID":"n1","version":1}')`,
		`INSERT INTO sandbox_metadata(sandbox_id, key, value) VALUES ('sb_run', 'user', 'alice')`,
		`INSERT INTO sandboxes(id, state, template_id, node_id, end_at, version, data) VALUES ('sb_pool', 'pooled', 'base', 'n1', 1800000000000, 1,
			'{"id":"sb_pool","templateID":"base","state":"pooled","cpuCount":2,"memoryMB":512,"diskSizeMB":1024,"startedAt":"2027-01-15T08:00:00Z","endAt":"2027-01-15T08:30:00Z","autoPause":false,"allowInternet":true,"nodeID":"n1","version":1}')`,
		`INSERT INTO snapshots(id, sandbox_id, data) VALUES ('sn1', 'sb_run',
			'{"id":"sn1","names":["golden"],"sandboxID":"sb_run","kind":"snapshot","createdAt":"2027-01-15T08:10:00Z","sizeBytes":1024,"nodeID":"n1"}')`,
		`INSERT INTO snapshot_names(snapshot_id, name) VALUES ('sn1', 'golden')`,
		`INSERT INTO secrets(id, name, data) VALUES ('sec_1', 'openai',
			'{"id":"sec_1","name":"openai","version":3,"sealed":"AQID","createdAt":"2027-01-15T08:00:00Z","updatedAt":"2027-01-15T08:05:00Z"}')`,
		`INSERT INTO volumes(id, name, data) VALUES ('vol1', 'data',
			'{"id":"vol1","name":"data","mode":"shared","sizeBytes":1073741824,"token":"tok","createdAt":"2027-01-15T08:00:00Z","updatedAt":"2027-01-15T08:00:00Z"}')`,
		`INSERT INTO api_keys(id, hash, name, role, source, mask, created_at, revoked_at) VALUES
			('k_admin', 'h_admin', 'spore up', 'admin', 'generated', 'spore_ad…in', 1790000000000, 0),
			('k_user', 'h_user', 'ci', 'user', 'api', 'spore_us…er', 1790000001000, 0),
			('k_gone', 'h_gone', 'old', 'user', 'api', 'spore_go…ne', 1790000002000, 1790000003000)`,
		`UPDATE api_key_version SET version = 5`,
		`INSERT INTO templates(name, data) VALUES ('py', '{"name":"py","snapshotID":"sn0"}')`)
	for _, q := range qs {
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
	storetest.CheckMigratedToTeams(t, s, 5)
}
