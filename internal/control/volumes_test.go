package control_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/runtime/fake"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/volume"
)

// Volumes on a two-node fleet: a volume's content lives on the first node
// that mounts it, and everything that shows it goes there (creates, fork
// children, creates from a snapshot of a sandbox with it); the rows record
// the mounts and the users; a volume a live sandbox was given is not
// deleted, and once they are gone the delete tells its node to drop the
// content. In process and over the node protocol (controltest.Each).
func TestVolumesPlacedWhereTheirContentIs(t *testing.T) { controltest.Each(t, testVolumesPlaced) }

func testVolumesPlaced(t *testing.T, _ controltest.Config) {
	f := newFleet(t)
	ctx := ctxFor(t)
	cat := volume.NewCatalog(f.st)
	data, err := cat.Create(ctx, volume.CreateOptions{Name: "data", Size: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	other, err := cat.Create(ctx, volume.CreateOptions{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*controltest.Node{"na": f.a, "nb": f.b}

	// On nb by the operator's hint: the volume's content is now there.
	first, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour, NodeID: "nb", Volumes: []control.VolumeRequest{{Name: "data", Path: "/data"}}})
	if err != nil {
		t.Fatal(err)
	}
	if size, ok := f.b.Volumes.Made(data.ID); !ok || size != 64<<20 {
		t.Fatalf("nb made the volume: %v (size %d)", ok, size)
	}
	got, _ := f.st.GetVolume(ctx, store.DefaultTeam, "data")
	if got.NodeID != "nb" || !slices.Contains(got.Users, first.ID) {
		t.Fatalf("volume row %+v", got)
	}
	if len(first.VolumeMounts) != 1 || first.VolumeMounts[0] != (store.VolumeMount{VolumeID: data.ID, Name: "data", Path: "/data", SizeBytes: 64 << 20}) {
		t.Fatalf("sandbox row mounts %+v", first.VolumeMounts)
	}
	// Its usage comes from nb, which holds it; a volume no node holds
	// yet has none.
	if err := os.WriteFile(filepath.Join(f.b.Volumes.Dir(data.ID), "f"), make([]byte, 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	if u, err := f.ctl.VolumeUsage(ctx, got); err != nil || u.UsedBytes != 1000 || u.CapacityBytes != 64<<20 {
		t.Fatalf("usage of the volume on nb: %+v %v", u, err)
	}
	if u, err := f.ctl.VolumeUsage(ctx, other); !errdefs.IsNotFound(err) {
		t.Fatalf("usage of a volume no node holds: %+v %v", u, err)
	}
	// Every later create with it goes to nb, whatever the spread says.
	for range 3 {
		sb, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour, Volumes: []control.VolumeRequest{{Name: data.ID, Path: "/mnt/d", ReadOnly: true}}})
		if err != nil || sb.NodeID != "nb" {
			t.Fatalf("a create with the volume went to %q: %v", sb.NodeID, err)
		}
	}
	if _, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour, NodeID: "na", Volumes: []control.VolumeRequest{{Name: "data", Path: "/data"}}}); !errdefs.IsConflict(err) {
		t.Fatalf("a create with the volume on another node: %v", err)
	}
	// A volume on na and one on nb cannot be mounted together.
	if _, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour, NodeID: "na", Volumes: []control.VolumeRequest{{Name: "other", Path: "/o"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour, Volumes: []control.VolumeRequest{{Name: "data", Path: "/d"}, {Name: "other", Path: "/o"}}}); !errdefs.IsConflict(err) {
		t.Fatalf("volumes on two nodes in one sandbox: %v", err)
	}

	// Fork children stay on nb and are users too.
	kids, err := f.ctl.Fork(ctx, first.ID, 2, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		if k.Err != nil || k.Sandbox.NodeID != "nb" || len(k.Sandbox.VolumeMounts) != 1 {
			t.Fatalf("fork child %+v", k)
		}
	}
	// A snapshot records the mount; a sandbox made from it mounts the
	// same volume, on nb, and may not ask for others.
	snap, err := f.ctl.Snapshot(ctx, first.ID, "with-data", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.VolumeMounts) != 1 {
		t.Fatalf("snapshot row %+v", snap)
	}
	from, err := f.ctl.Create(ctx, control.CreateRequest{TemplateID: snap.ID, Timeout: time.Hour})
	if err != nil || from.NodeID != "nb" || len(from.VolumeMounts) != 1 || from.VolumeMounts[0].VolumeID != data.ID {
		t.Fatalf("a create from the snapshot: %+v %v", from, err)
	}
	if _, err := f.ctl.Create(ctx, control.CreateRequest{TemplateID: snap.ID, Timeout: time.Hour, Volumes: []control.VolumeRequest{{Name: "other", Path: "/o"}}}); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a create from the snapshot asking for another volume: %v", err)
	}
	if _, err := f.ctl.Snapshot(ctx, first.ID, "as-template", true); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("a template of a sandbox with volumes: %v", err)
	}

	// Not deleted while any of them lives; then deleted, and nb told.
	got, _ = f.st.GetVolume(ctx, store.DefaultTeam, "data")
	if len(got.Users) != 1+3+2+1 {
		t.Fatalf("users %v", got.Users)
	}
	if _, err := cat.Delete(ctx, "", "data"); !errdefs.IsConflict(err) {
		t.Fatalf("delete of a mounted volume: %v", err)
	}
	for _, id := range got.Users {
		if err := f.ctl.Kill(ctx, id); err != nil && !errdefs.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	gone, err := cat.Delete(ctx, "", "data")
	if err != nil {
		t.Fatal(err)
	}
	// The snapshot outlives the volume, but a sandbox made from it would
	// have nothing behind its mount: refused, naming it.
	if _, err := f.ctl.Create(ctx, control.CreateRequest{TemplateID: snap.ID, Timeout: time.Hour}); !errdefs.IsNotFound(err) {
		t.Fatalf("a create from a snapshot whose volume was deleted: %v", err)
	}
	f.ctl.DropVolumeContent(gone) // in the background, after the answer
	for deadline := time.Now().Add(30 * time.Second); !slices.Contains(nodes["nb"].Volumes.Deleted(), data.ID) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if !slices.Contains(nodes["nb"].Volumes.Deleted(), data.ID) || slices.Contains(nodes["na"].Volumes.Deleted(), data.ID) {
		t.Fatalf("deleted on na %v, nb %v", f.a.Volumes.Deleted(), f.b.Volumes.Deleted())
	}
	if _, ok := f.b.Volumes.Made(data.ID); ok {
		t.Fatal("nb still has the volume's content")
	}
	if _, ok := f.a.Volumes.Made(other.ID); !ok {
		t.Fatal("na lost the other volume")
	}
}

// An exclusive volume through the control plane: one read-write holder at
// a time (a second is a 409 that leaves no row; read-only mounts are
// fine; a holder gone frees it); a fork child and a create from a
// snapshot get volumes of their own, recorded (held by them, on the
// parent's node, named after them) with the content of the capture; the
// snapshot keeps the content after the volume is deleted; a create that
// fails takes its volume's record with it. In process and over the node
// protocol.
func TestExclusiveVolumeInTheControlPlane(t *testing.T) { controltest.Each(t, testExclusiveVolume) }

func testExclusiveVolume(t *testing.T, _ controltest.Config) {
	f := newFleet(t)
	ctx := ctxFor(t)
	cat := volume.NewCatalog(f.st)
	ex, err := cat.Create(ctx, volume.CreateOptions{Name: "work", Mode: store.VolumeExclusive, Size: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	a, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour, Volumes: []control.VolumeRequest{{Name: "work", Path: "/work"}}})
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*controltest.Node{"na": f.a, "nb": f.b}
	home := nodes[a.NodeID]
	if err := os.WriteFile(filepath.Join(home.Volumes.Dir(ex.ID), "f"), []byte("at-snapshot"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, _ := f.st.GetVolume(ctx, "", ex.ID); got.Holder != a.ID || !a.VolumeMounts[0].Exclusive {
		t.Fatalf("the holder of the volume is %q (sandbox mounts %+v)", got.Holder, a.VolumeMounts)
	}
	before, _, _ := f.st.ListSandboxes(ctx, store.SandboxFilter{Limit: 100})
	if _, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour, Volumes: []control.VolumeRequest{{Name: "work", Path: "/w"}}}); !errdefs.IsConflict(err) {
		t.Fatalf("a second read-write mount of an exclusive volume: %v", err)
	}
	if after, _, _ := f.st.ListSandboxes(ctx, store.SandboxFilter{Limit: 100}); len(after) != len(before) {
		t.Fatalf("the refused create left a row: %d rows, were %d", len(after), len(before))
	}
	ro, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour, Volumes: []control.VolumeRequest{{Name: "work", Path: "/w", ReadOnly: true}}})
	if err != nil {
		t.Fatalf("a read-only mount of a held exclusive volume: %v", err)
	}

	snap, err := f.ctl.Snapshot(ctx, a.ID, "with-work", false)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home.Volumes.Dir(ex.ID), "f"), []byte("at-fork"), 0o644); err != nil {
		t.Fatal(err)
	}
	kids, err := f.ctl.Fork(ctx, a.ID, 2, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	own := func(sb store.Sandbox, want string) {
		t.Helper()
		id := ids.Derive('v', sb.ID, ex.ID)
		v, err := f.st.GetVolume(ctx, "", id)
		if err != nil || v.Holder != sb.ID || v.MadeFor != sb.ID || v.NodeID != a.NodeID || v.Mode != store.VolumeExclusive || v.SizeBytes != 64<<20 || v.Name != "work-"+sb.ID {
			t.Fatalf("the volume of %s: %+v (%v)", sb.ID, v, err)
		}
		if len(sb.VolumeMounts) != 1 || sb.VolumeMounts[0].VolumeID != id || sb.VolumeMounts[0].Name != v.Name || sb.VolumeMounts[0].Path != "/work" {
			t.Fatalf("%s mounts %+v: want its own volume %s", sb.ID, sb.VolumeMounts, id)
		}
		if got, err := os.ReadFile(filepath.Join(home.Volumes.Dir(id), "f")); err != nil || string(got) != want {
			t.Fatalf("the volume of %s holds %q (%v), want %q", sb.ID, got, err, want)
		}
	}
	for _, k := range kids {
		if k.Err != nil || k.Sandbox.NodeID != a.NodeID {
			t.Fatalf("fork child %+v", k)
		}
		own(k.Sandbox.Sandbox, "at-fork")
	}

	// The volume deleted (once its holder and reader are gone): the
	// snapshot still brings its content, as a volume of the new sandbox.
	if _, err := cat.Delete(ctx, "", "work"); !errdefs.IsConflict(err) {
		t.Fatalf("delete of a held volume: %v", err)
	}
	for _, id := range []string{a.ID, ro.ID} {
		if err := f.ctl.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cat.Delete(ctx, "", "work"); err != nil {
		t.Fatal(err)
	}
	// The snapshot is not durable (no blob store here): its copy of the
	// volume is on its node alone, and a create from it goes there.
	other := "na"
	if a.NodeID == "na" {
		other = "nb"
	}
	if _, err := f.ctl.Create(ctx, control.CreateRequest{TemplateID: snap.ID, Timeout: time.Hour, NodeID: other}); !errdefs.IsConflict(err) {
		t.Fatalf("a create from the snapshot on the node without its volume copy: %v", err)
	}
	from, err := f.ctl.Create(ctx, control.CreateRequest{TemplateID: snap.ID, Timeout: time.Hour})
	if err != nil || from.NodeID != a.NodeID {
		t.Fatalf("a create from the snapshot after its volume was deleted: on %q, %v", from.NodeID, err)
	}
	own(from.Sandbox, "at-snapshot")

	// A create from the snapshot that fails on its node leaves no row and
	// no volume.
	vols, _, _ := f.st.ListVolumes(ctx, "", 100, "")
	home.Runtime.Fail(fake.OpRestore, "", 1, errdefs.ErrInternal)
	if _, err := f.ctl.Create(ctx, control.CreateRequest{TemplateID: snap.ID, Timeout: time.Hour}); err == nil {
		t.Fatal("a create whose restore failed succeeded")
	}
	if after, _, _ := f.st.ListVolumes(ctx, "", 100, ""); len(after) != len(vols) {
		t.Fatalf("the failed create left volumes: %d, were %d", len(after), len(vols))
	}
}
