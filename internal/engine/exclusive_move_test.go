package engine_test

import (
	"slices"
	"testing"

	"github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/netns"
	"github.com/spore-run/spore/internal/snapshot"
)

// A hibernation captures the sandbox's exclusive volumes with it, as a
// snapshot does, so the sandbox can move whole: resumed on its own node
// it runs on its volume's image as it was and the copy goes; taken over
// by another node (Adopt) it gets the volume made there, under the
// volume's own ID, from the hibernation's copy (the content at the
// instant of the hibernation), and the copy goes once it runs. A
// hibernated sandbox killed takes its copies with it. Before, the
// hibernation held no volume content, and a sandbox with volumes could
// only resume on its node.
func TestExclusiveVolumeMovesWithItsHibernation(t *testing.T) {
	a, fa, sb := newVolumeFake(t)
	ctx := fctx(t)
	fa.set("vol1", "at-hibernation")
	hibCopy := func(f *fenv, id string) (snapshot.Manifest, string) {
		t.Helper()
		got, err := f.eng.Get(ctx, id)
		if err != nil || got.Hibernation == "" {
			t.Fatalf("hibernated: %+v %v", got, err)
		}
		m, err := f.eng.Snapshots().Get(got.Hibernation)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Run.Volumes) != 1 || m.Run.Volumes[0].Copy == "" {
			t.Fatalf("the hibernation holds no copy of the volume: %+v", m.Run.Volumes)
		}
		return m, m.Run.Volumes[0].Copy
	}

	// On its own node.
	if err := a.eng.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, c := hibCopy(a, sb.ID)
	if got, _ := fa.get(c); got != "at-hibernation" {
		t.Fatalf("the hibernation's copy holds %q", got)
	}
	fa.set("vol1", "still-here") // its node keeps the image: the wake runs on it, not on the copy
	wakeOnVol1(t, a, fa, sb.ID)
	if v, _ := fa.get("vol1"); v != "still-here" {
		t.Fatalf("the volume after the wake on its node: %q", v)
	}
	if left := fa.names("c-"); len(left) != 0 {
		t.Fatalf("copies left after the wake: %v", left)
	}

	// Killed while hibernated: the copy goes with the hibernation.
	if err := a.eng.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := a.eng.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	a.eng.Settle()
	if left := fa.names("c-"); len(left) != 0 {
		t.Fatalf("copies left after a hibernated sandbox was killed: %v", left)
	}
	if v, ok := fa.get("vol1"); !ok || v != "still-here" {
		t.Fatalf("the volume after its holder was killed: %q %v", v, ok)
	}

	// To another node, through the blob store.
	moving, err := a.eng.Create(ctx, engine.CreateOptions{ID: "imovingvol", Template: "vtpl", Volumes: []engine.Volume{{Source: fa.mountOf("vol1"),
		VolumeMount: snapshot.VolumeMount{Volume: "vol1", Slot: slot0, Path: "/work", Exclusive: true}}}})
	if err != nil {
		t.Fatal(err)
	}
	a.set(moving.ID, "k", "in-memory")
	fa.set("vol1", "moved-content")
	if err := a.eng.Hibernate(ctx, moving.ID); err != nil {
		t.Fatal(err)
	}
	m, c := hibCopy(a, moving.ID)
	fb := newFakeImages(t.TempDir())
	b := newFakeWith(t, &fenv{vols: fb})
	blobs, err := local.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newSyncer(t, a, blobs).Upload(ctx, m.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := newSyncer(t, b, blobs).Ensure(ctx, m.ID, nil); err != nil {
		t.Fatal(err)
	}
	v, _ := fa.get(c)
	fb.set(c, v)            // what the node's volume dependency fetch brings (internal/node)
	fb.set("vol1", "stale") // an old image of the volume on this node: the hibernation's copy wins
	adopted, err := b.eng.Adopt(ctx, moving.ID, m.ID, netns.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	if vm := adopted.Run.Volumes; len(vm) != 1 || vm[0].Copy != "" || vm[0].Image != "" || vm[0].Volume != "vol1" {
		t.Fatalf("adopted with volumes %+v: want vol1 under its own ID, no copy", vm)
	}
	wakeOnVol1(t, b, fb, moving.ID)
	if v, _ := fb.get("vol1"); v != "moved-content" {
		t.Fatalf("the volume on the new node holds %q, want the content at the hibernation", v)
	}
	if got := b.get(moving.ID, "k"); got != "in-memory" {
		t.Fatalf("memory after the move: %q", got)
	}
	if left := fb.names("c-"); len(left) != 0 {
		t.Fatalf("copies left on the new node after the wake: %v", left)
	}
	imgs, _ := fb.Images(ctx)
	if !slices.Equal(imgs, []string{"vol1"}) {
		t.Fatalf("images on the new node: %v, want the volume's only", imgs)
	}
}

// wakeOnVol1 resumes hibernated sandbox id on f and checks that it runs
// with its volume slot on the image of vol1 in fi (the volume's own).
func wakeOnVol1(t *testing.T, f *fenv, fi *fakeImages, id string) {
	t.Helper()
	if err := f.eng.Resume(fctx(t), id); err != nil {
		t.Fatal(err)
	}
	f.eng.Settle()
	if src := slotSource(t, got(t, f, id)); src != fi.mountOf("vol1") {
		t.Fatalf("woken with the slot on %s, want the volume's image %s", src, fi.mountOf("vol1"))
	}
}
