package control_test

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/engine"
	"github.com/spore-run/spore/internal/errdefs"
	lnode "github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/runtime/fake"
	"github.com/spore-run/spore/internal/snapshot"
	"github.com/spore-run/spore/internal/store"
)

// parentMiB is what the parent of the fork tests holds (the fake runtime's
// stats are its memory's bytes): each child takes 3 MB for placement.
const parentMiB = 3

// reportFree heartbeats node id as it is, but reporting mb of memory free
// (what a node with a memory floor says).
func (f *durableFleet) reportFree(id string, mb int64) {
	f.t.Helper()
	info, err := f.nodes[id].Info(ctxFor(f.t))
	if err != nil {
		f.t.Fatal(err)
	}
	info.MemoryFreeMB = &mb
	if _, err := f.ctl.Heartbeat(ctxFor(f.t), id, info.Addr, info, false); err != nil {
		f.t.Fatal(err)
	}
	// The next placement reads it: a background refresh of the view that
	// read the rows before this heartbeat would otherwise stand, dated
	// now, for up to the view's age (CI: a fork placed by the figures of
	// before).
	f.ctl.InvalidateView()
}

// forkParent makes a sandbox on node na holding parentMiB of memory.
func (f *durableFleet) forkParent() control.Sandbox {
	f.t.Helper()
	parent := f.create(control.CreateRequest{NodeID: "na"})
	var out bytes.Buffer
	blob := strings.Repeat("m", parentMiB<<20-1024)
	if code, err := f.a.Engine.Exec(ctxFor(f.t), parent.ID, runtime.ExecSpec{Args: []string{"set", "blob", blob}, Stdout: &out}); err != nil || code != 0 {
		f.t.Fatalf("fill the parent: %d %v", code, err)
	}
	f.clk.Add(10 * time.Second) // the next placement rebuilds its view
	return parent
}

// A fork's children fill the parent's node as far as the memory it really
// has free goes (its heartbeat's figure; each child takes what the parent
// holds), then spill to a node that has it. Before, only the limits (ample
// here) bound, and all four went to the parent's node.
func TestForkSpillsByRealFreeMemory(t *testing.T) {
	controltest.Each(t, testForkSpillsByRealFreeMemory)
}

func testForkSpillsByRealFreeMemory(t *testing.T, c controltest.Config) {
	f := newDurableFleet(t, c)
	parent := f.forkParent()
	f.reportFree("na", 2*parentMiB+1) // room for 2 children
	f.reportFree("nb", 100)
	kids, err := f.ctl.Fork(ctxFor(t), parent.ID, 4, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	on := map[string]int{}
	for i, k := range kids {
		if k.Err != nil {
			t.Fatalf("child %d: %v", i, k.Err)
		}
		on[k.Sandbox.NodeID]++
	}
	if on["na"] != 2 || on["nb"] != 2 {
		t.Fatalf("children per node %v, want 2 on the parent's node (its free memory) and 2 spilled", on)
	}
}

// When the fleet has room for only some children, those are made and the
// others are refused, each with a resource-limit error naming memory;
// with room for none the fork is refused as a whole. Before, all were made
// (the limits allowed them), whatever the nodes' memory.
func TestForkTrimmedToTheFleetsMemory(t *testing.T) {
	controltest.Each(t, testForkTrimmedToTheFleetsMemory)
}

func testForkTrimmedToTheFleetsMemory(t *testing.T, c controltest.Config) {
	f := newDurableFleet(t, c)
	parent := f.forkParent()
	f.reportFree("na", 2*parentMiB+1) // 2 children
	f.reportFree("nb", parentMiB+1)   // 1 child
	kids, err := f.ctl.Fork(ctxFor(t), parent.ID, 6, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	made := 0
	for i, k := range kids {
		switch {
		case k.Err == nil:
			made++
		case !errors.Is(k.Err, errdefs.ErrResourceLimit) || !strings.Contains(k.Err.Error(), "memory free now"):
			t.Fatalf("child %d: %v, want made or refused for memory", i, k.Err)
		}
	}
	if made != 3 {
		t.Fatalf("%d children made, want the 3 that fit", made)
	}
	rows, _, err := f.st.ListSandboxes(ctxFor(t), store.SandboxFilter{Limit: 100})
	if err != nil || len(rows) != 4 {
		t.Fatalf("%d rows after the trimmed fork (%v), want the parent and 3 children", len(rows), err)
	}
	f.clk.Add(10 * time.Second)
	f.reportFree("na", 1)
	f.reportFree("nb", 1)
	if _, err := f.ctl.Fork(ctxFor(t), parent.ID, 2, time.Hour); !errors.Is(err, errdefs.ErrResourceLimit) {
		t.Fatalf("fork with room for no child: %v, want a resource limit", err)
	}
}

// pressureNode is a fake node whose engine has a memory floor of 1 GiB
// over a MemAvailable of base less 200 MiB per instance.
type pressureNode struct {
	eng  *engine.Engine
	rt   *fake.Runtime
	base atomic.Int64
}

const perInstance = 200 << 20

func newPressureNode(t *testing.T) *pressureNode {
	t.Helper()
	p := &pressureNode{rt: fake.New()}
	p.base.Store(16 << 30)
	dir := t.TempDir()
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "base"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "base.json"), []byte(`{"id":"fake-base-1","suite":"fake"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	repo, err := snapshot.Open(filepath.Join(dir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	p.eng, err = engine.Open(ctxFor(t), engine.Config{
		Dir: filepath.Join(dir, "engine"), RootFSDir: rootfs, Runtime: p.rt, Snapshots: repo, Network: controltest.NewNetwork(),
		MemoryReserve: 1 << 30, MemoryMargin: 100 << 20, InstanceOverhead: -1, Logger: slog.New(slog.DiscardHandler),
		MemAvailable: func() (int64, error) { return p.base.Load() - perInstance*int64(len(p.rt.Instances())), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.eng.Close() })
	if _, err := p.eng.BuildTemplate(ctxFor(t), engine.TemplateSpec{Name: "base", Run: snapshot.RunConfig{Args: []string{"init"}}}); err != nil {
		t.Fatal(err)
	}
	return p
}

// A node that hibernates a sandbox on its own when its memory falls under
// the floor (the least recently active one) says so, and the control
// plane records it hibernated with its snapshot, like a hibernation asked
// for: the proxy stops sending it traffic, and a connect resumes it. The
// active sandbox is left running. Before, the row kept saying running
// until the next reconcile (and named no hibernation snapshot).
func TestNodeHibernationUnderPressureIsRecorded(t *testing.T) {
	controltest.Each(t, testNodeHibernationUnderPressureIsRecorded)
}

func testNodeHibernationUnderPressureIsRecorded(t *testing.T, c controltest.Config) {
	p := newPressureNode(t)
	st := c.Store(t)
	ctl := control.New(control.Config{Store: st, Nodes: control.Nodes{"local": c.Node(t, lnode.New(p.eng, lnode.Config{ID: "local"}))}})
	t.Cleanup(ctl.Close)
	ctx := ctxFor(t)
	var sbs []control.Sandbox
	for range 2 {
		sb, err := ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, sb)
	}
	cold, hot := sbs[0], sbs[1]
	if _, err := p.eng.Exec(ctx, hot.ID, runtime.ExecSpec{Args: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	// 50 MiB under the floor with both running: one hibernation brings it
	// to floor + 150 MiB, past the margin.
	p.base.Store(1<<30 - 50<<20 + 2*perInstance)
	if got := p.eng.RelievePressure(ctx); len(got) != 1 || got[0] != cold.ID {
		t.Fatalf("relief hibernated %v, want the cold sandbox %s", got, cold.ID)
	}
	es, err := p.eng.Get(ctx, cold.ID)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		rec, err := st.GetSandbox(ctx, cold.ID)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State == store.StateHibernated {
			if rec.Hibernation != es.Hibernation || rec.Addr != "" {
				t.Fatalf("recorded %+v, want hibernated in %s with no address", rec, es.Hibernation)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node's hibernation was never recorded: row %s", rec.State)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if rec, err := st.GetSandbox(ctx, hot.ID); err != nil || rec.State != store.StateRunning {
		t.Fatalf("the active sandbox: %+v %v, want running", rec.State, err)
	}
	if _, ok := ctl.Target(cold.ID); ok {
		t.Fatal("the proxy still has a target for the hibernated sandbox")
	}
	p.base.Store(16 << 30)
	sb, resumed, err := ctl.Connect(ctx, cold.ID, time.Hour)
	if err != nil || !resumed || sb.State != store.StateRunning {
		t.Fatalf("connect to the sandbox hibernated under pressure: %+v resumed=%v %v", sb.State, resumed, err)
	}
	if es, err := p.eng.Get(ctx, cold.ID); err != nil || es.State != engine.StateRunning {
		t.Fatalf("on the node after connect: %+v %v", es.State, err)
	}
}
