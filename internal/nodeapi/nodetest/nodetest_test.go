package nodetest_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	bloblocal "github.com/spore-run/spore/internal/blob/local"
	"github.com/spore-run/spore/internal/chunk"
	"github.com/spore-run/spore/internal/control/controltest"
	"github.com/spore-run/spore/internal/errdefs"
	"github.com/spore-run/spore/internal/ids"
	"github.com/spore-run/spore/internal/node"
	"github.com/spore-run/spore/internal/nodeapi"
	"github.com/spore-run/spore/internal/nodeapi/local"
	"github.com/spore-run/spore/internal/nodeapi/nodetest"
	"github.com/spore-run/spore/internal/runtime"
	"github.com/spore-run/spore/internal/snapsync"
	"github.com/spore-run/spore/internal/testenv"
)

// Fast tier: the in-process node over the engine over the fake runtime,
// directly and through the Connect-RPC hop.

func fakeTarget(t *testing.T) nodetest.Target {
	n := controltest.New(t)
	return nodetest.Target{Node: n.Local, Template: controltest.Templates[0], Die: func(ctx context.Context, id string) error {
		sb, err := n.Engine.Get(ctx, id)
		if err != nil {
			return err
		}
		return n.Runtime.Die(sb.Instance, runtime.ExitCrashed, "nodetest: made to die")
	}}
}

func TestConformanceLocalFake(t *testing.T) { nodetest.Run(t, fakeTarget) }

// durableTarget is two fake nodes sharing a blob store (a directory).
func durableTarget(t *testing.T, wrap func(*testing.T, nodeapi.Node) nodeapi.Node) nodetest.Target {
	blobs, err := bloblocal.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mk := func(id string) (*controltest.Node, nodeapi.Node) {
		n := controltest.New(t)
		cache, err := chunk.OpenCache(filepath.Join(n.Dir, "chunk-cache"), 64<<20)
		if err != nil {
			t.Fatal(err)
		}
		sy, err := snapsync.New(snapsync.Config{Repo: n.Engine.Snapshots(), Store: blobs, Cache: cache, Runtime: n.Engine.Runtime().Name(),
			Log: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return n, wrap(t, local.New(n.Engine, local.Config{ID: id, Sync: sy}))
	}
	a, na := mk("na")
	_, nb := mk("nb")
	return nodetest.Target{Node: na, Peer: nb, Template: controltest.Templates[0], Die: func(ctx context.Context, id string) error {
		sb, err := a.Engine.Get(ctx, id)
		if err != nil {
			return err
		}
		return a.Runtime.Die(sb.Instance, runtime.ExitCrashed, "nodetest: made to die")
	}}
}

func TestConformanceLocalFakeDurable(t *testing.T) {
	nodetest.Run(t, func(t *testing.T) nodetest.Target {
		return durableTarget(t, func(_ *testing.T, n nodeapi.Node) nodeapi.Node { return n })
	})
}

func TestConformanceRPCFakeDurable(t *testing.T) {
	nodetest.Run(t, func(t *testing.T) nodetest.Target {
		return durableTarget(t, func(t *testing.T, n nodeapi.Node) nodeapi.Node { return controltest.Remote(t, n) })
	})
}

func TestConformanceRPCFake(t *testing.T) {
	nodetest.Run(t, func(t *testing.T) nodetest.Target {
		tg := fakeTarget(t)
		tg.Node = controltest.Remote(t, tg.Node)
		return tg
	})
}

// Real tier: the same over a real node (gVisor sandboxes). One node serves
// every subtest (opening one builds its templates); the suite kills what
// it makes, and the node is taken apart at the end.

type realNode struct {
	n      *node.Node
	local  *local.Node
	prefix string
}

func openReal(t *testing.T) *realNode {
	t.Helper()
	testenv.RequireRoot(t)
	dir := t.TempDir()
	cfg := node.Config{
		DataDir: dir, RootFSDir: testenv.RootFSDir(t), Runsc: testenv.Runsc(t), EnvdBinary: testenv.EnvdBinary(t),
		NetPrefix: "spc", CgroupParent: "/spore-test-" + ids.New('g'),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n, err := node.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &realNode{n: n, local: local.New(n.Engine, local.Config{ID: "real"}), prefix: cfg.NetPrefix}
	t.Cleanup(func() { r.destroy(t) })
	if err := n.EnsureTemplates(ctx); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *realNode) destroy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, sb := range r.n.Engine.List(ctx) {
		t.Errorf("cleanup: sandbox %s left by the suite", sb.ID)
		if err := r.n.Engine.Kill(ctx, sb.ID); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("cleanup: kill %s: %v", sb.ID, err)
		}
	}
	r.n.Close()
	if err := r.n.Runtime.Purge(ctx); err != nil {
		t.Errorf("cleanup: purge: %v", err)
	}
	if err := r.n.Net.Sweep(ctx, nil); err != nil {
		t.Errorf("cleanup: networks: %v", err)
	}
	r.n.Net.RemoveHostRules()
	if ents, _ := filepath.Glob("/var/run/netns/" + r.prefix + "-*"); len(ents) > 0 {
		t.Errorf("cleanup: namespaces left: %v", ents)
	}
}

// die SIGKILLs the sandbox's gVisor kernel from the host, as the OOM
// killer would.
func (r *realNode) die(ctx context.Context, id string) error {
	sb, err := r.n.Engine.Get(ctx, id)
	if err != nil {
		return err
	}
	info, err := r.n.Runtime.State(ctx, sb.Instance)
	if err != nil {
		return err
	}
	if info.PID <= 0 {
		return fmt.Errorf("instance %s has no PID", sb.Instance)
	}
	return syscall.Kill(info.PID, syscall.SIGKILL)
}

func (r *realNode) target(n nodeapi.Node) nodetest.Target {
	return nodetest.Target{Node: n, Template: node.TemplateBase, Die: r.die}
}

func TestConformanceLocalReal(t *testing.T) {
	r := openReal(t)
	nodetest.Run(t, func(t *testing.T) nodetest.Target { return r.target(r.local) })
}

func TestConformanceRPCReal(t *testing.T) {
	r := openReal(t)
	nodetest.Run(t, func(t *testing.T) nodetest.Target { return r.target(controltest.Remote(t, r.local)) })
}
