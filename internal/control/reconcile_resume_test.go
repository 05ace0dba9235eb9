package control_test

import (
	"context"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// resumingNode runs hook, once armed, at the start of a Resume, with List
// reporting that sandbox as a node does while it resumes it: "resuming",
// and no address yet (the engine's view of a hibernated record with the
// resume in its journal).
type resumingNode struct {
	nodeapi.Node
	hook *func()
	mid  *string // the sandbox being resumed while hook runs
}

func (n resumingNode) List(ctx context.Context) ([]nodeapi.Sandbox, error) {
	list, err := n.Node.List(ctx)
	for i := range list {
		if list[i].ID == *n.mid {
			list[i].State, list[i].Addr = "resuming", ""
		}
	}
	return list, err
}

func (n resumingNode) Resume(ctx context.Context, id string) (nodeapi.Sandbox, error) {
	if h := *n.hook; h != nil {
		*n.hook, *n.mid = nil, id
		h()
		*n.mid = ""
	}
	return n.Node.Resume(ctx, id)
}

// A reconcile of a node that lists a sandbox mid-resume leaves its row as
// it is (the connect resuming it records the outcome), and the connect
// records the sandbox running at the address its node gives. Before, the
// reconcile recorded the node's "resuming" as running with no address
// over the hibernated row; the connect's write then conflicted, it read
// the row again, took "running" for done and kept the empty address: a
// sandbox its node ran that every proxy refused as paused
// (flaky-cross-node-resume-502; "a running sandbox's row has no address"
// in TestRollingUpgrade, where a node's reconcile at its registration met
// a connect's resume).
func TestReconcileDuringAResumeKeepsTheAddress(t *testing.T) {
	controltest.Each(t, testReconcileDuringAResumeKeepsTheAddress)
}

func testReconcileDuringAResumeKeepsTheAddress(t *testing.T, c controltest.Config) {
	var f *durableFleet
	var hook func()
	mid := ""
	wrapNode = func(id string, n nodeapi.Node) nodeapi.Node {
		if id != "na" {
			return n
		}
		return resumingNode{Node: n, hook: &hook, mid: &mid}
	}
	f = newDurableFleet(t, c)
	wrapNode = nil
	ctx := ctxFor(t)
	sb := f.onNode("na")
	if err := f.ctl.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	reconciled := 0
	hook = func() {
		if err := f.ctl.ReconcileNode(ctx, "na"); err != nil {
			t.Errorf("reconcile na mid-resume: %v", err)
		}
		reconciled++
		if r := f.row(sb.ID); r.State != store.StateHibernated || r.Addr != "" {
			t.Errorf("after a reconcile mid-resume the row says %s at %q, want hibernated (the resume records it)", r.State, r.Addr)
		}
	}
	got, resumed, err := f.ctl.Connect(ctx, sb.ID, time.Minute)
	if err != nil || !resumed || reconciled != 1 {
		t.Fatalf("connect: resumed %v, %v (reconciled %d times mid-resume, want 1)", resumed, err, reconciled)
	}
	ns, err := f.nodes["na"].Get(ctx, sb.ID)
	if err != nil || ns.State != nodeapi.StateRunning || ns.Addr == "" {
		t.Fatalf("on na: %+v %v", ns, err)
	}
	if r := f.row(sb.ID); got.Addr != ns.Addr || r.State != store.StateRunning || r.Addr != ns.Addr {
		t.Fatalf("after the connect: answered address %q, row %s at %q; the node runs it at %s", got.Addr, r.State, r.Addr, ns.Addr)
	}
	if _, running, found, _ := f.ctl.Lookup(sb.ID); !running || !found {
		t.Fatalf("the proxy's lookup: running %v found %v", running, found)
	}
}

// hibernatingNode runs hook, once armed, when a Hibernate has hibernated
// the sandbox on the node and before its caller records it: the moment a
// drain's hibernation is done on the node and not yet in the row.
type hibernatingNode struct {
	nodeapi.Node
	hook *func(id string)
}

func (n hibernatingNode) Hibernate(ctx context.Context, id string) error {
	err := n.Node.Hibernate(ctx, id)
	if h := *n.hook; h != nil && err == nil {
		*n.hook = nil
		h(id)
	}
	return err
}

// A reconcile that meets a drain's hibernation done on the node but not
// yet recorded records it with its image, and a connect then (traffic
// waking the sandbox) does not resume it on the draining node: it moves
// or is refused for now. Before, the reconcile recorded "hibernated"
// with no image; a connect took that row for one its node could resume
// (only a row with an image can move), resumed it on the draining node,
// lost the race to record it, then tried to move the image that resume
// had consumed ("take it over on node ...: snapshot ...: not found",
// TestRollingUpgrade: a command's 502, and the sandbox resumed twice).
func TestReconcileDuringADrainsHibernationRecordsTheImage(t *testing.T) {
	controltest.Each(t, testReconcileDuringADrainsHibernation)
}

func testReconcileDuringADrainsHibernation(t *testing.T, c controltest.Config) {
	var hook func(id string)
	wrapNode = func(id string, n nodeapi.Node) nodeapi.Node {
		if id != "na" {
			return n
		}
		return hibernatingNode{Node: n, hook: &hook}
	}
	f := newDurableFleet(t, c)
	wrapNode = nil
	ctx := ctxFor(t)
	sb := f.onNode("na")
	if _, err := f.st.UpdateNode(ctx, "na", func(x *store.Node) error { x.Draining = true; return nil }); err != nil {
		t.Fatal(err)
	}
	ran := false
	hook = func(id string) {
		ran = true
		if err := f.ctl.ReconcileNode(ctx, "na"); err != nil {
			t.Errorf("reconcile na mid-hibernation: %v", err)
		}
		ns, err := f.nodes["na"].Get(ctx, id)
		if err != nil || ns.State != nodeapi.StateHibernated || ns.Hibernation == "" {
			t.Fatalf("on na mid-hibernation: %+v %v", ns, err)
		}
		if r := f.row(id); r.State != store.StateHibernated || r.Hibernation != ns.Hibernation {
			t.Errorf("after a reconcile mid-hibernation the row says %s with image %q, want hibernated with %q", r.State, r.Hibernation, ns.Hibernation)
		}
		// Traffic wakes it (autoResume) now.
		_, _, err = f.ctl.Connect(ctx, id, time.Minute)
		if ns, _ := f.nodes["na"].Get(ctx, id); ns.State == nodeapi.StateRunning {
			t.Errorf("a connect mid-hibernation resumed the sandbox on its draining node (connect: %v)", err)
		}
	}
	if err := f.ctl.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if !ran {
		t.Fatal("the hook never ran")
	}
	// A hibernated row that lost its image (written so by an older
	// release) gets it back at the next reconcile.
	want := f.row(sb.ID).Hibernation
	if _, err := f.st.UpdateSandbox(ctx, sb.ID, func(x *store.Sandbox) error { x.Hibernation = ""; return nil }); err != nil {
		t.Fatal(err)
	}
	if err := f.ctl.ReconcileNode(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	if r := f.row(sb.ID); r.State != store.StateHibernated || r.Hibernation != want || want == "" {
		t.Fatalf("an image-less hibernated row after a reconcile: %s with %q, want %q", r.State, r.Hibernation, want)
	}
}
