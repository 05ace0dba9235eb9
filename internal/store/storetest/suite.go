// Package storetest is the conformance suite every store.Store passes.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// Backend is what the suite needs of an implementation.
type Backend struct {
	// New creates a fresh, empty database and returns where it is (a
	// file path, a DSN).
	New func(t *testing.T) string
	// Open opens a new handle on the database at db, as another process
	// or API replica would; the suite closes it. Handles on one database
	// share everything.
	Open func(t *testing.T, db string) store.Store
}

// Run runs the suite.
func Run(t *testing.T, b Backend) {
	// open returns a handle on a fresh database.
	open := func(t *testing.T) store.Store { return b.handle(t, b.New(t)) }
	// two returns two handles on one fresh database.
	two := func(t *testing.T) (store.Store, store.Store) {
		db := b.New(t)
		return b.handle(t, db), b.handle(t, db)
	}
	t.Run("SandboxCRUD", func(t *testing.T) { testSandboxCRUD(t, open(t)) })
	t.Run("ListFiltersAndPaging", func(t *testing.T) { testList(t, open(t)) })
	t.Run("Expired", func(t *testing.T) { testExpired(t, open(t)) })
	t.Run("ConcurrentUpdates", func(t *testing.T) { testConcurrent(t, open(t)) })
	t.Run("Snapshots", func(t *testing.T) { testSnapshots(t, open(t)) })
	t.Run("APIKeys", func(t *testing.T) { testKeys(t, open(t)) })
	t.Run("TwoHandles/APIKeyChangesAreSeen", func(t *testing.T) { testKeysTwoHandles(t, two) })
	t.Run("TwoHandles/NodeKeyFirstBindingWins", func(t *testing.T) { testNodeKeys(t, two) })

	t.Run("VersionAndCompareAndSwap", func(t *testing.T) { testCAS(t, open(t)) })
	t.Run("DeleteIfVersion", func(t *testing.T) { testDeleteIf(t, open(t)) })
	t.Run("NodeIDFilter", func(t *testing.T) { testNodeFilter(t, open(t)) })
	t.Run("SnapshotFleetFields", func(t *testing.T) { testSnapshotFields(t, open(t)) })
	t.Run("SnapshotUpdateAndCreate", func(t *testing.T) { testSnapshotUpdateAndCreate(t, open(t)) })
	t.Run("TwoHandles/SnapshotUpdateVersusDelete", func(t *testing.T) { testSnapshotUpdateVersusDelete(t, two) })
	t.Run("Templates", func(t *testing.T) { testTemplates(t, open(t)) })
	t.Run("Nodes", func(t *testing.T) { testNodes(t, open(t)) })
	t.Run("ResolveRef", func(t *testing.T) { testResolveRef(t, open(t)) })
	t.Run("TwoHandles/NoLostUpdate", func(t *testing.T) { testTwoHandlesUpdate(t, two) })
	t.Run("TwoHandles/OneCASWinner", func(t *testing.T) { testTwoHandlesCAS(t, two) })
	t.Run("TwoHandles/HibernationClaim", func(t *testing.T) { testHibernationClaim(t, two) })
	t.Run("TwoHandles/LeaseExclusive", func(t *testing.T) { testLeases(t, two) })
	t.Run("TwoHandles/LeaseRace", func(t *testing.T) { testLeaseRace(t, two) })
	t.Run("TwoHandles/LeaseExpiryAndRenewal", func(t *testing.T) { testLeaseExpiry(t, two) })

	t.Run("Builds", func(t *testing.T) { testBuilds(t, open(t)) })
	t.Run("BuildLogs", func(t *testing.T) { testBuildLogs(t, open(t)) })
	t.Run("BuildLogCap", func(t *testing.T) { testBuildLogCap(t, open(t)) })
	t.Run("Tags", func(t *testing.T) { testTags(t, open(t)) })
	t.Run("DeleteBuilds", func(t *testing.T) { testDeleteBuilds(t, open(t)) })
	t.Run("TwoHandles/BuildNoLostUpdate", func(t *testing.T) { testBuildNoLostUpdate(t, two) })
	t.Run("TwoHandles/BuildLogsConcurrentAppends", func(t *testing.T) { testBuildLogsConcurrent(t, two) })
	t.Run("Secrets", func(t *testing.T) { testSecrets(t, open(t)) })
	t.Run("TwoHandles/SecretNoLostUpdate", func(t *testing.T) { testSecretNoLostUpdate(t, two) })
	t.Run("Volumes", func(t *testing.T) { testVolumes(t, open(t)) })
	t.Run("TwoHandles/VolumeDeleteVersusHold", func(t *testing.T) { testVolumeDeleteVersusHold(t, two) })
	t.Run("Teams", func(t *testing.T) { testTeams(t, open(t)) })
	t.Run("DeleteTeam", func(t *testing.T) { testDeleteTeam(t, open(t)) })
	t.Run("TeamNames", func(t *testing.T) { testTeamNames(t, open(t)) })
	t.Run("TeamLookups", func(t *testing.T) { testTeamLookups(t, open(t)) })
	t.Run("TeamLists", func(t *testing.T) { testTeamLists(t, open(t)) })
	t.Run("APIKeyFields", func(t *testing.T) { testKeyFields(t, open(t)) })
	t.Run("Quotas", func(t *testing.T) { testQuotas(t, open(t)) })
	t.Run("Audit", func(t *testing.T) { testAudit(t, open(t)) })
	t.Run("TeamMetrics", func(t *testing.T) { testTeamMetrics(t, open(t)) })
	t.Run("CreateRate", func(t *testing.T) { testCreateRate(t, open(t)) })
	t.Run("TwoHandles/QuotaAcrossHandles", func(t *testing.T) { a, b := two(t); testQuotaAcrossHandles(t, a, b) })
}

func (b Backend) handle(t *testing.T, db string) store.Store {
	t.Helper()
	s := b.Open(t, db)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

func sb(id string, md map[string]string) store.Sandbox {
	now := time.Now().UTC().Truncate(time.Millisecond)
	return store.Sandbox{ID: id, TemplateID: "base", State: store.StateRunning, Metadata: md,
		EnvVars: map[string]string{"A": "1"}, CPUCount: 2, MemoryMB: 512, DiskSizeMB: 1024,
		StartedAt: now, EndAt: now.Add(time.Minute), AllowInternet: true, DenyOut: []string{"10.0.0.0/8"}, NodeID: "local"}
}

func testSandboxCRUD(t *testing.T, s store.Store) {
	ctx := context.Background()
	want := sb("i1", map[string]string{"user": "alice"})
	want.Version = 7 // ignored: a new sandbox is version 1
	if err := s.CreateSandbox(ctx, want); err != nil {
		t.Fatal(err)
	}
	want.Version = 1
	if err := s.CreateSandbox(ctx, want); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("second create = %v", err)
	}
	got, err := s.GetSandbox(ctx, "i1")
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("get = %+v, %v; want %+v", got, err, want)
	}
	if _, err := s.GetSandbox(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("get missing = %v", err)
	}
	upd, err := s.UpdateSandbox(ctx, "i1", func(x *store.Sandbox) error {
		x.State = store.StatePaused
		x.Metadata["user"] = "bob"
		return nil
	})
	if err != nil || upd.State != store.StatePaused {
		t.Fatalf("update = %+v, %v", upd, err)
	}
	boom := errors.New("boom")
	if _, err := s.UpdateSandbox(ctx, "i1", func(x *store.Sandbox) error { x.State = "x"; return boom }); !errors.Is(err, boom) {
		t.Fatalf("aborted update = %v", err)
	}
	if got, _ := s.GetSandbox(ctx, "i1"); got.State != store.StatePaused || got.Metadata["user"] != "bob" {
		t.Fatalf("after aborted update: %+v", got)
	}
	if _, err := s.UpdateSandbox(ctx, "nope", func(*store.Sandbox) error { return nil }); !errdefs.IsNotFound(err) {
		t.Fatalf("update missing = %v", err)
	}
	if err := s.DeleteSandbox(ctx, "i1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(ctx, "i1"); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete = %v", err)
	}
	if l, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{Metadata: map[string]string{"user": "bob"}}); len(l) != 0 {
		t.Fatalf("metadata of a deleted sandbox still matches: %v", l)
	}
}

func ids(l []store.Sandbox) string {
	out := ""
	for _, s := range l {
		out += s.ID + " "
	}
	return out
}

func testList(t *testing.T, s store.Store) {
	ctx := context.Background()
	for i := range 7 {
		x := sb(fmt.Sprintf("i%d", i), map[string]string{"team": []string{"a", "b"}[i%2], "n": fmt.Sprint(i)})
		if i == 3 {
			x.State = store.StatePaused
			x.TemplateID = "code-interpreter-v1"
		}
		if err := s.CreateSandbox(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	all, next, err := s.ListSandboxes(ctx, store.SandboxFilter{})
	if err != nil || len(all) != 7 || next != "" || ids(all) != "i0 i1 i2 i3 i4 i5 i6 " {
		t.Fatalf("list all = %s %q %v", ids(all), next, err)
	}
	a, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{Metadata: map[string]string{"team": "a"}})
	if ids(a) != "i0 i2 i4 i6 " {
		t.Fatalf("team a = %s", ids(a))
	}
	two, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{Metadata: map[string]string{"team": "b", "n": "3"}})
	if ids(two) != "i3 " {
		t.Fatalf("two pairs = %s", ids(two))
	}
	p, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{States: []string{store.StatePaused}})
	if ids(p) != "i3 " {
		t.Fatalf("paused = %s", ids(p))
	}
	ci, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{Template: "code-interpreter-v1"})
	if ids(ci) != "i3 " {
		t.Fatalf("template = %s", ids(ci))
	}
	// Paging: every item once, in order.
	var seen string
	cursor := ""
	pages := 0
	for {
		page, next, err := s.ListSandboxes(ctx, store.SandboxFilter{Limit: 3, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		seen += ids(page)
		pages++
		if next == "" {
			break
		}
		cursor = next
	}
	if seen != "i0 i1 i2 i3 i4 i5 i6 " || pages != 3 {
		t.Fatalf("paged = %q in %d pages", seen, pages)
	}
	for _, bad := range []string{"garbage", "c2VxOi0x", "!!!"} {
		if _, _, err := s.ListSandboxes(ctx, store.SandboxFilter{Cursor: bad}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("cursor %q = %v", bad, err)
		}
	}
}

func testExpired(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now()
	for i, d := range []time.Duration{-time.Minute, time.Minute, -time.Second} {
		x := sb(fmt.Sprintf("e%d", i), nil)
		x.EndAt = now.Add(d)
		if i == 2 {
			x.State = store.StatePaused
		}
		s.CreateSandbox(ctx, x)
	}
	got, err := s.Expired(ctx, now, store.StateRunning)
	if err != nil || ids(got) != "e0 " {
		t.Fatalf("expired running = %s %v", ids(got), err)
	}
	got, _ = s.Expired(ctx, now, store.StateRunning, store.StatePaused)
	if len(got) != 2 {
		t.Fatalf("expired running+paused = %s", ids(got))
	}
}

func testConcurrent(t *testing.T, s store.Store) {
	ctx := context.Background()
	s.CreateSandbox(ctx, sb("c", map[string]string{"n": "0"}))
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.UpdateSandbox(ctx, "c", func(x *store.Sandbox) error {
				x.CPUCount++
				return nil
			})
		}()
	}
	wg.Wait()
	if got, _ := s.GetSandbox(ctx, "c"); got.CPUCount != 22 || got.Version != 21 {
		t.Fatalf("lost updates: cpu %d version %d, want 22 and 21", got.CPUCount, got.Version)
	}
}

func testSnapshots(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	for i := range 5 {
		sn := store.Snapshot{ID: fmt.Sprintf("s%d", i), TeamID: teamA, SandboxID: []string{"x", "y"}[i%2], Kind: "snapshot", CreatedAt: now, SizeBytes: int64(i)}
		if i == 2 {
			sn.Names = []string{"golden"}
		}
		if err := s.PutSnapshot(ctx, sn); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.PutSnapshot(ctx, store.Snapshot{ID: "s9", TeamID: teamA, Names: []string{"golden"}}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("taken name = %v", err)
	}
	got, err := s.GetSnapshot(ctx, "s2")
	if err != nil || got.Names[0] != "golden" || got.SandboxID != "x" {
		t.Fatalf("get = %+v %v", got, err)
	}
	named, _, _ := s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: teamA, Name: "golden"})
	if len(named) != 1 || named[0].ID != "s2" {
		t.Fatalf("by name = %v", named)
	}
	ofX, _, _ := s.ListSnapshots(ctx, store.SnapshotFilter{SandboxID: "x"})
	if len(ofX) != 3 {
		t.Fatalf("of x = %v", ofX)
	}
	page, next, _ := s.ListSnapshots(ctx, store.SnapshotFilter{Limit: 2})
	rest, last, _ := s.ListSnapshots(ctx, store.SnapshotFilter{Limit: 10, Cursor: next})
	if len(page) != 2 || next == "" || len(rest) != 3 || last != "" {
		t.Fatalf("paging: %d %q %d %q", len(page), next, len(rest), last)
	}
	if err := s.DeleteSnapshot(ctx, "s2"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSnapshot(ctx, "s2"); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete = %v", err)
	}
	// The name is free again.
	if err := s.PutSnapshot(ctx, store.Snapshot{ID: "s9", TeamID: teamA, Names: []string{"golden"}}); err != nil {
		t.Fatalf("reuse of a freed name = %v", err)
	}
}

// UpdateSnapshot changes a row in place (keeping its ID and names),
// serializes concurrent updates, never writes back a missing row, and is
// aborted by fn's error; CreateSnapshot inserts only.
func testSnapshotUpdateAndCreate(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.PutSnapshot(ctx, store.Snapshot{ID: "s1", TeamID: teamA, SandboxID: "x", Names: []string{"golden"}, Storage: store.StorageUploading}); err != nil {
		t.Fatal(err)
	}
	got, err := s.UpdateSnapshot(ctx, "s1", func(x *store.Snapshot) error {
		x.Storage, x.StoredBytes = store.StorageDurable, 42
		x.ID, x.Names, x.TeamID = "other", []string{"renamed"}, teamB // not the way to rename or move: kept
		return nil
	})
	if err != nil || got.ID != "s1" || got.TeamID != teamA || got.Storage != store.StorageDurable || len(got.Names) != 1 || got.Names[0] != "golden" {
		t.Fatalf("update = %+v %v", got, err)
	}
	if now, err := s.GetSnapshot(ctx, "s1"); err != nil || now.TeamID != teamA || now.Storage != store.StorageDurable || now.StoredBytes != 42 || now.SandboxID != "x" {
		t.Fatalf("after update: %+v %v", now, err)
	}
	if named, _, _ := s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: teamA, Name: "golden"}); len(named) != 1 || named[0].ID != "s1" {
		t.Fatalf("by name after update = %v", named)
	}
	if _, err := s.GetSnapshot(ctx, "other"); !errdefs.IsNotFound(err) {
		t.Fatalf("a row under the ID fn set: %v", err)
	}
	boom := errors.New("boom")
	if _, err := s.UpdateSnapshot(ctx, "s1", func(x *store.Snapshot) error { x.StoredBytes = 7; return boom }); !errors.Is(err, boom) {
		t.Fatalf("update whose fn fails = %v", err)
	}
	if now, _ := s.GetSnapshot(ctx, "s1"); now.StoredBytes != 42 {
		t.Fatalf("an aborted update wrote: %+v", now)
	}
	if _, err := s.UpdateSnapshot(ctx, "s404", func(*store.Snapshot) error { return nil }); !errdefs.IsNotFound(err) {
		t.Fatalf("update of a missing row = %v", err)
	}
	if _, err := s.GetSnapshot(ctx, "s404"); !errdefs.IsNotFound(err) {
		t.Fatalf("an update made a row: %v", err)
	}
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.UpdateSnapshot(ctx, "s1", func(x *store.Snapshot) error {
				x.Copies = append(x.Copies, "n")
				return nil
			}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if now, _ := s.GetSnapshot(ctx, "s1"); len(now.Copies) != 20 {
		t.Fatalf("lost updates: %d copies, want 20", len(now.Copies))
	}

	if err := s.CreateSnapshot(ctx, store.Snapshot{ID: "s1", Storage: store.StorageLocal}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("create over a row = %v", err)
	}
	if now, _ := s.GetSnapshot(ctx, "s1"); now.Storage != store.StorageDurable || len(now.Names) != 1 {
		t.Fatalf("a refused create changed the row: %+v", now)
	}
	if err := s.CreateSnapshot(ctx, store.Snapshot{ID: "s2", TeamID: teamA, Names: []string{"golden"}}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("create with a taken name = %v", err)
	}
	if _, err := s.GetSnapshot(ctx, "s2"); !errdefs.IsNotFound(err) {
		t.Fatalf("a create refused for its name left a row: %v", err)
	}
	if err := s.CreateSnapshot(ctx, store.Snapshot{ID: "s2", TeamID: teamA, SandboxID: "y", Names: []string{"silver"}}); err != nil {
		t.Fatal(err)
	}
	if named, _, _ := s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: teamA, Name: "silver"}); len(named) != 1 || named[0].ID != "s2" || named[0].SandboxID != "y" {
		t.Fatalf("created = %v", named)
	}
}

// An update racing a delete on another handle either lands before it
// (and the delete removes the row) or finds no row: the row is never
// brought back.
func testSnapshotUpdateVersusDelete(t *testing.T, two func(*testing.T) (store.Store, store.Store)) {
	a, b := two(t)
	ctx := context.Background()
	for i := range 20 {
		id := fmt.Sprintf("s%d", i)
		if err := a.PutSnapshot(ctx, store.Snapshot{ID: id, Storage: store.StorageUploading}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := a.UpdateSnapshot(ctx, id, func(x *store.Snapshot) error {
				x.Storage = store.StorageDurable
				return nil
			}); err != nil && !errdefs.IsNotFound(err) {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			if err := b.DeleteSnapshot(ctx, id); err != nil {
				t.Error(err)
			}
		}()
		wg.Wait()
		if got, err := a.GetSnapshot(ctx, id); !errdefs.IsNotFound(err) {
			t.Fatalf("round %d: the deleted row is back: %+v %v", i, got, err)
		}
	}
}

func testKeys(t *testing.T, s store.Store) {
	ctx := context.Background()
	if n, _ := s.CountAPIKeys(ctx); n != 0 {
		t.Fatalf("fresh store has %d keys", n)
	}
	k := store.APIKey{ID: "k1", Hash: "abc", CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	if err := s.AddAPIKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	if err := s.AddAPIKey(ctx, store.APIKey{ID: "k2", Hash: "abc"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("duplicate hash = %v", err)
	}
	got, err := s.APIKeyByHash(ctx, "abc")
	if err != nil || got.ID != "k1" || !got.CreatedAt.Equal(k.CreatedAt) {
		t.Fatalf("by hash = %+v %v", got, err)
	}
	if _, err := s.APIKeyByHash(ctx, "zzz"); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown hash = %v", err)
	}
	if n, _ := s.CountAPIKeys(ctx); n != 1 {
		t.Fatalf("count = %d", n)
	}
	if got.Role != store.RoleOperator || got.TeamID != "" {
		t.Fatalf("a key added without a role has role %q (team %q), want operator", got.Role, got.TeamID)
	}

	// Roles, names, sources and masks are kept; every change moves the
	// version; a revoked key stays listed (with revoked) and never
	// comes back.
	v0, err := s.APIKeysVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u := store.APIKey{ID: "k3", Hash: "def", Name: "ci", TeamID: teamA, Role: store.RoleMember, Source: store.SourceAPI, Mask: "spore_de…ef",
		CreatedAt: k.CreatedAt.Add(time.Second)}
	if err := s.AddAPIKey(ctx, u); err != nil {
		t.Fatal(err)
	}
	v1, _ := s.APIKeysVersion(ctx)
	if v1 <= v0 {
		t.Fatalf("version after an add = %d, before %d", v1, v0)
	}
	if got, err := s.APIKeyByHash(ctx, "def"); err != nil || got != u {
		t.Fatalf("by hash = %+v %v, want %+v", got, err, u)
	}
	list, err := s.ListAPIKeys(ctx, false)
	if err != nil || len(list) != 2 || list[0].ID != "k1" || list[1].ID != "k3" {
		t.Fatalf("list = %+v %v", list, err)
	}
	at := time.Now().UTC().Truncate(time.Millisecond)
	r, err := s.RevokeAPIKey(ctx, "k3", at)
	if err != nil || !r.RevokedAt.Equal(at) || r.ID != "k3" {
		t.Fatalf("revoke = %+v %v", r, err)
	}
	v2, _ := s.APIKeysVersion(ctx)
	if v2 <= v1 {
		t.Fatalf("version after a revoke = %d, before %d", v2, v1)
	}
	if r, err := s.RevokeAPIKey(ctx, "k3", at.Add(time.Hour)); err != nil || !r.RevokedAt.Equal(at) {
		t.Fatalf("revoke again = %+v %v (keeps the first time)", r, err)
	}
	if got, err := s.APIKeyByHash(ctx, "def"); err != nil || !got.Revoked() {
		t.Fatalf("a revoked key by hash = %+v %v", got, err)
	}
	if err := s.AddAPIKey(ctx, store.APIKey{ID: "k4", Hash: "def"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a revoked key added again = %v", err)
	}
	if got, _ := s.APIKeyByHash(ctx, "def"); !got.Revoked() {
		t.Fatalf("a revoked key came back: %+v", got)
	}
	if list, _ := s.ListAPIKeys(ctx, false); len(list) != 1 || list[0].ID != "k1" {
		t.Fatalf("valid keys = %+v", list)
	}
	if list, _ := s.ListAPIKeys(ctx, true); len(list) != 2 || !list[1].Revoked() {
		t.Fatalf("all keys = %+v", list)
	}
	if n, _ := s.CountAPIKeys(ctx); n != 1 {
		t.Fatalf("count with one revoked = %d", n)
	}
	if _, err := s.RevokeAPIKey(ctx, "nope", at); !errdefs.IsNotFound(err) {
		t.Fatalf("revoke an unknown key = %v", err)
	}
}

// testDeleteIf: a conditional delete loses to any change made since the
// version it names (the reaper against a connect on another replica).
func testDeleteIf(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.CreateSandbox(ctx, sb("d1", map[string]string{"k": "v"})); err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetSandbox(ctx, "d1")
	if _, err := s.UpdateSandbox(ctx, "d1", func(x *store.Sandbox) error { x.EndAt = x.EndAt.Add(time.Hour); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandboxIf(ctx, "d1", got.Version); !errdefs.IsConflict(err) {
		t.Fatalf("delete at a stale version = %v, want a conflict", err)
	}
	now, err := s.GetSandbox(ctx, "d1")
	if err != nil {
		t.Fatalf("the row went with a stale delete: %v", err)
	}
	if err := s.DeleteSandboxIf(ctx, "d1", now.Version); err != nil {
		t.Fatalf("delete at the current version = %v", err)
	}
	if _, err := s.GetSandbox(ctx, "d1"); !errdefs.IsNotFound(err) {
		t.Fatalf("after the delete: %v", err)
	}
	if err := s.DeleteSandboxIf(ctx, "d1", now.Version); !errdefs.IsNotFound(err) {
		t.Fatalf("delete of a missing row = %v, want not found", err)
	}
	if l, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{Metadata: map[string]string{"k": "v"}}); len(l) != 0 {
		t.Fatalf("metadata of a deleted sandbox still matches: %v", l)
	}
}

// testKeysTwoHandles: a key added or revoked through one handle changes
// the version the other reads (how replicas learn of revocations), and
// concurrent changes each count.
func testKeysTwoHandles(t *testing.T, two func(*testing.T) (store.Store, store.Store)) {
	ctx := context.Background()
	a, b := two(t)
	v0, err := b.APIKeysVersion(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			h := a
			if i%2 == 1 {
				h = b
			}
			if err := h.AddAPIKey(ctx, store.APIKey{ID: fmt.Sprintf("c%d", i), Hash: fmt.Sprintf("h%d", i), CreatedAt: time.Now().UTC()}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	v1, _ := b.APIKeysVersion(ctx)
	if v1 != v0+n {
		t.Fatalf("version after %d adds on two handles = %d, want %d", n, v1, v0+n)
	}
	if _, err := a.RevokeAPIKey(ctx, "c3", time.Now()); err != nil {
		t.Fatal(err)
	}
	if v2, _ := b.APIKeysVersion(ctx); v2 != v1+1 {
		t.Fatalf("version after a revoke on the other handle = %d, want %d", v2, v1+1)
	}
	if k, err := b.APIKeyByHash(ctx, "h3"); err != nil || !k.Revoked() {
		t.Fatalf("the other handle reads %+v %v", k, err)
	}
}

// testNodeKeys: the first key bound to a node ID stays; the same key is
// fine again; another is a conflict; concurrent bindings of one ID on two
// handles leave exactly one winner.
func testNodeKeys(t *testing.T, two func(*testing.T) (store.Store, store.Store)) {
	ctx := context.Background()
	a, b := two(t)
	if err := a.BindNodeKey(ctx, "n1", "key-a"); err != nil {
		t.Fatal(err)
	}
	if err := b.BindNodeKey(ctx, "n1", "key-a"); err != nil {
		t.Fatalf("the same key again: %v", err)
	}
	if err := b.BindNodeKey(ctx, "n1", "key-b"); !errdefs.IsConflict(err) {
		t.Fatalf("another key: %v, want a conflict", err)
	}
	if err := a.BindNodeKey(ctx, "n1", "key-a"); err != nil {
		t.Fatalf("the first key after a refused other: %v", err)
	}
	for round := range 10 {
		id := fmt.Sprintf("race%d", round)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, h := range []store.Store{a, b} {
			wg.Go(func() { errs[i] = h.BindNodeKey(ctx, id, fmt.Sprintf("key-%d", i)) })
		}
		wg.Wait()
		ok := 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errdefs.IsConflict(err):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if ok != 1 {
			t.Fatalf("round %d: %d bindings won: %v", round, ok, errs)
		}
	}
}
