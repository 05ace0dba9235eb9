package control_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
	"github.com/spore-run/spore/internal/volume"
)

// A hibernated sandbox holding an exclusive volume moves whole: its node
// lost, it resumes on another node, where the volume is made from the
// hibernation's copy (its content at the hibernation; the copy travels
// with the durable image as a dependency); the volume's row names the new
// node once the sandbox runs there, and when the old node comes back its
// copy of the sandbox and of the volume go. A read-only mount of the
// volume while its holder moves is a 409. A sandbox with a shared volume
// stays with its node (its content lives there): while that node drains,
// a connect is refused, naming the drain, and changes nothing. Before, any volume kept a hibernated sandbox on
// its node. In process and over the node protocol.
func TestExclusiveVolumeMovesWithItsSandbox(t *testing.T) {
	controltest.Each(t, testExclusiveVolumeMoves)
}

func testExclusiveVolumeMoves(t *testing.T, c controltest.Config) {
	f := newDurableFleetWith(t, c, nodeapi.Resources{}, true)
	ctx := ctxFor(t)
	cat := volume.NewCatalog(f.st)
	ex, err := cat.Create(ctx, volume.CreateOptions{Name: "work", Mode: store.VolumeExclusive, Size: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	shared, err := cat.Create(ctx, volume.CreateOptions{Name: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	sb, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour, NodeID: "na", Volumes: []control.VolumeRequest{{Name: "work", Path: "/work"}}})
	if err != nil {
		t.Fatal(err)
	}
	stays, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour, NodeID: "na", Volumes: []control.VolumeRequest{{Name: "shared", Path: "/s"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.a.Volumes.Dir(ex.ID), "f"), []byte("at-hibernation"), 0o644); err != nil {
		t.Fatal(err)
	}
	f.hibernateDurable(sb.ID)
	f.hibernateDurable(stays.ID)
	if err := os.WriteFile(filepath.Join(f.a.Volumes.Dir(ex.ID), "f"), []byte("after"), 0o644); err != nil {
		t.Fatal(err) // what no one can see: the sandbox was stopped
	}
	f.loseNodeA()

	// (na is lost by its heartbeats, but still answers here: the sandbox
	// resumes there, with its volume.)
	if got, _, err := f.ctl.Connect(ctx, stays.ID, time.Minute); err != nil || got.NodeID != "na" {
		t.Fatalf("a sandbox with a shared volume resumed on %q (%v): want its volume's node", got.NodeID, err)
	}
	if v, _ := f.st.GetVolume(ctx, "", shared.ID); v.NodeID != "na" {
		t.Fatalf("the shared volume moved to %q", v.NodeID)
	}

	got, resumed, err := f.ctl.Connect(ctx, sb.ID, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !resumed || got.NodeID != "nb" || got.State != store.StateRunning {
		t.Fatalf("after connect: resumed %v, %+v", resumed, got.Sandbox)
	}
	if b, err := os.ReadFile(filepath.Join(f.b.Volumes.Dir(ex.ID), "f")); err != nil || string(b) != "at-hibernation" {
		t.Fatalf("the volume on nb holds %q (%v), want its content at the hibernation", b, err)
	}
	es, err := f.b.Engine.Get(ctx, sb.ID)
	if err != nil || len(es.Run.Volumes) != 1 || es.Run.Volumes[0].ImageName() != ex.ID {
		t.Fatalf("on nb: %+v %v", es.Run.Volumes, err)
	}
	if imgs, _ := f.b.Volumes.Images(ctx); slices.ContainsFunc(imgs, func(s string) bool { return strings.HasPrefix(s, "c-") }) {
		t.Fatalf("the hibernation's copy is left on nb: %v", imgs)
	}
	if v, _ := f.st.GetVolume(ctx, "", ex.ID); v.NodeID != "nb" || v.Holder != sb.ID {
		t.Fatalf("the volume's row after the move: %+v", v)
	}
	// Later mounts go where the content is.
	ro, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour, Volumes: []control.VolumeRequest{{Name: "work", Path: "/w", ReadOnly: true}}})
	if err != nil || ro.NodeID != "nb" {
		t.Fatalf("a read-only mount after the move: on %q, %v", ro.NodeID, err)
	}

	// na comes back: its copies of the sandbox and of the volume go.
	f.beat("na")
	if _, err := f.a.Engine.Get(ctx, sb.ID); !errdefs.IsNotFound(err) {
		t.Fatalf("na's stale copy of the sandbox after its reconcile: %v", err)
	}
	if !slices.Contains(f.a.Volumes.Deleted(), ex.ID) {
		t.Fatalf("na kept its old image of the moved volume (deleted there: %v)", f.a.Volumes.Deleted())
	}
	if slices.Contains(f.a.Volumes.Deleted(), shared.ID) {
		t.Fatal("na dropped the shared volume")
	}

	// While a holder moves (its row names another node than its
	// volume's), a read-only mount is refused and leaves no row.
	if _, err := f.st.UpdateSandbox(ctx, sb.ID, func(x *store.Sandbox) error { x.NodeID = "na"; return nil }); err != nil {
		t.Fatal(err)
	}
	rows, _, _ := f.st.ListSandboxes(ctx, store.SandboxFilter{Limit: 100})
	if _, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour, Volumes: []control.VolumeRequest{{Name: "work", Path: "/w", ReadOnly: true}}}); !errdefs.IsConflict(err) || !strings.Contains(err.Error(), "moving") {
		t.Fatalf("a read-only mount while the holder moves: %v", err)
	}
	if after, _, _ := f.st.ListSandboxes(ctx, store.SandboxFilter{Limit: 100}); len(after) != len(rows) {
		t.Fatalf("the refused create left a row: %d rows, were %d", len(after), len(rows))
	}
	if _, err := f.st.UpdateSandbox(ctx, sb.ID, func(x *store.Sandbox) error { x.NodeID = "nb"; return nil }); err != nil {
		t.Fatal(err)
	}

	// The shared volume's node drained: its sandbox is hibernated there
	// and a connect is refused, naming the drain, until it is undrained.
	if _, err := f.ctl.Drain(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	hibernated := f.row(stays.ID)
	if _, _, err := f.ctl.Connect(ctx, stays.ID, time.Minute); !errors.Is(err, errdefs.ErrResourceLimit) || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("a connect to a sandbox whose shared volume's node drains: %v", err)
	}
	if r := f.row(stays.ID); r.State != store.StateHibernated || r.NodeID != "na" || r.Version != hibernated.Version {
		t.Fatalf("the refused connect changed the row: %+v", r)
	}
	if err := f.ctl.Undrain(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	if got, _, err := f.ctl.Connect(ctx, stays.ID, time.Minute); err != nil || got.NodeID != "na" {
		t.Fatalf("the connect after the undrain: on %q, %v", got.NodeID, err)
	}
}

// A fork of a sandbox holding an exclusive volume that spills to another
// node: the children there get volumes of their own, made from the fork
// snapshot's copy of the volume (it travels with the snapshot), with the
// content at the fork; the children on the parent's node too. In process
// and over the node protocol.
func TestForkWithAnExclusiveVolumeSpills(t *testing.T) {
	controltest.Each(t, testForkWithAnExclusiveVolumeSpills)
}

func testForkWithAnExclusiveVolumeSpills(t *testing.T, c controltest.Config) {
	// Room for 3 default sandboxes per node.
	f := newDurableFleetWith(t, c, nodeapi.Resources{MemoryMB: 3 * 1024, VCPUs: 6, Sandboxes: 100}, true)
	ctx := ctxFor(t)
	cat := volume.NewCatalog(f.st)
	ex, err := cat.Create(ctx, volume.CreateOptions{Name: "work", Mode: store.VolumeExclusive, Size: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	parent, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour, NodeID: "na", Volumes: []control.VolumeRequest{{Name: "work", Path: "/work"}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.a.Volumes.Dir(ex.ID), "f"), []byte("at-the-fork"), 0o644); err != nil {
		t.Fatal(err)
	}
	kids, err := f.ctl.Fork(ctx, parent.ID, 4, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*controltest.Node{"na": f.a, "nb": f.b}
	on := map[string]int{}
	for i, k := range kids {
		if k.Err != nil {
			t.Fatalf("child %d: %v", i, k.Err)
		}
		on[k.Sandbox.NodeID]++
		if len(k.Sandbox.VolumeMounts) != 1 || k.Sandbox.VolumeMounts[0].VolumeID == ex.ID {
			t.Fatalf("child %d mounts %+v: want a volume of its own", i, k.Sandbox.VolumeMounts)
		}
		own := k.Sandbox.VolumeMounts[0].VolumeID
		v, err := f.st.GetVolume(ctx, "", own)
		if err != nil || v.NodeID != k.Sandbox.NodeID || v.Holder != k.Sandbox.ID {
			t.Fatalf("child %d's volume: %+v %v (child on %s)", i, v, err, k.Sandbox.NodeID)
		}
		if b, err := os.ReadFile(filepath.Join(nodes[k.Sandbox.NodeID].Volumes.Dir(own), "f")); err != nil || string(b) != "at-the-fork" {
			t.Fatalf("child %d on %s: its volume holds %q (%v)", i, k.Sandbox.NodeID, b, err)
		}
	}
	if on["na"] != 2 || on["nb"] != 2 {
		t.Fatalf("children per node: %v, want 2 on the parent's node and 2 spilled", on)
	}
}
