package control_test

import (
	"context"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/store"
)

// fleet is a control plane over two fake nodes, "na" and "nb".
type fleet struct {
	*harness
	a, b *controltest.Node
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	return newFleetOver(t, func(st store.Store) store.Store { return st })
}

// newFleetOver is newFleet with the control plane (and the test) on
// wrap's store over the configuration's.
func newFleetOver(t *testing.T, wrap func(store.Store) store.Store) *fleet {
	t.Helper()
	c := controltest.ConfigOf(t)
	st := wrap(c.Store(t))
	a, b := controltest.New(t), controltest.New(t)
	la, lb := local.New(a.Engine, local.Config{ID: "na", Images: a.Volumes}), local.New(b.Engine, local.Config{ID: "nb", Images: b.Volumes})
	h := &harness{t: t, n: a, st: st, clk: &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}}
	h.nodes = control.Nodes{"na": c.Node(t, la), "nb": c.Node(t, lb)}
	h.ctl = control.New(control.Config{Store: st, Nodes: h.nodes, Now: h.clk.Now})
	t.Cleanup(h.ctl.Close)
	if err := h.ctl.RegisterNodes(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	return &fleet{harness: h, a: a, b: b}
}

func (f *fleet) beat(id string) {
	f.t.Helper()
	n := map[string]*controltest.Node{"na": f.a, "nb": f.b}[id]
	info, err := local.New(n.Engine, local.Config{ID: id}).Info(ctxFor(f.t))
	if err != nil {
		f.t.Fatal(err)
	}
	// As the API's registration route does: a joining node is
	// reconciled, then ready.
	join, err := f.ctl.Heartbeat(ctxFor(f.t), id, id+":1", info, false)
	if err != nil {
		f.t.Fatal(err)
	}
	if join {
		if err := f.ctl.ReconcileNode(ctxFor(f.t), id); err != nil {
			f.t.Fatal(err)
		}
		if err := f.ctl.Joined(ctxFor(f.t), id); err != nil {
			f.t.Fatal(err)
		}
	}
}

func (f *fleet) row(id string) store.Sandbox {
	f.t.Helper()
	rec, err := f.st.GetSandbox(ctxFor(f.t), id)
	if err != nil {
		f.t.Fatal(err)
	}
	return rec
}

func (f *fleet) nodeRow(id string) store.Node {
	f.t.Helper()
	n, err := f.st.GetNode(ctxFor(f.t), id)
	if err != nil {
		f.t.Fatal(err)
	}
	return n
}

// onNode creates sandboxes until one lands on the node.
func (f *fleet) onNode(node string) control.Sandbox {
	f.t.Helper()
	for range 8 {
		sb := f.create(control.CreateRequest{})
		if sb.NodeID == node {
			return sb
		}
	}
	f.t.Fatalf("no create landed on %s", node)
	return control.Sandbox{}
}

// A node whose heartbeat is older than LostAfter is marked lost by
// CheckNodes; its running and paused sandboxes get state error with
// reason node-lost, its hibernated ones stay hibernated, and the other
// node's sandboxes are untouched. When it heartbeats again and is
// reconciled, the sandboxes it still runs are running again.
func TestNodeLost(t *testing.T) { controltest.Each(t, testNodeLost) }

func testNodeLost(t *testing.T, _ controltest.Config) {
	f := newFleet(t)
	ctx := ctxFor(t)
	run, paused, hib := f.onNode("na"), f.onNode("na"), f.onNode("na")
	other := f.onNode("nb")
	if err := f.ctl.Pause(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.ctl.Hibernate(ctx, hib.ID); err != nil {
		t.Fatal(err)
	}
	f.beat("na")
	f.beat("nb")
	f.clk.Add(control.LostAfter) // exactly LostAfter: not yet lost
	if err := f.ctl.CheckNodes(ctx); err != nil {
		t.Fatal(err)
	}
	if s := f.nodeRow("na").State; s != store.NodeReady {
		t.Fatalf("na is %s after exactly LostAfter", s)
	}
	f.clk.Add(time.Second)
	f.beat("nb") // nb keeps beating
	if err := f.ctl.CheckNodes(ctx); err != nil {
		t.Fatal(err)
	}
	if s := f.nodeRow("na").State; s != store.NodeLost {
		t.Fatalf("na is %s, want lost", s)
	}
	if s := f.nodeRow("nb").State; s != store.NodeReady {
		t.Fatalf("nb is %s, want ready", s)
	}
	for _, id := range []string{run.ID, paused.ID} {
		if r := f.row(id); r.State != store.StateError || r.Reason != control.ReasonNodeLost {
			t.Fatalf("%s: %s/%s, want error/node-lost", id, r.State, r.Reason)
		}
	}
	if r := f.row(hib.ID); r.State != store.StateHibernated {
		t.Fatalf("hibernated sandbox of a lost node is %s", r.State)
	}
	if r := f.row(other.ID); r.State != store.StateRunning {
		t.Fatalf("the other node's sandbox is %s", r.State)
	}
	if _, running, found, _ := f.ctl.Lookup(run.ID); running || found {
		t.Fatal("the proxy still routes to a sandbox of a lost node")
	}
	// No placement on a lost node.
	for range 4 {
		if sb := f.create(control.CreateRequest{}); sb.NodeID != "nb" {
			t.Fatalf("a create landed on %s, which is lost", sb.NodeID)
		}
	}
	// na comes back: it is ready, and reconciled its sandboxes are what
	// it reports (running, paused), reasons cleared.
	f.beat("na")
	if s := f.nodeRow("na").State; s != store.NodeReady {
		t.Fatalf("na is %s after a heartbeat", s)
	}
	if err := f.ctl.ReconcileNode(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	if r := f.row(run.ID); r.State != store.StateRunning || r.Reason != "" {
		t.Fatalf("after rejoin: %s/%s, want running", r.State, r.Reason)
	}
	if r := f.row(paused.ID); r.State != store.StatePaused {
		t.Fatalf("after rejoin: %s, want paused", r.State)
	}
}

// A node that comes back is joining until it was reconciled: no
// placement on it, its sandboxes keep their rows' state (the proxy does
// not route to a node-lost sandbox), a joining node that stops beating is
// lost; once reconciled and marked joined it is ready and its sandboxes
// run. Before, a heartbeat made it ready at once, so "ready" could be read
// while its sandboxes were still error/node-lost (a restarted fleet
// answered Unavailable to the first command).
func TestJoiningNodeIsReadyOnlyWhenReconciled(t *testing.T) {
	controltest.Each(t, testJoiningNodeIsReadyOnlyWhenReconciled)
}

func testJoiningNodeIsReadyOnlyWhenReconciled(t *testing.T, _ controltest.Config) {
	f := newFleet(t)
	ctx := ctxFor(t)
	run := f.onNode("na")
	f.beat("na")
	f.beat("nb")
	f.clk.Add(control.LostAfter + time.Second)
	f.beat("nb")
	if err := f.ctl.CheckNodes(ctx); err != nil {
		t.Fatal(err)
	}
	if s := f.nodeRow("na").State; s != store.NodeLost {
		t.Fatalf("na is %s, want lost", s)
	}
	info, err := local.New(f.a.Engine, local.Config{ID: "na"}).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	join, err := f.ctl.Heartbeat(ctx, "na", "na:1", info, false)
	if err != nil || !join {
		t.Fatalf("heartbeat of a lost node: join %v, %v", join, err)
	}
	if s := f.nodeRow("na").State; s != store.NodeJoining {
		t.Fatalf("na is %s before its reconcile, want joining", s)
	}
	if _, running, _, _ := f.ctl.Lookup(run.ID); running {
		t.Fatal("the proxy routes to a node-lost sandbox before its node was reconciled")
	}
	for range 4 {
		if sb := f.create(control.CreateRequest{}); sb.NodeID != "nb" {
			t.Fatalf("a create landed on %s, which is joining", sb.NodeID)
		}
	}
	// A second heartbeat before the join finished joins again.
	if join, err := f.ctl.Heartbeat(ctx, "na", "na:1", info, false); err != nil || !join {
		t.Fatalf("heartbeat of a joining node: join %v, %v", join, err)
	}
	if err := f.ctl.ReconcileNode(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	if err := f.ctl.Joined(ctx, "na"); err != nil {
		t.Fatal(err)
	}
	if s := f.nodeRow("na").State; s != store.NodeReady {
		t.Fatalf("na is %s after its join, want ready", s)
	}
	if _, running, _, _ := f.ctl.Lookup(run.ID); !running {
		t.Fatal("the sandbox of a rejoined node is not routed")
	}
	if join, err := f.ctl.Heartbeat(ctx, "na", "na:1", info, false); err != nil || join {
		t.Fatalf("steady heartbeat: join %v, %v", join, err)
	}
	if join, err := f.ctl.Heartbeat(ctx, "na", "na:1", info, true); err != nil || !join {
		t.Fatalf("heartbeat of a restarted agent: join %v, %v", join, err)
	}
	// A joining node that stops beating is lost like a ready one.
	f.clk.Add(control.LostAfter + time.Second)
	f.beat("nb")
	if err := f.ctl.CheckNodes(ctx); err != nil {
		t.Fatal(err)
	}
	if s := f.nodeRow("na").State; s != store.NodeLost {
		t.Fatalf("a silent joining node is %s, want lost", s)
	}
}

// A monitor that just started judges nobody for LostAfter: after a
// restart of the whole control plane every heartbeat is stale, and the
// nodes need a moment to register again. Before, every node was marked
// lost (and every sandbox error) at the first tick.
func TestMonitorWaitsBeforeJudging(t *testing.T) { controltest.Each(t, testMonitorWaitsBeforeJudging) }

func testMonitorWaitsBeforeJudging(t *testing.T, _ controltest.Config) {
	f := newFleet(t)
	f.beat("na")
	f.beat("nb")
	f.clk.Add(time.Hour) // the control plane was down for an hour
	ctx, cancel := context.WithCancel(ctxFor(t))
	done := make(chan struct{})
	go func() { defer close(done); f.ctl.MonitorNodes(ctx, time.Millisecond) }()
	defer func() { cancel(); <-done }()
	time.Sleep(200 * time.Millisecond) // ~200 ticks within its first LostAfter
	for _, id := range []string{"na", "nb"} {
		if s := f.nodeRow(id).State; s != store.NodeReady {
			t.Fatalf("%s is %s right after the monitor started", id, s)
		}
	}
	f.beat("nb")
	f.clk.Add(control.LostAfter + time.Second)
	f.beat("nb")
	deadline := time.Now().Add(10 * time.Second)
	for f.nodeRow("na").State != store.NodeLost {
		if time.Now().After(deadline) {
			t.Fatal("na never judged lost once the monitor had waited LostAfter")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if s := f.nodeRow("nb").State; s != store.NodeReady {
		t.Fatalf("nb, which kept beating, is %s", s)
	}
}

// Nodes that heartbeat within LostAfter stay ready.
func TestNodeWithRecentHeartbeatStaysReady(t *testing.T) {
	controltest.Each(t, testNodeWithRecentHeartbeatStaysReady)
}

func testNodeWithRecentHeartbeatStaysReady(t *testing.T, _ controltest.Config) {
	f := newFleet(t)
	f.beat("na")
	f.beat("nb")
	f.clk.Add(5 * time.Second)
	if err := f.ctl.CheckNodes(ctxFor(t)); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"na", "nb"} {
		if s := f.nodeRow(id).State; s != store.NodeReady {
			t.Fatalf("%s is %s 5 s after a heartbeat", id, s)
		}
	}
}

// Drain stops placements on a node and hibernates its running and paused
// sandboxes; undrain lets placements back.
func TestDrainUndrain(t *testing.T) { controltest.Each(t, testDrainUndrain) }

func testDrainUndrain(t *testing.T, _ controltest.Config) {
	f := newFleet(t)
	ctx := ctxFor(t)
	run, paused := f.onNode("nb"), f.onNode("nb")
	other := f.onNode("na")
	if err := f.ctl.Pause(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	n, err := f.ctl.Drain(ctx, "nb")
	if err != nil || n != 2 {
		t.Fatalf("drain: %d hibernated, %v; want 2", n, err)
	}
	if !f.nodeRow("nb").Draining {
		t.Fatal("nb is not draining")
	}
	for _, id := range []string{run.ID, paused.ID} {
		if r := f.row(id); r.State != store.StateHibernated {
			t.Fatalf("%s is %s after drain, want hibernated", id, r.State)
		}
	}
	if r := f.row(other.ID); r.State != store.StateRunning {
		t.Fatalf("the other node's sandbox is %s", r.State)
	}
	for range 4 {
		if sb := f.create(control.CreateRequest{}); sb.NodeID != "na" {
			t.Fatalf("a create landed on draining %s", sb.NodeID)
		}
	}
	// A heartbeat keeps the operator's drain.
	f.beat("nb")
	if !f.nodeRow("nb").Draining {
		t.Fatal("a heartbeat undrained nb")
	}
	if err := f.ctl.Undrain(ctx, "nb"); err != nil {
		t.Fatal(err)
	}
	f.onNode("nb")
	list, err := f.ctl.Nodes(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("nodes: %v %v", list, err)
	}
	for _, n := range list {
		if n.Draining || n.State != store.NodeReady || n.Sandboxes == 0 || n.MemoryUsedMB == 0 {
			t.Fatalf("node status %+v", n)
		}
	}
	if _, err := f.ctl.Drain(ctx, "nx"); err == nil {
		t.Fatal("drained a node that does not exist")
	}
}

// A node that reports launches waiting for its slots (a burst there) is
// left to itself while another node fits, for as long as the figure is
// fresh; the rest of the placement rules are unchanged.
func TestPlacementAvoidsABusyNode(t *testing.T) {
	f := newFleet(t)
	ctx := ctxFor(t)
	create := func() string {
		t.Helper()
		sb, err := f.ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return f.row(sb.ID).NodeID
	}
	beat := func(id string, queued int) {
		t.Helper()
		n := map[string]*controltest.Node{"na": f.a, "nb": f.b}[id]
		info, err := local.New(n.Engine, local.Config{ID: id}).Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		info.LaunchesQueued = queued
		if _, err := f.ctl.Heartbeat(ctx, id, id+":1", info, false); err != nil {
			t.Fatal(err)
		}
		f.ctl.InvalidateView() // as reportFree (memory_test.go)
	}
	f.beat("na")
	f.beat("nb")
	first := create()
	other := map[string]string{"na": "nb", "nb": "na"}[first]
	// The next would spread to the other node; make that one busy (the
	// placement view is rebuilt when older than 5 s).
	f.clk.Add(6 * time.Second)
	beat(other, 12)
	beat(first, 0)
	for range 2 {
		if got := create(); got != first {
			t.Fatalf("a create went to %s, busy with a burst, while %s fits", got, first)
		}
	}
	if row := f.nodeRow(other); row.LaunchesQueued != 12 {
		t.Fatalf("node row keeps %d launches queued, want 12", row.LaunchesQueued)
	}
	// A stale figure binds nothing: spreading resumes.
	f.clk.Add(10 * time.Second)
	beat(first, 0)
	if got := create(); got != other {
		t.Fatalf("with the busy figure stale, a create went to %s, want %s (spread)", got, other)
	}
}
