package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/store"
)

// The fleet's additions to the contract: versions and compare-and-swap,
// the node filter, the snapshot catalog's fields, templates, nodes, and
// two handles (API replicas) on one database.

func testCAS(t *testing.T, s store.Store) {
	ctx := context.Background()
	x := sb("v", nil)
	x.Addr, x.EnvdAccessToken = "10.11.0.2:49983", "tok-1"
	if err := s.CreateSandbox(ctx, x); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(ctx, "v")
	if err != nil || got.Version != 1 || got.Addr != x.Addr || got.EnvdAccessToken != "tok-1" || got.NodeID != "local" {
		t.Fatalf("get = %+v, %v", got, err)
	}
	upd, err := s.UpdateSandbox(ctx, "v", func(x *store.Sandbox) error { x.Version = 100; x.MemoryMB = 1024; return nil })
	if err != nil || upd.Version != 2 {
		t.Fatalf("update = version %d, %v; want 2 (fn cannot set it)", upd.Version, err)
	}
	if _, err := s.UpdateSandbox(ctx, "v", func(*store.Sandbox) error { return errors.New("no") }); err == nil {
		t.Fatal("aborted update succeeded")
	}
	got, _ = s.GetSandbox(ctx, "v")
	if got.Version != 2 || got.MemoryMB != 1024 {
		t.Fatalf("after update and aborted update: version %d memory %d", got.Version, got.MemoryMB)
	}
	stale := got
	got.State, got.NodeID, got.Addr = store.StatePaused, "n2", "10.12.0.2:49983"
	swapped, err := s.CompareAndSwapSandbox(ctx, got)
	if err != nil || swapped.Version != 3 || swapped.State != store.StatePaused {
		t.Fatalf("swap = %+v, %v", swapped, err)
	}
	if got, _ := s.GetSandbox(ctx, "v"); fmt.Sprint(got) != fmt.Sprint(swapped) {
		t.Fatalf("stored %+v, swap returned %+v", got, swapped)
	}
	stale.State = store.StateError
	if _, err := s.CompareAndSwapSandbox(ctx, stale); !errdefs.IsConflict(err) {
		t.Fatalf("stale swap = %v, want conflict", err)
	}
	if got, _ := s.GetSandbox(ctx, "v"); got.State != store.StatePaused || got.Version != 3 || got.NodeID != "n2" {
		t.Fatalf("a lost swap changed the row: %+v", got)
	}
	if l, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{NodeID: "n2"}); ids(l) != "v " {
		t.Fatalf("a swap's new node is not filtered on: %s", ids(l))
	}
	if _, err := s.CompareAndSwapSandbox(ctx, sb("nope", nil)); !errdefs.IsNotFound(err) {
		t.Fatalf("swap of a missing sandbox = %v", err)
	}
}

func testNodeFilter(t *testing.T, s store.Store) {
	ctx := context.Background()
	for i := range 6 {
		x := sb(fmt.Sprintf("n%d", i), map[string]string{"team": []string{"a", "b"}[i%2]})
		x.NodeID = []string{"node-a", "node-b", "node-c"}[i%3]
		if i == 3 {
			x.State = store.StatePaused
		}
		if err := s.CreateSandbox(ctx, x); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		f    store.SandboxFilter
		want string
	}{
		{store.SandboxFilter{NodeID: "node-a"}, "n0 n3 "},
		{store.SandboxFilter{NodeID: "node-b"}, "n1 n4 "},
		{store.SandboxFilter{NodeID: "node-a", States: []string{store.StateRunning}}, "n0 "},
		{store.SandboxFilter{NodeID: "node-c", Metadata: map[string]string{"team": "b"}}, "n5 "},
		{store.SandboxFilter{NodeID: "node-z"}, ""},
	}
	for _, c := range cases {
		got, _, err := s.ListSandboxes(ctx, c.f)
		if err != nil || ids(got) != c.want {
			t.Errorf("%+v = %q %v, want %q", c.f, ids(got), err, c.want)
		}
	}
	// Paging within a node.
	p1, next, err := s.ListSandboxes(ctx, store.SandboxFilter{NodeID: "node-a", Limit: 1})
	if err != nil || ids(p1) != "n0 " || next == "" {
		t.Fatalf("page 1 = %s %q %v", ids(p1), next, err)
	}
	p2, next, _ := s.ListSandboxes(ctx, store.SandboxFilter{NodeID: "node-a", Limit: 1, Cursor: next})
	if ids(p2) != "n3 " || next != "" {
		t.Fatalf("page 2 = %s %q", ids(p2), next)
	}
	// Moving a sandbox moves it between node filters.
	if _, err := s.UpdateSandbox(ctx, "n0", func(x *store.Sandbox) error { x.NodeID = "node-b"; return nil }); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{NodeID: "node-b"}); ids(got) != "n0 n1 n4 " {
		t.Fatalf("after move: node-b = %s", ids(got))
	}
	if got, _, _ := s.ListSandboxes(ctx, store.SandboxFilter{NodeID: "node-a"}); ids(got) != "n3 " {
		t.Fatalf("after move: node-a = %s", ids(got))
	}
}

func testSnapshotFields(t *testing.T, s store.Store) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Millisecond)
	sn := store.Snapshot{ID: "f1", TeamID: teamA, Names: []string{"tpl-base"}, SandboxID: "x", Kind: "template", CreatedAt: now,
		SizeBytes: 1 << 30, NodeID: "node-a", Storage: store.StorageUploading, Template: "base"}
	if err := s.PutSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSnapshot(ctx, "f1")
	if err != nil || fmt.Sprint(got) != fmt.Sprint(sn) {
		t.Fatalf("get = %+v, %v; want %+v", got, err, sn)
	}
	sn.Storage = store.StorageDurable
	if err := s.PutSnapshot(ctx, sn); err != nil {
		t.Fatal(err)
	}
	l, _, err := s.ListSnapshots(ctx, store.SnapshotFilter{TeamID: teamA, Name: "tpl-base"})
	if err != nil || len(l) != 1 || fmt.Sprint(l[0]) != fmt.Sprint(sn) {
		t.Fatalf("list = %+v, %v; want %+v", l, err, sn)
	}
}

func testTemplates(t *testing.T, s store.Store) {
	ctx := context.Background()
	if _, err := s.GetTemplate(ctx, "base"); !errdefs.IsNotFound(err) {
		t.Fatalf("get missing = %v", err)
	}
	if l, err := s.ListTemplates(ctx); err != nil || len(l) != 0 {
		t.Fatalf("empty list = %v %v", l, err)
	}
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	put, err := s.PutTemplate(ctx, store.Template{Name: "py", SnapshotID: "s1", Spec: []byte(`{"from":"base"}`),
		NodeIDs: []string{"node-a"}, CreatedAt: created})
	if err != nil || !put.CreatedAt.Equal(created) || put.UpdatedAt.IsZero() {
		t.Fatalf("put = %+v, %v", put, err)
	}
	got, err := s.GetTemplate(ctx, "py")
	if err != nil || fmt.Sprint(got) != fmt.Sprint(put) || string(got.Spec) != `{"from":"base"}` {
		t.Fatalf("get = %+v, %v; want %+v", got, err, put)
	}
	if _, err := s.PutTemplate(ctx, store.Template{Name: "base", SnapshotID: "s0"}); err != nil {
		t.Fatal(err)
	}
	// A second put replaces everything but CreatedAt.
	re, err := s.PutTemplate(ctx, store.Template{Name: "py", SnapshotID: "s2", Spec: []byte(`{}`)})
	if err != nil || !re.CreatedAt.Equal(created) || re.SnapshotID != "s2" || len(re.NodeIDs) != 0 {
		t.Fatalf("re-put = %+v, %v", re, err)
	}
	upd, err := s.UpdateTemplate(ctx, "py", func(x *store.Template) error {
		x.NodeIDs = append(x.NodeIDs, "node-b", "node-c")
		return nil
	})
	if err != nil || !slices.Equal(upd.NodeIDs, []string{"node-b", "node-c"}) || !upd.CreatedAt.Equal(created) {
		t.Fatalf("update = %+v, %v", upd, err)
	}
	if _, err := s.UpdateTemplate(ctx, "py", func(x *store.Template) error { x.NodeIDs = nil; return errors.New("no") }); err == nil {
		t.Fatal("aborted update succeeded")
	}
	if _, err := s.UpdateTemplate(ctx, "nope", func(*store.Template) error { return nil }); !errdefs.IsNotFound(err) {
		t.Fatalf("update missing = %v", err)
	}
	l, err := s.ListTemplates(ctx)
	if err != nil || len(l) != 2 || l[0].Name != "base" || l[1].Name != "py" || fmt.Sprint(l[1]) != fmt.Sprint(upd) {
		t.Fatalf("list = %+v, %v", l, err)
	}
	if err := s.DeleteTemplate(ctx, "py"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTemplate(ctx, "py"); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete = %v", err)
	}
	if _, err := s.GetTemplate(ctx, "py"); !errdefs.IsNotFound(err) {
		t.Fatalf("get deleted = %v", err)
	}
}

func node(id string, hb time.Time) store.Node {
	return store.Node{ID: id, Addr: id + ":7000", Labels: map[string]string{"zone": "z1"},
		Capacity: store.Resources{MemoryMB: 16384, VCPUs: 8, Sandboxes: 100}, Reserved: store.Resources{MemoryMB: 1024, VCPUs: 0.5},
		Overcommit: store.Overcommit{Memory: 10, VCPUs: 80},
		RunscBuild: "release-20260901", CPUFeatures: []string{"avx2", "sse4_2"}, Heartbeat: hb, State: store.NodeReady}
}

func testNodes(t *testing.T, s store.Store) {
	ctx := context.Background()
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	if _, err := s.GetNode(ctx, "node-b"); !errdefs.IsNotFound(err) {
		t.Fatalf("get missing = %v", err)
	}
	b, err := s.UpsertNode(ctx, node("node-b", t0))
	if err != nil || b.JoinedAt.IsZero() || b.Draining || b.Overcommit != (store.Overcommit{Memory: 10, VCPUs: 80}) {
		t.Fatalf("register = %+v, %v", b, err)
	}
	got, err := s.GetNode(ctx, "node-b")
	if err != nil || fmt.Sprint(got) != fmt.Sprint(b) {
		t.Fatalf("get = %+v, %v; want %+v", got, err, b)
	}
	if _, err := s.UpsertNode(ctx, node("node-a", t0)); err != nil {
		t.Fatal(err)
	}
	drained, err := s.UpdateNode(ctx, "node-b", func(n *store.Node) error { n.Draining = true; return nil })
	if err != nil || !drained.Draining {
		t.Fatalf("drain = %+v, %v", drained, err)
	}
	// A heartbeat (which knows nothing of draining) keeps the operator's
	// decision and the join time, and replaces the rest.
	hb := node("node-b", t0.Add(5*time.Second))
	hb.Capacity.MemoryMB, hb.Labels = 8192, map[string]string{"zone": "z2"}
	hb.Overcommit = store.Overcommit{Memory: 2.5, VCPUs: 16} // the operator restarted the node with new ratios
	beat, err := s.UpsertNode(ctx, hb)
	if err != nil || !beat.Draining || !beat.JoinedAt.Equal(b.JoinedAt) || beat.Capacity.MemoryMB != 8192 || beat.Overcommit != hb.Overcommit ||
		!beat.Heartbeat.Equal(hb.Heartbeat) || beat.Labels["zone"] != "z2" {
		t.Fatalf("heartbeat = %+v, %v", beat, err)
	}
	if got, _ := s.GetNode(ctx, "node-b"); fmt.Sprint(got) != fmt.Sprint(beat) {
		t.Fatalf("stored %+v, upsert returned %+v", got, beat)
	}
	if _, err := s.UpdateNode(ctx, "node-b", func(n *store.Node) error { n.Draining = false; return errors.New("no") }); err == nil {
		t.Fatal("aborted update succeeded")
	}
	if _, err := s.UpdateNode(ctx, "nope", func(*store.Node) error { return nil }); !errdefs.IsNotFound(err) {
		t.Fatalf("update missing = %v", err)
	}
	undrained, err := s.UpdateNode(ctx, "node-b", func(n *store.Node) error { n.Draining = false; n.State = store.NodeLost; return nil })
	if err != nil || undrained.Draining || undrained.State != store.NodeLost {
		t.Fatalf("undrain = %+v, %v", undrained, err)
	}
	l, err := s.ListNodes(ctx)
	if err != nil || len(l) != 2 || l[0].ID != "node-a" || fmt.Sprint(l[1]) != fmt.Sprint(undrained) {
		t.Fatalf("list = %+v, %v", l, err)
	}
	if err := s.DeleteNode(ctx, "node-a"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteNode(ctx, "node-a"); !errdefs.IsNotFound(err) {
		t.Fatalf("second delete = %v", err)
	}
	if l, _ := s.ListNodes(ctx); len(l) != 1 {
		t.Fatalf("after delete: %+v", l)
	}
}

// Writers on two handles (two API replicas) serialize: every increment
// lands, in order.
func testTwoHandlesUpdate(t *testing.T, two func(*testing.T) (store.Store, store.Store)) {
	ctx := context.Background()
	a, b := two(t)
	if err := a.CreateSandbox(ctx, sb("c", nil)); err != nil {
		t.Fatal(err)
	}
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range 2 * n {
		s := []store.Store{a, b}[i%2]
		wg.Go(func() {
			if _, err := s.UpdateSandbox(ctx, "c", func(x *store.Sandbox) error { x.CPUCount++; return nil }); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("update: %v", err)
	}
	for _, s := range []store.Store{a, b} {
		if got, err := s.GetSandbox(ctx, "c"); err != nil || got.CPUCount != 2+2*n || got.Version != 1+2*n {
			t.Fatalf("cpu %d version %d (%v), want %d and %d", got.CPUCount, got.Version, err, 2+2*n, 1+2*n)
		}
	}
}

// Of N compare-and-swaps from one version over two handles exactly one
// wins; the rest are conflicts and the row holds the winner's write.
func testTwoHandlesCAS(t *testing.T, two func(*testing.T) (store.Store, store.Store)) {
	ctx := context.Background()
	a, b := two(t)
	if err := a.CreateSandbox(ctx, sb("c", nil)); err != nil {
		t.Fatal(err)
	}
	base, err := b.GetSandbox(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	var wins, conflicts atomic.Int32
	var winner atomic.Value
	var wg sync.WaitGroup
	for i := range n {
		s := []store.Store{a, b}[i%2]
		wg.Go(func() {
			x := base
			x.NodeID = fmt.Sprintf("node-%d", i)
			got, err := s.CompareAndSwapSandbox(ctx, x)
			switch {
			case err == nil:
				wins.Add(1)
				winner.Store(got)
			case errdefs.IsConflict(err):
				conflicts.Add(1)
			default:
				t.Errorf("swap %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if wins.Load() != 1 || conflicts.Load() != n-1 {
		t.Fatalf("%d wins, %d conflicts; want 1 and %d", wins.Load(), conflicts.Load(), n-1)
	}
	w := winner.Load().(store.Sandbox)
	for _, s := range []store.Store{a, b} {
		if got, _ := s.GetSandbox(ctx, "c"); got.Version != 2 || got.NodeID != w.NodeID {
			t.Fatalf("stored version %d node %s; winner wrote %s", got.Version, got.NodeID, w.NodeID)
		}
	}
}

func acquire(t *testing.T, s store.Store, name, holder string, ttl time.Duration) bool {
	t.Helper()
	ok, err := s.AcquireLease(context.Background(), name, holder, ttl)
	if err != nil {
		t.Fatalf("acquire %s by %s: %v", name, holder, err)
	}
	return ok
}

func testLeases(t *testing.T, two func(*testing.T) (store.Store, store.Store)) {
	ctx := context.Background()
	a, b := two(t)
	if !acquire(t, a, "reaper", "A", time.Minute) {
		t.Fatal("a free lease was refused")
	}
	if acquire(t, b, "reaper", "B", time.Minute) {
		t.Fatal("B took a lease A holds")
	}
	if !acquire(t, b, "reconcile", "B", time.Minute) {
		t.Fatal("leases are not independent by name")
	}
	if !acquire(t, b, "reaper", "A", time.Minute) {
		t.Fatal("the holder could not renew (through another handle)")
	}
	// A release by someone else does nothing.
	if err := b.ReleaseLease(ctx, "reaper", "B"); err != nil {
		t.Fatal(err)
	}
	if acquire(t, b, "reaper", "B", time.Minute) {
		t.Fatal("a non-holder's release freed the lease")
	}
	if err := a.ReleaseLease(ctx, "reaper", "A"); err != nil {
		t.Fatal(err)
	}
	if !acquire(t, b, "reaper", "B", time.Minute) {
		t.Fatal("a released lease was refused")
	}
	if acquire(t, a, "reaper", "A", time.Minute) {
		t.Fatal("A took the lease back from B")
	}
	if err := a.ReleaseLease(ctx, "never-taken", "A"); err != nil {
		t.Fatalf("release of a lease never taken = %v", err)
	}
	if _, err := a.AcquireLease(ctx, "reaper", "A", 0); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("zero ttl = %v", err)
	}
}

// Of N holders racing for one free lease over two handles exactly one
// gets it.
func testLeaseRace(t *testing.T, two func(*testing.T) (store.Store, store.Store)) {
	ctx := context.Background()
	a, b := two(t)
	const n = 16
	var got atomic.Int32
	var wg sync.WaitGroup
	for i := range n {
		s := []store.Store{a, b}[i%2]
		wg.Go(func() {
			ok, err := s.AcquireLease(ctx, "pool", fmt.Sprintf("h%d", i), time.Minute)
			if err != nil {
				t.Errorf("acquire h%d: %v", i, err)
			}
			if ok {
				got.Add(1)
			}
		})
	}
	wg.Wait()
	if got.Load() != 1 {
		t.Fatalf("%d holders got the lease, want 1", got.Load())
	}
}

// An expired lease goes to the next taker; a renewed one does not expire
// at its first deadline. This waits for real time (the database's clock
// judges expiry in PostgreSQL).
func testLeaseExpiry(t *testing.T, two func(*testing.T) (store.Store, store.Store)) {
	a, b := two(t)
	const ttl = 1500 * time.Millisecond
	// "renewed" first: its first deadline passes before "short"'s does.
	if !acquire(t, a, "renewed", "A", ttl) || !acquire(t, a, "short", "A", ttl) {
		t.Fatal("free leases refused")
	}
	if !acquire(t, a, "renewed", "A", time.Hour) {
		t.Fatal("renewal refused")
	}
	if acquire(t, b, "short", "B", time.Minute) {
		t.Fatal("B took a lease before it expired")
	}
	deadline := time.Now().Add(30 * time.Second)
	for !acquire(t, b, "short", "B", time.Minute) {
		if time.Now().After(deadline) {
			t.Fatal("an expired lease was never handed on")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if acquire(t, b, "renewed", "B", time.Minute) {
		t.Fatal("a renewed lease expired at its first deadline")
	}
	if acquire(t, a, "short", "A", time.Minute) {
		t.Fatal("the old holder took back a lease it lost")
	}
}
