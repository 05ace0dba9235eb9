package engine_test

import (
	"path/filepath"
	"testing"

	blobstore "github.com/spore-run/spore/internal/blob"
	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/snapsync"
)

// A sandbox hibernated on one node is adopted by another that fetched its
// image: hibernated there under the same ID and token, its memory back
// once resumed, the image consumed. Adopt replayed returns it; a snapshot
// that is not its hibernation, or an ID taken by another sandbox, is
// refused and records nothing.
func TestAdoptHibernatedFromAnotherNode(t *testing.T) {
	a, b := newFake(t), newFake(t)
	ctx := fctx(t)
	blobs, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	sa, sb := newSyncer(t, a, blobs), newSyncer(t, b, blobs)
	src, err := a.eng.Create(ctx, engine.CreateOptions{ID: "imoving", Template: "tpl", AccessToken: "tok-moving"})
	if err != nil {
		t.Fatal(err)
	}
	a.set(src.ID, "k", "before-the-move")
	if err := a.eng.Hibernate(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	hib, err := a.eng.Get(ctx, src.ID)
	if err != nil || hib.Hibernation == "" {
		t.Fatalf("hibernated: %+v %v", hib, err)
	}
	if _, err := sa.Upload(ctx, hib.Hibernation); err != nil {
		t.Fatal(err)
	}
	// Refused before the image is here, and for a snapshot that is not a
	// hibernation of that sandbox.
	if _, err := b.eng.Adopt(ctx, src.ID, hib.Hibernation, netns.Policy{Internet: true}); !errdefs.IsNotFound(err) {
		t.Fatalf("adopt without the image: %v", err)
	}
	if _, err := sb.Ensure(ctx, hib.Hibernation, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.eng.Adopt(ctx, "iother", hib.Hibernation, netns.Policy{}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("adopt under another ID: %v", err)
	}
	taken := b.create()
	if _, err := b.eng.Adopt(ctx, taken.ID, hib.Hibernation, netns.Policy{}); !errdefs.IsInvalidArgument(err) && !errdefs.IsAlreadyExists(err) {
		t.Fatalf("adopt over a taken ID: %v", err)
	}
	got, err := b.eng.Adopt(ctx, src.ID, hib.Hibernation, netns.Policy{Internet: true})
	if err != nil {
		t.Fatal(err)
	}
	if got.State != engine.StateHibernated || got.Run.AccessToken != "tok-moving" || got.Hibernation != hib.Hibernation {
		t.Fatalf("adopted: %+v", got)
	}
	if again, err := b.eng.Adopt(ctx, src.ID, hib.Hibernation, netns.Policy{Internet: true}); err != nil || again.State != engine.StateHibernated {
		t.Fatalf("replayed adopt: %+v %v", again, err)
	}
	if err := b.eng.Resume(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	if v := b.get(src.ID, "k"); v != "before-the-move" {
		t.Fatalf("memory after the move: %q", v)
	}
	if _, err := b.eng.Snapshots().Get(hib.Hibernation); !errdefs.IsNotFound(err) {
		t.Fatalf("the image after the wake: %v", err)
	}
	if again, err := b.eng.Adopt(ctx, src.ID, hib.Hibernation, netns.Policy{Internet: true}); err != nil || again.State != engine.StateRunning {
		t.Fatalf("adopt replayed after the wake: %+v %v", again, err)
	}
}

// newSyncer is f's engine's snapshot syncer over the blob store blobs.
func newSyncer(t *testing.T, f *fenv, blobs blobstore.Store) *snapsync.Syncer {
	t.Helper()
	cache, err := chunk.OpenCache(filepath.Join(f.dir, "cache"), 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	s, err := snapsync.New(snapsync.Config{Repo: f.eng.Snapshots(), Store: blobs, Cache: cache, Runtime: f.eng.Runtime().Name(), Log: logger()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
