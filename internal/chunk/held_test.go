package chunk

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/errdefs"
)

// ensureHeld returns an EnsureRefs that packs the held manifest id from
// dir when the store lacks it, counting the packs in *made.
func ensureHeld(store blob.Store, id, dir string, made *int) func(context.Context) error {
	return func(ctx context.Context) error {
		if _, err := ReadManifest(ctx, store, id); err == nil {
			return nil
		} else if !errdefs.IsNotFound(err) {
			return err
		}
		*made++
		_, _, err := Pack(ctx, dir, store, PackOptions{ID: id, Held: true})
		return err
	}
}

func exists(t *testing.T, store blob.Store, id string) bool {
	t.Helper()
	_, err := ReadManifest(context.Background(), store, id)
	if err != nil && !errdefs.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

// A held manifest (a snapshot's root filesystem or runtime build) stays
// while a manifest refers to it, or while it is young; once nothing refers
// to it, GC deletes it and frees its chunks in the same run. Manifests
// that are not held are never deleted by GC.
func TestGCDeletesHeldManifestsOnlyWhenUnreferenced(t *testing.T) {
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed(t), 21))
	p := pool(r, 4)
	store := newStore(t)
	made := 0
	build := tree(t, p, []int{0, 1})
	if _, _, err := Pack(ctx, build, store, PackOptions{ID: "tree-old", Held: true}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Pack(ctx, tree(t, p, []int{2}), store, PackOptions{ID: "snap",
		Refs: []string{"tree-old"}, EnsureRefs: ensureHeld(store, "tree-old", build, &made)}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Pack(ctx, tree(t, p, []int{3}), store, PackOptions{ID: "tree-young", Held: true}); err != nil {
		t.Fatal(err)
	}
	if made != 0 {
		t.Fatalf("EnsureRefs re-made a manifest that was there (%d)", made)
	}
	ageAll(t, store, "chunks/", 2*time.Hour)
	for _, k := range []string{ManifestKey("tree-old"), ManifestKey("snap")} {
		age(t, store, k, 2*time.Hour)
	}

	rep, err := GC(ctx, store, GCOptions{Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.HeldDeleted) != 0 || rep.HeldKept != 2 || rep.Deleted != 0 {
		t.Fatalf("referenced or young held manifests touched: %+v", rep)
	}
	if err := DeleteManifest(ctx, store, "snap"); err != nil {
		t.Fatal(err)
	}
	rep, err = GC(ctx, store, GCOptions{Grace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.HeldDeleted, []string{"tree-old"}) || exists(t, store, "tree-old") {
		t.Fatalf("unreferenced old held manifest kept: %+v", rep)
	}
	if !exists(t, store, "tree-young") {
		t.Fatal("a held manifest younger than the grace period was deleted")
	}
	// Chunks 0, 1 (tree-old's) and 2 (snap's) went in that run; 3 is
	// tree-young's, kept with it.
	for i, want := range []bool{false, false, false, true} {
		_, err := store.Stat(ctx, Sum(p[i]).Key())
		if got := err == nil; got != want {
			t.Errorf("chunk %d present %v, want %v (%v)", i, got, want, err)
		}
	}
	assertIntact(t, store)
}

// The race of a held manifest: a GC run has found "tree" unreferenced and
// old, then a Pack of a snapshot that refers to it begins, finds it
// present, and the run deletes it. The Pack noted the run: it waits for
// it and makes "tree" present again before it commits. Without that step
// the committed snapshot refers to a manifest that is gone.
func TestGCHeldRaceIsClosed(t *testing.T) {
	for _, tc := range []struct {
		name       string
		skipSettle bool
	}{{"protocol", false}, {"without re-check", true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			r := rand.New(rand.NewPCG(seed(t), 22))
			p := pool(r, 3)
			store := newStore(t)
			build := tree(t, p, []int{0, 1})
			if _, _, err := Pack(ctx, build, store, PackOptions{ID: "tree", Held: true}); err != nil {
				t.Fatal(err)
			}
			ageAll(t, store, "chunks/", 2*time.Hour)
			age(t, store, ManifestKey("tree"), 2*time.Hour)

			listed, release := make(chan struct{}), make(chan struct{})
			gcDone := make(chan error, 1)
			go func() {
				_, err := GC(ctx, store, GCOptions{Grace: time.Hour, Budget: time.Minute, beforeSweep: func() {
					close(listed)
					<-release
				}})
				gcDone <- err
			}()
			<-listed // the run holds "tree" as unreferenced
			made := 0
			var gcErr error
			_, st, err := Pack(ctx, tree(t, p, []int{2}), store, PackOptions{ID: "snap", Poll: 5 * time.Millisecond,
				Refs: []string{"tree"}, EnsureRefs: ensureHeld(store, "tree", build, &made), skipSettle: tc.skipSettle,
				afterUpload: func() { // "tree" was found present; now let the run delete it
					close(release)
					gcErr = <-gcDone
				}})
			if err != nil {
				t.Fatal(err)
			}
			if gcErr != nil {
				t.Fatal(gcErr)
			}
			if tc.skipSettle {
				if exists(t, store, "tree") {
					t.Fatal("without the re-check the race should lose the held manifest (the scenario did not happen)")
				}
				return
			}
			if !exists(t, store, "tree") || made != 1 || !st.WaitedForGC {
				t.Fatalf("snapshot committed referring to a deleted manifest: present %v, re-made %d, stats %+v",
					exists(t, store, "tree"), made, st)
			}
			assertIntact(t, store)
			// And it is kept from then on: the snapshot refers to it.
			ageAll(t, store, "", 2*time.Hour)
			rep, err := GC(ctx, store, GCOptions{Grace: time.Hour})
			if err != nil || len(rep.HeldDeleted) != 0 || rep.Deleted != 0 {
				t.Fatalf("GC after: %+v, %v", rep, err)
			}
		})
	}
}

func TestPackRefusesBadRefs(t *testing.T) {
	ctx := context.Background()
	store := newStore(t)
	dir := t.TempDir()
	noop := func(context.Context) error { return nil }
	for _, opts := range []PackOptions{
		{ID: "s", Refs: []string{"s"}, EnsureRefs: noop},
		{ID: "s", Refs: []string{"a", "a"}, EnsureRefs: noop},
		{ID: "s", Refs: []string{"../x"}, EnsureRefs: noop},
		{ID: "s", Refs: []string{"a"}},
	} {
		if _, _, err := Pack(ctx, dir, store, opts); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Pack(%+v) = %v, want invalid argument", opts, err)
		}
	}
	if len(keys(t, store, "")) != 0 {
		t.Fatal("a refused Pack wrote to the store")
	}
}
