package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// Quotas (docs/teams.md): the store refuses a write that would take a
// team past a quota, in the write's own transaction, naming the quota;
// the refused write changes nothing.

// quotaErr checks err is a refusal of quota with kind.
func quotaErr(t *testing.T, what string, err error, quota string, kind error) {
	t.Helper()
	var qe *store.QuotaError
	if !errors.As(err, &qe) || qe.Quota != quota || !errors.Is(err, kind) {
		t.Fatalf("%s: %v, want a refusal by quota %s (%v)", what, err, quota, kind)
	}
}

func quotaBox(id, team string, cpus, mem int) store.Sandbox {
	x := sb(id, nil)
	x.TeamID, x.CPUCount, x.MemoryMB = team, cpus, mem
	return x
}

func testQuotas(t *testing.T, s store.Store) {
	ctx := context.Background()
	const tq = "tq"
	if err := s.CreateTeam(ctx, store.Team{ID: tq, Name: "quota", Quotas: store.Quotas{Sandboxes: -1}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a team with a negative quota: %v", err)
	}
	if err := s.CreateTeam(ctx, store.Team{ID: tq, Name: "quota", Quotas: store.Quotas{Sandboxes: 2}}); err != nil {
		t.Fatal(err)
	}
	if tm, err := s.GetTeam(ctx, tq); err != nil || tm.Quotas != (store.Quotas{Sandboxes: 2}) {
		t.Fatalf("quotas read back: %+v %v", tm, err)
	}
	q := store.Quotas{Sandboxes: 2, VCPUs: 5, MemoryMB: 2048, SnapshotBytes: 1000, VolumeBytes: 100}
	if tm, err := s.SetTeamQuotas(ctx, tq, q); err != nil || tm.Quotas != q {
		t.Fatalf("set quotas: %+v %v", tm, err)
	}
	if _, err := s.SetTeamQuotas(ctx, "nope", q); !errdefs.IsNotFound(err) {
		t.Fatalf("quotas of a missing team: %v", err)
	}
	if _, err := s.SetTeamQuotas(ctx, tq, store.Quotas{MemoryMB: -5}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a negative quota: %v", err)
	}
	if tm, _ := s.GetTeam(ctx, tq); tm.Quotas != q {
		t.Fatalf("a refused change changed the quotas: %+v", tm.Quotas)
	}

	// Sandboxes: the count, then vCPUs (a row naming none is charged the
	// defaults, 2), then memory.
	if err := s.CreateSandbox(ctx, quotaBox("q1", tq, 2, 512)); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, quotaBox("q2", tq, 4, 512)); err == nil {
		t.Fatal("6 vCPUs admitted under a quota of 5")
	} else {
		quotaErr(t, "vcpus", err, "vcpus", errdefs.ErrPermission)
	}
	if err := s.CreateSandbox(ctx, quotaBox("q2", tq, 0, 1600)); err == nil {
		t.Fatal("2112 MB admitted under a quota of 2048")
	} else {
		quotaErr(t, "memory", err, "memoryMB", errdefs.ErrPermission)
	}
	if _, err := s.GetSandbox(ctx, "q2"); !errdefs.IsNotFound(err) {
		t.Fatalf("a refused create left a row: %v", err)
	}
	if err := s.CreateSandbox(ctx, quotaBox("q2", tq, 0, 0)); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, quotaBox("q3", tq, 1, 128)); err == nil {
		t.Fatal("a third sandbox admitted under a quota of 2")
	} else {
		quotaErr(t, "count", err, "sandboxes", errdefs.ErrPermission)
		if msg := err.Error(); !strings.Contains(msg, "sandboxes") || !strings.Contains(msg, tq) {
			t.Fatalf("the refusal does not name the quota and team: %q", msg)
		}
	}
	u, err := s.TeamUsage(ctx, tq)
	if err != nil || u.Sandboxes != 2 || u.VCPUs != 4 || u.MemoryMB != 512+1024 {
		t.Fatalf("usage: %+v %v", u, err)
	}
	// Another team is not held by this one's quotas.
	if err := s.CreateSandbox(ctx, quotaBox("d1", store.DefaultTeam, 8, 8192)); err != nil {
		t.Fatal(err)
	}
	// A sandbox of a team that is not there is not made.
	if err := s.CreateSandbox(ctx, quotaBox("x1", "gone", 1, 128)); !errdefs.IsNotFound(err) {
		t.Fatalf("a sandbox for a missing team: %v", err)
	}

	// Growing a row is checked: more memory, and a hibernated sandbox
	// resumed (by update and by compare-and-swap) while the team is full.
	if _, err := s.UpdateSandbox(ctx, "q1", func(x *store.Sandbox) error { x.MemoryMB = 2000; return nil }); err == nil {
		t.Fatal("a row grew past the memory quota")
	} else {
		quotaErr(t, "grow", err, "memoryMB", errdefs.ErrPermission)
	}
	if _, err := s.UpdateSandbox(ctx, "q1", func(x *store.Sandbox) error { x.MemoryMB = 256; x.EndAt = x.EndAt.Add(1); return nil }); err != nil {
		t.Fatalf("shrinking is always admitted: %v", err)
	}
	hib, err := s.UpdateSandbox(ctx, "q1", func(x *store.Sandbox) error { x.State = store.StateHibernated; return nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, quotaBox("q3", tq, 1, 128)); err != nil {
		t.Fatalf("a hibernated sandbox still counted: %v", err)
	}
	if u, _ := s.TeamUsage(ctx, tq); u.Sandboxes != 2 || u.Hibernated != 1 {
		t.Fatalf("usage with one hibernated: %+v", u)
	}
	if _, err := s.UpdateSandbox(ctx, "q1", func(x *store.Sandbox) error { x.State = store.StateRunning; return nil }); err == nil {
		t.Fatal("resumed past the quota (update)")
	} else {
		quotaErr(t, "resume", err, "sandboxes", errdefs.ErrPermission)
	}
	resumed := hib
	resumed.State = store.StateRunning
	if _, err := s.CompareAndSwapSandbox(ctx, resumed); err == nil {
		t.Fatal("resumed past the quota (compare-and-swap)")
	} else {
		quotaErr(t, "resume", err, "sandboxes", errdefs.ErrPermission)
	}
	stale := resumed
	stale.Version--
	if _, err := s.CompareAndSwapSandbox(ctx, stale); !errdefs.IsConflict(err) {
		t.Fatalf("a stale swap that would pass the quota: %v, want a conflict", err)
	}
	if got, _ := s.GetSandbox(ctx, "q1"); got.State != store.StateHibernated || got.Version != hib.Version {
		t.Fatalf("refused resumes changed the row: %+v", got)
	}
	// Everyday writes of a sandbox at its quota pass (the same charge).
	if _, err := s.UpdateSandbox(ctx, "q2", func(x *store.Sandbox) error { x.State = store.StatePaused; return nil }); err != nil {
		t.Fatalf("pausing at the quota: %v", err)
	}
	q2, _ := s.GetSandbox(ctx, "q2")
	q2.State = store.StateRunning
	if _, err := s.CompareAndSwapSandbox(ctx, q2); err != nil {
		t.Fatalf("resuming from memory at the quota: %v", err)
	}
	if err := s.DeleteSandbox(ctx, "q3"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CompareAndSwapSandbox(ctx, resumed); err != nil {
		t.Fatalf("resumed once there was room: %v", err)
	}

	// A pooled sandbox (nobody's) claimed by the team is a create.
	pooled := quotaBox("p1", "", 1, 128)
	pooled.State = store.StatePooled
	if err := s.CreateSandbox(ctx, pooled); err != nil {
		t.Fatalf("a pooled row is nobody's, so counts against no quota: %v", err)
	}
	claim := pooled
	claim.Version, claim.TeamID, claim.State = 1, tq, store.StateCreating
	if _, err := s.CompareAndSwapSandbox(ctx, claim); err == nil {
		t.Fatal("a pooled sandbox claimed past the quota")
	} else {
		quotaErr(t, "claim", err, "sandboxes", errdefs.ErrPermission)
	}
	if got, _ := s.GetSandbox(ctx, "p1"); got.State != store.StatePooled || got.TeamID != "" {
		t.Fatalf("a refused claim changed the pooled row: %+v", got)
	}

	// Snapshot bytes: a user's snapshot past it is refused; a
	// hibernation is counted, never refused.
	snap := func(id, kind string, size int64) store.Snapshot {
		return store.Snapshot{ID: id, TeamID: tq, Kind: kind, SizeBytes: size}
	}
	if err := s.PutSnapshot(ctx, snap("qs1", store.SnapshotKindUser, 600)); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSnapshot(ctx, snap("qs2", store.SnapshotKindUser, 600)); err == nil {
		t.Fatal("1200 snapshot bytes under a quota of 1000")
	} else {
		quotaErr(t, "snapshot", err, "snapshotBytes", errdefs.ErrPermission)
	}
	if err := s.CreateSnapshot(ctx, snap("qs2", store.SnapshotKindUser, 600)); err == nil {
		t.Fatal("1200 snapshot bytes under a quota of 1000 (create)")
	}
	if _, err := s.GetSnapshot(ctx, "qs2"); !errdefs.IsNotFound(err) {
		t.Fatalf("a refused snapshot left a row: %v", err)
	}
	if err := s.PutSnapshot(ctx, snap("qs1", store.SnapshotKindUser, 600)); err != nil {
		t.Fatalf("rewriting a snapshot at its size: %v", err)
	}
	if err := s.PutSnapshot(ctx, snap("qh", store.SnapshotKindHibernation, 700)); err != nil {
		t.Fatalf("a hibernation refused: %v", err)
	}
	// Volume bytes: the sizes' sum, on create and on a resize.
	if err := s.CreateVolume(ctx, store.Volume{ID: "qv1", TeamID: tq, Name: "a", SizeBytes: 60}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateVolume(ctx, store.Volume{ID: "qv2", TeamID: tq, Name: "b", SizeBytes: 60}); err == nil {
		t.Fatal("120 volume bytes under a quota of 100")
	} else {
		quotaErr(t, "volume", err, "volumeBytes", errdefs.ErrPermission)
	}
	if _, err := s.UpdateVolume(ctx, tq, "qv1", func(v *store.Volume) error { v.SizeBytes = 101; return nil }); err == nil {
		t.Fatal("a volume resized past the quota")
	} else {
		quotaErr(t, "resize", err, "volumeBytes", errdefs.ErrPermission)
	}
	if _, err := s.UpdateVolume(ctx, tq, "qv1", func(v *store.Volume) error { v.SizeBytes = 100; return nil }); err != nil {
		t.Fatalf("a resize to the quota: %v", err)
	}
	u, err = s.TeamUsage(ctx, tq)
	want := store.TeamUsage{Sandboxes: 2, VCPUs: 4, MemoryMB: 256 + 1024, Snapshots: 2, SnapshotBytes: 1300, Volumes: 1, VolumeBytes: 100}
	if err != nil || u != want {
		t.Fatalf("usage: %+v %v, want %+v", u, err, want)
	}
	if _, err := s.TeamUsage(ctx, "nope"); !errdefs.IsNotFound(err) {
		t.Fatalf("usage of a missing team: %v", err)
	}
	// Lowering a quota under the use keeps what is held and admits no
	// more; no quota at all admits anything.
	if _, err := s.SetTeamQuotas(ctx, tq, store.Quotas{Sandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateSandbox(ctx, "q2", func(x *store.Sandbox) error { x.EndAt = x.EndAt.Add(1); return nil }); err != nil {
		t.Fatalf("a sandbox held over a lowered quota cannot be written: %v", err)
	}
	if err := s.CreateSandbox(ctx, quotaBox("q4", tq, 1, 128)); err == nil {
		t.Fatal("a create over a lowered quota")
	}
	if _, err := s.SetTeamQuotas(ctx, tq, store.Quotas{}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, quotaBox("q4", tq, 16, 65536)); err != nil {
		t.Fatalf("no quota: %v", err)
	}
}

// testCreateRate: CreatesPerMinute counts creates (new rows and pooled
// claims), not deletes; over it is a 429 kind naming it.
func testCreateRate(t *testing.T, s store.Store) {
	ctx := context.Background()
	if err := s.CreateTeam(ctx, store.Team{ID: "tr", Name: "rate", Quotas: store.Quotas{CreatesPerMinute: 3}}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := s.CreateSandbox(ctx, quotaBox(fmt.Sprintf("r%d", i), "tr", 1, 128)); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteSandbox(ctx, fmt.Sprintf("r%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	err := s.CreateSandbox(ctx, quotaBox("r3", "tr", 1, 128))
	quotaErr(t, "the fourth create in a minute", err, "createsPerMinute", errdefs.ErrResourceLimit)
	if u, err := s.TeamUsage(ctx, "tr"); err != nil || u.CreatesLastMinute < 3 || u.Sandboxes != 0 {
		t.Fatalf("usage: %+v %v", u, err)
	}
}

// testQuotaAcrossHandles: creates of one team through two handles (two
// replicas) at once never pass its quota together.
func testQuotaAcrossHandles(t *testing.T, a, b store.Store) {
	ctx := context.Background()
	if err := a.CreateTeam(ctx, store.Team{ID: "tx", Name: "race", Quotas: store.Quotas{Sandboxes: 3}}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	made, refused := 0, 0
	for i := range 12 {
		wg.Go(func() {
			h := a
			if i%2 == 1 {
				h = b
			}
			err := h.CreateSandbox(ctx, quotaBox(fmt.Sprintf("x%d", i), "tx", 1, 128))
			mu.Lock()
			defer mu.Unlock()
			var qe *store.QuotaError
			switch {
			case err == nil:
				made++
			case errors.As(err, &qe):
				refused++
			default:
				t.Errorf("create %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if made != 3 || refused != 9 {
		t.Fatalf("%d made and %d refused under a quota of 3, want 3 and 9", made, refused)
	}
	if u, _ := b.TeamUsage(ctx, "tx"); u.Sandboxes != 3 {
		t.Fatalf("usage: %+v", u)
	}
}
