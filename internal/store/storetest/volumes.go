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

// Volumes (docs/volumes.md): the row is a volume's identity, settings and
// exclusive holder; its content lives elsewhere.

// errHeld is what the suite's delete checks refuse with.
var errHeld = errors.New("volume held")

// refuseHeld is the check a caller gives DeleteVolume: a held volume
// stays (wrapped, as a caller would, to show errors.Is still finds it).
func refuseHeld(v store.Volume) error {
	if v.Holder != "" {
		return fmt.Errorf("volume %s mounted by %s: %w", v.Name, v.Holder, errHeld)
	}
	return nil
}

func testVolumes(t *testing.T, s store.Store) {
	ctx := context.Background()
	before := time.Now().UTC().Add(-time.Second)
	mk := func(id, name string) store.Volume {
		return store.Volume{ID: id, TeamID: teamA, Name: name, Mode: store.VolumeExclusive, SizeBytes: 1 << 30, Token: "tok-" + id}
	}
	if err := s.CreateVolume(ctx, mk("vaaaa", "data")); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateVolume(ctx, mk("vaaaa", "other")); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("duplicate ID = %v, want already exists", err)
	}
	if err := s.CreateVolume(ctx, mk("vbbbb", "data")); !errdefs.IsAlreadyExists(err) {
		t.Fatalf("duplicate name = %v, want already exists", err)
	}
	for _, ref := range []string{"vaaaa", "data"} {
		got, err := s.GetVolume(ctx, teamA, ref)
		if err != nil {
			t.Fatalf("get %s: %v", ref, err)
		}
		if got.ID != "vaaaa" || got.Name != "data" || got.Mode != store.VolumeExclusive || got.SizeBytes != 1<<30 ||
			got.Token != "tok-vaaaa" || got.Holder != "" || got.CreatedAt.Before(before) || !got.UpdatedAt.Equal(got.CreatedAt) {
			t.Fatalf("get %s = %+v", ref, got)
		}
	}
	for _, ref := range []string{"nope", "vbbbb", "other"} { // the refused creates left no row
		if _, err := s.GetVolume(ctx, teamA, ref); !errdefs.IsNotFound(err) {
			t.Fatalf("get %s: %v, want not found", ref, err)
		}
	}
	testVolumeUpdate(t, s)
	testVolumeList(t, s)
	testVolumeDelete(t, s)
}

// testVolumeUpdate: fn's changes are written but ID, Name and CreatedAt;
// fn's error writes nothing; concurrent updates are none lost.
func testVolumeUpdate(t *testing.T, s store.Store) {
	ctx := context.Background()
	created, _ := s.GetVolume(ctx, teamA, "vaaaa")
	time.Sleep(5 * time.Millisecond)
	up, err := s.UpdateVolume(ctx, teamA, "data", func(v *store.Volume) error {
		v.Holder = "isb1"
		v.ID, v.Name, v.CreatedAt = "vzzzz", "renamed", time.Time{} // kept whatever fn does
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if up.ID != "vaaaa" || up.Name != "data" || up.Holder != "isb1" || up.Mode != store.VolumeExclusive || up.SizeBytes != 1<<30 || up.Token != "tok-vaaaa" ||
		!up.CreatedAt.Equal(created.CreatedAt) || !up.UpdatedAt.After(created.UpdatedAt) {
		t.Fatalf("update = %+v (created %+v)", up, created)
	}
	if got, err := s.GetVolume(ctx, teamA, "vaaaa"); err != nil || got.Holder != "isb1" || !got.UpdatedAt.Equal(up.UpdatedAt) {
		t.Fatalf("after update: %+v %v", got, err)
	}
	for _, ref := range []string{"vzzzz", "renamed"} {
		if _, err := s.GetVolume(ctx, teamA, ref); !errdefs.IsNotFound(err) {
			t.Fatalf("a row under the %s fn set: %v", ref, err)
		}
	}

	boom := errors.New("boom")
	if _, err := s.UpdateVolume(ctx, teamA, "vaaaa", func(v *store.Volume) error {
		v.Holder, v.SizeBytes = "", 7
		return fmt.Errorf("refused: %w", boom)
	}); !errors.Is(err, boom) {
		t.Fatalf("update whose fn fails = %v", err)
	}
	if got, _ := s.GetVolume(ctx, teamA, "vaaaa"); got.Holder != "isb1" || got.SizeBytes != 1<<30 || !got.UpdatedAt.Equal(up.UpdatedAt) {
		t.Fatalf("an aborted update wrote: %+v", got)
	}
	if _, err := s.UpdateVolume(ctx, teamA, "nope", func(*store.Volume) error { return nil }); !errdefs.IsNotFound(err) {
		t.Fatalf("update of an unknown volume: %v", err)
	}

	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		ref := []string{"vaaaa", "data"}[i%2] // by ID and by name: one row
		wg.Go(func() {
			if _, err := s.UpdateVolume(ctx, teamA, ref, func(v *store.Volume) error {
				time.Sleep(time.Millisecond) // a slow fn: the others must wait for its write, not read around it
				v.SizeBytes++
				return nil
			}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got, _ := s.GetVolume(ctx, teamA, "vaaaa"); got.SizeBytes != 1<<30+n {
		t.Fatalf("size %d after %d concurrent increments of %d: updates lost", got.SizeBytes, n, int64(1<<30))
	}
}

// testVolumeList: pages oldest first, every volume once.
func testVolumeList(t *testing.T, s store.Store) {
	ctx := context.Background()
	for i := range 2 {
		v := store.Volume{ID: fmt.Sprintf("vp%d", i), TeamID: teamA, Name: fmt.Sprintf("p%d", i), Mode: store.VolumeShared, SizeBytes: 1 << 20}
		if err := s.CreateVolume(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	first, next, err := s.ListVolumes(ctx, teamA, 2, "")
	if err != nil || len(first) != 2 || first[0].Name != "data" || first[1].Name != "p0" || next == "" {
		t.Fatalf("first page = %+v %q %v", first, next, err)
	}
	rest, last, err := s.ListVolumes(ctx, teamA, 2, next)
	if err != nil || len(rest) != 1 || rest[0].Name != "p1" || rest[0].Mode != store.VolumeShared || last != "" {
		t.Fatalf("second page = %+v %q %v", rest, last, err)
	}
	if all, next, err := s.ListVolumes(ctx, teamA, 0, ""); err != nil || len(all) != 3 || next != "" {
		t.Fatalf("unlimited list: %d %q %v", len(all), next, err)
	}
	if _, _, err := s.ListVolumes(ctx, teamA, 2, "garbage!"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("malformed cursor: %v", err)
	}
}

// testVolumeDelete: a refusing check keeps the row and its error comes
// back; a passing or nil check deletes; a missing volume is not found
// (and its check never called).
func testVolumeDelete(t *testing.T, s store.Store) {
	ctx := context.Background()
	var seen store.Volume
	err := s.DeleteVolume(ctx, teamA, "data", func(v store.Volume) error { seen = v; return refuseHeld(v) })
	if !errors.Is(err, errHeld) {
		t.Fatalf("delete of a held volume = %v, want the check's error", err)
	}
	if seen.ID != "vaaaa" || seen.Holder != "isb1" {
		t.Fatalf("the check saw %+v, want the stored row", seen)
	}
	if got, err := s.GetVolume(ctx, teamA, "vaaaa"); err != nil || got.Holder != "isb1" {
		t.Fatalf("a refused delete removed the row: %+v %v", got, err)
	}
	if _, err := s.UpdateVolume(ctx, teamA, "vaaaa", func(v *store.Volume) error { v.Holder = ""; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteVolume(ctx, teamA, "data", refuseHeld); err != nil {
		t.Fatalf("delete of a released volume = %v", err)
	}
	if err := s.DeleteVolume(ctx, teamA, "vp0", nil); err != nil {
		t.Fatalf("delete without a check = %v", err)
	}
	called := false
	for _, ref := range []string{"vaaaa", "data", "vp0", "p0", "nope"} {
		if _, err := s.GetVolume(ctx, teamA, ref); !errdefs.IsNotFound(err) {
			t.Fatalf("after delete, get %s: %v", ref, err)
		}
		if err := s.DeleteVolume(ctx, teamA, ref, nil); !errdefs.IsNotFound(err) {
			t.Fatalf("delete of missing %s = %v", ref, err)
		}
		if err := s.DeleteVolume(ctx, teamA, ref, func(store.Volume) error { called = true; return nil }); !errdefs.IsNotFound(err) {
			t.Fatalf("delete of missing %s with a check = %v", ref, err)
		}
	}
	if called {
		t.Fatal("a check was called for a missing volume")
	}
	if l, _, _ := s.ListVolumes(ctx, teamA, 0, ""); len(l) != 1 || l[0].Name != "p1" {
		t.Fatalf("left after the deletes: %+v", l)
	}
	// A deleted name can be taken again, under a new ID.
	if err := s.CreateVolume(ctx, store.Volume{ID: "vcccc", TeamID: teamA, Name: "data", Mode: store.VolumeShared}); err != nil {
		t.Fatal(err)
	}
}

// Two handles, one taking an exclusive volume while the other deletes it
// unless held: the check sees the row as it is when the delete commits, so
// either the hold lands first (the delete refuses, the row stays held) or
// the delete does (the hold finds no row). Never both succeed.
func testVolumeDeleteVersusHold(t *testing.T, two func(*testing.T) (store.Store, store.Store)) {
	a, b := two(t)
	ctx := context.Background()
	for round := range 20 {
		id, name := fmt.Sprintf("vr%d", round), fmt.Sprintf("r%d", round)
		if err := a.CreateVolume(ctx, store.Volume{ID: id, TeamID: teamA, Name: name, Mode: store.VolumeExclusive}); err != nil {
			t.Fatal(err)
		}
		var holdErr, delErr error
		var wg sync.WaitGroup
		wg.Go(func() {
			_, holdErr = a.UpdateVolume(ctx, teamA, id, func(v *store.Volume) error { v.Holder = "isb"; return nil })
		})
		wg.Go(func() { delErr = b.DeleteVolume(ctx, teamA, name, refuseHeld) })
		wg.Wait()
		got, getErr := a.GetVolume(ctx, teamA, id)
		switch {
		case holdErr == nil && errors.Is(delErr, errHeld):
			if getErr != nil || got.Holder != "isb" {
				t.Fatalf("round %d: held and refused, but the row is %+v %v", round, got, getErr)
			}
		case errdefs.IsNotFound(holdErr) && delErr == nil:
			if !errdefs.IsNotFound(getErr) {
				t.Fatalf("round %d: deleted, but the row is %+v %v", round, got, getErr)
			}
		default:
			t.Fatalf("round %d: hold = %v, delete = %v (row %+v %v)", round, holdErr, delErr, got, getErr)
		}
	}
}
