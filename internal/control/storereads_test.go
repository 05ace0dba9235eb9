package control_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/store"
)

// counting is a store that counts the calls an operation makes (on
// PostgreSQL each is a round trip or a transaction) and can fail
// ResolveRef.
type counting struct {
	store.Store
	mu       sync.Mutex
	calls    map[string]int
	failRefs error
	// hold, when set, stalls ListSandboxes (the placement view's second
	// read) until it is closed; listed counts the ones that returned.
	hold   chan struct{}
	listed atomic.Int64
	// started counts every ListNodes (a view's first read), counted or not.
	started atomic.Int64
}

// counted marks the contexts whose calls count: an operation's, not the
// background refresh of the placement view, which runs on its own.
type counted struct{}

func countIn(ctx context.Context) context.Context { return context.WithValue(ctx, counted{}, true) }

func (c *counting) hit(ctx context.Context, name string) {
	if ctx.Value(counted{}) == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[name]++
}

// take returns the calls since the last take, as "Name×n" sorted.
func (c *counting) take() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, k := range slices.Sorted(maps.Keys(c.calls)) {
		out = append(out, fmt.Sprintf("%s×%d", k, c.calls[k]))
	}
	c.calls = map[string]int{}
	return strings.Join(out, " ")
}

func (c *counting) ResolveRef(ctx context.Context, team, ref string) (store.Ref, error) {
	c.hit(ctx, "ResolveRef")
	if c.failRefs != nil {
		return store.Ref{}, c.failRefs
	}
	return c.Store.ResolveRef(ctx, team, ref)
}
func (c *counting) GetSnapshot(ctx context.Context, id string) (store.Snapshot, error) {
	c.hit(ctx, "GetSnapshot")
	return c.Store.GetSnapshot(ctx, id)
}
func (c *counting) ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]store.Snapshot, string, error) {
	c.hit(ctx, "ListSnapshots")
	return c.Store.ListSnapshots(ctx, f)
}
func (c *counting) GetTemplate(ctx context.Context, name string) (store.Template, error) {
	c.hit(ctx, "GetTemplate")
	return c.Store.GetTemplate(ctx, name)
}
func (c *counting) GetNode(ctx context.Context, id string) (store.Node, error) {
	c.hit(ctx, "GetNode")
	return c.Store.GetNode(ctx, id)
}
func (c *counting) ListNodes(ctx context.Context) ([]store.Node, error) {
	c.started.Add(1)
	c.hit(ctx, "ListNodes")
	return c.Store.ListNodes(ctx)
}
func (c *counting) GetSandbox(ctx context.Context, id string) (store.Sandbox, error) {
	c.hit(ctx, "GetSandbox")
	return c.Store.GetSandbox(ctx, id)
}
func (c *counting) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]store.Sandbox, string, error) {
	c.hit(ctx, "ListSandboxes")
	c.mu.Lock()
	hold := c.hold
	c.mu.Unlock()
	if hold != nil {
		<-hold
	}
	defer c.listed.Add(1)
	return c.Store.ListSandboxes(ctx, f)
}
func (c *counting) CreateSandbox(ctx context.Context, s store.Sandbox) error {
	c.hit(ctx, "CreateSandbox")
	return c.Store.CreateSandbox(ctx, s)
}
func (c *counting) CompareAndSwapSandbox(ctx context.Context, s store.Sandbox) (store.Sandbox, error) {
	c.hit(ctx, "CompareAndSwapSandbox")
	return c.Store.CompareAndSwapSandbox(ctx, s)
}
func (c *counting) UpdateSandbox(ctx context.Context, id string, fn func(*store.Sandbox) error) (store.Sandbox, error) {
	c.hit(ctx, "UpdateSandbox")
	return c.Store.UpdateSandbox(ctx, id, fn)
}
func (c *counting) PutSnapshot(ctx context.Context, s store.Snapshot) error {
	c.hit(ctx, "PutSnapshot")
	return c.Store.PutSnapshot(ctx, s)
}

// countingFleet is newFleet over a counting store.
func countingFleet(t *testing.T) (*fleet, *counting) {
	t.Helper()
	var cs *counting
	f := newFleetOver(t, func(st store.Store) store.Store {
		cs = &counting{Store: st, calls: map[string]int{}}
		return cs
	})
	return f, cs
}

// What a create, a create from a named snapshot and a rollback read and
// write in the store once the placement view is warm: the name resolved
// in one read, the row written before the node's call and swapped after
// it, the chosen node's row read between the two (a drain committed
// through another replica is obeyed: drain_test.go), nothing else (no
// warm-pool query when the view saw no pooled sandbox). These are the
// round trips a fleet's replica makes to PostgreSQL on each; a change
// that adds one fails here.
func TestStoreCallsPerOperation(t *testing.T) { controltest.Each(t, testStoreCallsPerOperation) }

func testStoreCallsPerOperation(t *testing.T, _ controltest.Config) {
	f, cs := countingFleet(t)
	ctx := ctxFor(t)
	cctx := countIn(ctx)
	create := func(r control.CreateRequest) control.Sandbox {
		t.Helper()
		r.Timeout = time.Minute
		sb, err := f.ctl.Create(cctx, r)
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	src := f.create(control.CreateRequest{}) // builds the view
	if _, err := f.ctl.Snapshot(ctx, src.ID, "golden", false); err != nil {
		t.Fatal(err)
	}
	for !f.ctl.UploadsIdle() { // the snapshot's background upload
		time.Sleep(5 * time.Millisecond)
	}
	cs.take()
	want := "CompareAndSwapSandbox×1 CreateSandbox×1 GetNode×1 ResolveRef×1"
	create(control.CreateRequest{})
	if got := cs.take(); got != want {
		t.Errorf("create from a template: %s, want %s", got, want)
	}
	child := create(control.CreateRequest{TemplateID: "golden", NodeID: src.NodeID})
	if got := cs.take(); got != want {
		t.Errorf("create from a snapshot by name: %s, want %s", got, want)
	}
	back, err := f.ctl.Rollback(cctx, child.ID, "golden")
	if err != nil {
		t.Fatal(err)
	}
	want = "GetSandbox×1 ResolveRef×1"
	if back.Addr != child.Addr { // a new address is written
		want = "GetSandbox×1 ResolveRef×1 UpdateSandbox×1"
	}
	if got := cs.take(); got != want {
		t.Errorf("rollback: %s, want %s", got, want)
	}
}

// A store that fails while resolving a create's template fails the
// create, and nothing is written: the name is not passed on unresolved.
func TestCreateFailsWhenTheStoreCannotResolve(t *testing.T) {
	f, cs := countingFleet(t)
	cs.failRefs = errors.New("store down")
	cs.take()
	_, err := f.ctl.Create(countIn(ctxFor(t)), control.CreateRequest{TemplateID: "base", Timeout: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "store down") {
		t.Fatalf("create = %v, want the store's error", err)
	}
	if got := cs.take(); got != "ResolveRef×1" {
		t.Fatalf("store calls %s: want only the failed resolve", got)
	}
	rows, _, err := f.st.ListSandboxes(ctxFor(t), store.SandboxFilter{})
	if err != nil || len(rows) != 0 {
		t.Fatalf("rows after the failed create: %v, %v", rows, err)
	}
}

// The placement view: within viewTTL nothing is read; a stale one is
// refreshed in the background while the create goes on from it; past
// five seconds it is rebuilt before placing, so a drain by another
// replica (straight in the store here) is in it by then, also when the
// drain committed while a background refresh was reading (that view is
// as old as its reads, not as its arrival). (Creates obey a drain at
// once anyway, reading their node's row: drain_test.go; here no create
// may need to.)
func TestPlacementViewAge(t *testing.T) { controltest.Each(t, testPlacementViewAge) }

func testPlacementViewAge(t *testing.T, _ controltest.Config) {
	f, cs := countingFleet(t)
	ctx := ctxFor(t)
	f.create(control.CreateRequest{})
	cs.take()
	hold := make(chan struct{})
	cs.mu.Lock()
	cs.hold = hold
	cs.mu.Unlock()
	f.clk.Add(2 * time.Second)
	began := cs.started.Load()
	f.create(control.CreateRequest{}) // from the stale view; its refresh stalls in ListSandboxes
	for deadline := time.Now().Add(10 * time.Second); cs.started.Load() == began; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stale view's refresh did not begin")
		}
	}
	// Another replica drains nb while the refresh reads.
	if _, err := f.st.UpdateNode(ctx, "nb", func(n *store.Node) error { n.Draining = true; return nil }); err != nil {
		t.Fatal(err)
	}
	f.clk.Add(6 * time.Second)
	before := cs.listed.Load()
	cs.mu.Lock()
	cs.hold = nil
	cs.mu.Unlock()
	close(hold)
	for deadline := time.Now().Add(10 * time.Second); cs.listed.Load() == before; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the refresh did not finish")
		}
	}
	time.Sleep(50 * time.Millisecond) // it installs its view
	cs.take()
	for range 6 {
		sb, err := f.ctl.Create(countIn(ctx), control.CreateRequest{Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if sb.NodeID != "na" {
			t.Fatalf("a create landed on %s, drained 6 s before", sb.NodeID)
		}
	}
	// Placed from the view: a create placed on nb would have found it
	// draining when it read nb's row, dropped its row and placed again
	// (drain.go), with a second row written.
	if got := cs.take(); !strings.Contains(" "+got+" ", " CreateSandbox×6 ") {
		t.Fatalf("store calls of 6 creates: %s; want 6 rows written (none placed on the drained node first)", got)
	}
}

// While an instance places, its view is refreshed in the background every
// second, with no create asking (so one from another replica is seen
// about a second later without a create waiting for the read).
func TestPlacementViewRefreshedWhilePlacing(t *testing.T) {
	f, cs := countingFleet(t)
	f.create(control.CreateRequest{})
	before := cs.started.Load()
	for deadline := time.Now().Add(10 * time.Second); cs.started.Load() < before+2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d refreshes in 10 s after a placement, want 2 or more", cs.started.Load()-before)
		}
	}
}

// The proxy's checks of a request to a user port (is the sandbox private,
// is this its traffic token) use what its lookup read: one row read per
// request, not three. Both are fixed for a sandbox's life; a kill forgets
// them.
func TestProxyChecksReadTheRowOnce(t *testing.T) { controltest.Each(t, testProxyChecksReadTheRowOnce) }

func testProxyChecksReadTheRowOnce(t *testing.T, _ controltest.Config) {
	f, cs := countingFleet(t)
	cctx := countIn(ctxFor(t))
	priv := f.create(control.CreateRequest{PrivateTraffic: true})
	pub := f.create(control.CreateRequest{})
	tok := control.TrafficToken(priv.EnvdAccessToken)
	for _, sb := range []control.Sandbox{priv, pub} {
		cs.take()
		// As the proxy: the lookup (it reads the row; not counted, it
		// carries no request context), then the checks.
		if _, _, running, found, _ := f.ctl.LookupVia(sb.ID); !running || !found {
			t.Fatalf("%s: lookup running %v found %v", sb.ID, running, found)
		}
		if got := f.ctl.PrivateTraffic(cctx, sb.ID); got != sb.PrivateTraffic {
			t.Fatalf("%s: private %v, want %v", sb.ID, got, sb.PrivateTraffic)
		}
		if at, ok := f.ctl.TrafficAllowed(cctx, sb.ID, control.TrafficToken(sb.EnvdAccessToken)); !ok || at != sb.EnvdAccessToken {
			t.Fatalf("%s: its own traffic token refused", sb.ID)
		}
		if _, ok := f.ctl.TrafficAllowed(cctx, sb.ID, tok+"x"); ok {
			t.Fatalf("%s: a wrong traffic token accepted", sb.ID)
		}
		if got := cs.take(); got != "" {
			t.Fatalf("%s: the checks read the store: %s", sb.ID, got)
		}
	}
	if _, ok := f.ctl.TrafficAllowed(cctx, pub.ID, tok); ok {
		t.Fatal("another sandbox's traffic token accepted")
	}
	// Killed: its checks read the store again (and find nothing).
	if err := f.ctl.Kill(ctxFor(t), priv.ID); err != nil {
		t.Fatal(err)
	}
	cs.take()
	if _, ok := f.ctl.TrafficAllowed(cctx, priv.ID, tok); ok {
		t.Fatal("a killed sandbox's traffic token accepted")
	}
	if got := cs.take(); got != "GetSandbox×1" {
		t.Fatalf("after the kill: %s, want one read", got)
	}
}
