package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// CheckMigratedToTeams checks a store opened on a database its backend's
// test made at schema version 7 (before teams), as that release wrote it,
// holding:
//
//   - sandbox "sb_run" (running, template "base", node "n1", metadata
//     user=alice) and sandbox "sb_pool" (pooled);
//   - snapshot "sn1" of sb_run, named "golden";
//   - secret "sec_1" named "openai" (version 3);
//   - volume "vol1" named "data";
//   - API keys "k_admin" (hash "h_admin", role admin), "k_user" (hash
//     "h_user", role user) and "k_gone" (hash "h_gone", role user, revoked);
//     the keys' version at keysVersion;
//   - template "py" (snapshot "sn0").
//
// Every row is kept and belongs to the default team but the pooled
// sandbox (nobody's until claimed); names resolve in the default team;
// administrators became operators and users the default team's members;
// the keys' version moved (replicas reload their keys); and another team
// can take the same names.
func CheckMigratedToTeams(t *testing.T, s store.Store, keysVersion int64) {
	t.Helper()
	ctx := context.Background()
	if l, err := s.ListTeams(ctx); err != nil || len(l) != 1 || l[0].ID != store.DefaultTeam || l[0].Name != store.DefaultTeam {
		t.Fatalf("teams after the migration = %+v %v, want the default team", l, err)
	}
	def := store.DefaultTeam
	if got, err := s.GetSandbox(ctx, "sb_run"); err != nil || got.TeamID != def || got.State != store.StateRunning || got.NodeID != "n1" || got.Metadata["user"] != "alice" {
		t.Fatalf("sandbox sb_run = %+v %v, want the default team's", got, err)
	}
	if got, err := s.GetSandbox(ctx, "sb_pool"); err != nil || got.TeamID != "" || got.State != store.StatePooled {
		t.Fatalf("pooled sandbox = %+v %v, want nobody's", got, err)
	}
	if l, _, err := s.ListSandboxes(ctx, store.SandboxFilter{TeamID: def, Metadata: map[string]string{"user": "alice"}}); err != nil || ids(l) != "sb_run " {
		t.Fatalf("the default team's sandboxes of alice = %s %v", ids(l), err)
	}
	if l, _, err := s.ListSandboxes(ctx, store.SandboxFilter{}); err != nil || ids(l) != "sb_run sb_pool " {
		t.Fatalf("every sandbox = %s %v", ids(l), err)
	}
	for _, ref := range []string{"sn1", "golden"} {
		r, err := s.ResolveRef(ctx, def, ref)
		if err != nil || r.Snapshot == nil || r.Snapshot.ID != "sn1" || r.Snapshot.TeamID != def || r.Snapshot.SandboxID != "sb_run" {
			t.Fatalf("resolve %s in the default team = %+v %v", ref, r, err)
		}
	}
	if l, _, err := s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: def, Name: "golden"}); err != nil || len(l) != 1 || l[0].ID != "sn1" {
		t.Fatalf("the default team's snapshot golden = %+v %v", l, err)
	}
	if r, err := s.ResolveRef(ctx, def, "py"); err != nil || r.Template == nil || r.Template.SnapshotID != "sn0" {
		t.Fatalf("resolve the template = %+v %v", r, err)
	}
	for _, ref := range []string{"sec_1", "openai"} {
		if got, err := s.GetSecret(ctx, def, ref); err != nil || got.ID != "sec_1" || got.TeamID != def || got.Version != 3 {
			t.Fatalf("secret %s in the default team = %+v %v", ref, got, err)
		}
	}
	for _, ref := range []string{"vol1", "data"} {
		if got, err := s.GetVolume(ctx, def, ref); err != nil || got.ID != "vol1" || got.TeamID != def || got.Mode != store.VolumeShared {
			t.Fatalf("volume %s in the default team = %+v %v", ref, got, err)
		}
	}
	checkMigratedKeys(t, s, keysVersion)
	// The sandbox rows carry their sizes for the quotas (migration 9):
	// sb_run asked 2 vCPUs and 512 MB; the pooled one is nobody's.
	if u, err := s.TeamUsage(ctx, def); err != nil || u.Sandboxes != 1 || u.VCPUs != 2 || u.MemoryMB != 512 || u.Snapshots != 1 || u.Volumes != 1 {
		t.Fatalf("the default team's usage after the migration = %+v %v", u, err)
	}
	if tm, err := s.GetTeam(ctx, def); err != nil || !tm.Quotas.Zero() {
		t.Fatalf("the default team's quotas after the migration = %+v %v, want none", tm, err)
	}

	// Names are unique per team now: another team takes them, the
	// default team still cannot twice.
	if err := s.CreateTeam(ctx, store.Team{ID: "t2", Name: "two"}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSecret(ctx, store.Secret{ID: "sec_2", TeamID: "t2", Name: "openai"}); err != nil {
		t.Fatalf("another team's secret openai: %v", err)
	}
	if err := s.CreateVolume(ctx, store.Volume{ID: "vol2", TeamID: "t2", Name: "data"}); err != nil {
		t.Fatalf("another team's volume data: %v", err)
	}
	if err := s.PutSnapshot(ctx, store.Snapshot{ID: "sn2", TeamID: "t2", Names: []string{"golden"}}); err != nil {
		t.Fatalf("another team's snapshot golden: %v", err)
	}
	if err := s.CreateSecret(ctx, store.Secret{ID: "sec_3", TeamID: def, Name: "openai"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second secret openai in the default team = %v", err)
	}
	if err := s.CreateVolume(ctx, store.Volume{ID: "vol3", TeamID: def, Name: "data"}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second volume data in the default team = %v", err)
	}
	if err := s.PutSnapshot(ctx, store.Snapshot{ID: "sn3", TeamID: def, Names: []string{"golden"}}); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("a second snapshot golden in the default team = %v", err)
	}
	if r, err := s.ResolveRef(ctx, "t2", "golden"); err != nil || r.Snapshot == nil || r.Snapshot.ID != "sn2" {
		t.Fatalf("resolve golden in the second team = %+v %v", r, err)
	}
	// The old rows keep their place in the lists, ahead of the new.
	if l, _, err := s.ListSecrets(ctx, "", 0, ""); err != nil || len(l) != 2 || l[0].ID != "sec_1" || l[1].ID != "sec_2" {
		t.Fatalf("secrets = %+v %v", l, err)
	}
	if l, _, err := s.ListVolumes(ctx, "", 0, ""); err != nil || len(l) != 2 || l[0].ID != "vol1" || l[1].ID != "vol2" {
		t.Fatalf("volumes = %+v %v", l, err)
	}
}

// checkMigratedKeys: administrators are operators (no team), users the
// default team's members; a revoked key stays revoked; the version moved.
func checkMigratedKeys(t *testing.T, s store.Store, before int64) {
	t.Helper()
	ctx := context.Background()
	for hash, want := range map[string]struct {
		role, team string
		revoked    bool
	}{
		"h_admin": {store.RoleOperator, "", false},
		"h_user":  {store.RoleMember, store.DefaultTeam, false},
		"h_gone":  {store.RoleMember, store.DefaultTeam, true},
	} {
		k, err := s.APIKeyByHash(ctx, hash)
		if err != nil || k.Role != want.role || k.TeamID != want.team || k.Revoked() != want.revoked || k.Scope != nil ||
			!k.ExpiresAt.IsZero() || !k.LastUsedAt.IsZero() || k.CreatedAt.Before(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)) {
			t.Fatalf("key %s after the migration = %+v %v, want %+v", hash, k, err, want)
		}
	}
	if v, err := s.APIKeysVersion(ctx); err != nil || v <= before {
		t.Fatalf("keys' version after the migration = %d %v, before %d", v, err, before)
	}
}
