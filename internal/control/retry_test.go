package control_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/spore-run/spore/internal/control"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/store"
)

// flaky is a node whose create, fork and snapshot calls fail as told:
// after doing the work (the answer was lost: the node did it) or before
// (it did nothing), with the error given, for the next `times` calls.
type flaky struct {
	nodeapi.Node
	mu    sync.Mutex
	err   error
	after bool // fail after the node did the work
	times int
	calls map[string]int
}

func (f *flaky) set(err error, after bool, times int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err, f.after, f.times, f.calls = err, after, times, map[string]int{}
}

func (f *flaky) count(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// fail reports the error this call returns, if any, and counts it.
func (f *flaky) fail(op string) (error, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[op]++
	if f.times == 0 {
		return nil, false
	}
	f.times--
	return fmt.Errorf("flaky node: %s: %w", op, f.err), f.after
}

func call[T any](f *flaky, op string, do func() (T, error)) (T, error) {
	err, after := f.fail(op)
	if err == nil {
		return do()
	}
	var zero T
	if after {
		if _, derr := do(); derr != nil {
			return zero, derr
		}
	}
	return zero, err
}

func (f *flaky) Create(ctx context.Context, r nodeapi.CreateRequest) (nodeapi.Sandbox, error) {
	return call(f, "create", func() (nodeapi.Sandbox, error) { return f.Node.Create(ctx, r) })
}

func (f *flaky) Snapshot(ctx context.Context, id string, r nodeapi.SnapshotRequest) (nodeapi.SnapshotInfo, error) {
	return call(f, "snapshot", func() (nodeapi.SnapshotInfo, error) { return f.Node.Snapshot(ctx, id, r) })
}

func (f *flaky) Fork(ctx context.Context, id string, r nodeapi.ForkRequest) (nodeapi.ForkResult, error) {
	return call(f, "fork", func() (nodeapi.ForkResult, error) { return f.Node.Fork(ctx, id, r) })
}

// A create, fork or snapshot whose node call fails indefinitely
// (unavailable, a deadline) after the node did the work is tried again
// with the same IDs: the client gets success and exactly one of each
// thing exists, on the node and in the store. A definite failure (no
// capacity) is undone at once, without a second call; an indefinite
// failure that lasts past the tries is undone too.
func TestIndefiniteNodeFailureRetried(t *testing.T) {
	controltest.Each(t, testIndefiniteNodeFailureRetried)
}

func testIndefiniteNodeFailureRetried(t *testing.T, _ controltest.Config) {
	h := newHarness(t)
	ctx := ctxFor(t)
	f := &flaky{Node: h.nodes[controltest.NodeID]}
	f.set(nil, false, 0)
	ctl := control.New(control.Config{Store: h.st, Nodes: control.Nodes{controltest.NodeID: f}, Now: h.clk.Now})
	defer ctl.Close()
	onNode := func() int { t.Helper(); return len(h.n.Engine.List(ctx)) }
	inStore := func() int {
		t.Helper()
		rows, _, err := h.st.ListSandboxes(ctx, store.SandboxFilter{Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		return len(rows)
	}
	create := func() (control.Sandbox, error) {
		return ctl.Create(ctx, control.CreateRequest{Timeout: time.Hour})
	}

	for _, err := range []error{errdefs.ErrUnavailable, context.DeadlineExceeded} {
		f.set(err, true, 1)
		sb, cerr := create()
		if cerr != nil {
			t.Fatalf("create with the node's answer lost once (%v): %v", err, cerr)
		}
		if n := f.count("create"); n != 2 {
			t.Fatalf("create: %d node calls, want 2 (the same call again)", n)
		}
		if sb.State != store.StateRunning || h.nodeState(sb.ID) != "running" {
			t.Fatalf("created sandbox: store %s, node %s", sb.State, h.nodeState(sb.ID))
		}
	}
	if n, m := onNode(), inStore(); n != 2 || m != 2 {
		t.Fatalf("after two retried creates: %d on the node, %d rows; want 2 and 2", n, m)
	}

	parent, err := create()
	if err != nil {
		t.Fatal(err)
	}
	f.set(errdefs.ErrUnavailable, true, 1)
	kids, err := ctl.Fork(ctx, parent.ID, 2, time.Hour)
	if err != nil || f.count("fork") != 2 {
		t.Fatalf("fork with the answer lost once: %v (%d node calls)", err, f.count("fork"))
	}
	for _, k := range kids {
		if k.Err != nil {
			t.Fatalf("fork child: %v", k.Err)
		}
	}
	if n, m := onNode(), inStore(); n != 5 || m != 5 {
		t.Fatalf("after a retried fork of 2: %d on the node, %d rows; want 5 and 5", n, m)
	}

	f.set(errdefs.ErrUnavailable, true, 1)
	sn, err := ctl.Snapshot(ctx, parent.ID, "once", false)
	if err != nil || f.count("snapshot") != 2 {
		t.Fatalf("snapshot with the answer lost once: %v (%d node calls)", err, f.count("snapshot"))
	}
	snaps, _, err := h.st.ListSnapshots(ctx, store.SnapshotFilter{Limit: 1000})
	if err != nil || len(snaps) != 1 || snaps[0].ID != sn.ID {
		t.Fatalf("snapshots in the store: %+v %v; want just %s", snaps, err, sn.ID)
	}
	held := 0
	for _, m := range h.n.Engine.Snapshots().List() {
		if m.Kind == "snapshot" {
			held++
		}
	}
	if held != 1 {
		t.Fatalf("the node holds %d snapshots, want 1", held)
	}

	// Definite: one call, undone at once.
	f.set(errdefs.ErrResourceLimit, false, 1)
	if _, err := create(); !errors.Is(err, errdefs.ErrResourceLimit) || f.count("create") != 1 {
		t.Fatalf("create refused for capacity: %v after %d node calls; want the refusal after 1", err, f.count("create"))
	}
	// Indefinite for longer than the tries: undone (nothing made stays).
	f.set(errdefs.ErrUnavailable, true, 100)
	if _, err := create(); !errdefs.IsUnavailable(err) || f.count("create") != 3 {
		t.Fatalf("create whose answer is always lost: %v after %d node calls; want unavailable after 3", err, f.count("create"))
	}
	if n, m := onNode(), inStore(); n != 5 || m != 5 {
		t.Fatalf("after failed creates: %d on the node, %d rows; want 5 and 5 (each undone)", n, m)
	}
}
